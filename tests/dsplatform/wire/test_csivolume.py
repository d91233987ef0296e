"""The CSI volume attributes: what the webhook writes the CSI node plugin reads back, and what it refuses."""

from __future__ import annotations

import json

import pytest

from dsplatform.errors import InvalidInput
from dsplatform.wire.csivolume import DATASETS_KEY, VERSION, VERSION_KEY, VolumeDataset, decode, encode


@pytest.mark.parametrize(
    "datasets",
    [
        (VolumeDataset("imagenet", "s3://b/imagenet"),),
        (
            VolumeDataset("a", "s3://b/a", bundles="s3://b/bundles", secret_key="a.json"),
            VolumeDataset("coco", "/nfs/coco"),
        ),
        (VolumeDataset("big", "s3://b/big", bundles="s3://b/store", stripe="cd" * 16), VolumeDataset("c", "/nfs/c")),
    ],
)
def test_what_encode_writes_decode_reads_back(datasets: tuple[VolumeDataset, ...]) -> None:
    attributes = encode(datasets)
    # version 1 where no entry needs 2: what an agent that reads only version 1 reads too
    assert attributes[VERSION_KEY] == (str(VERSION) if any(d.stripe for d in datasets) else "1")
    assert all(isinstance(v, str) for v in attributes.values())
    assert decode(attributes) == datasets


def test_attributes_written_before_the_version_key_read_as_version_one() -> None:
    attributes = {DATASETS_KEY: json.dumps([{"name": "a", "source": "s3://x", "digest": "ab" * 16}])}
    assert decode(attributes) == (VolumeDataset("a", "s3://x"),)


@pytest.mark.parametrize(
    ("attributes", "complaint"),
    [
        ({VERSION_KEY: "3", DATASETS_KEY: '[{"name":"a","source":"s3://x"}]'}, "reads versions ['1', '2']"),
        ({VERSION_KEY: "1", DATASETS_KEY: f'[{{"name":"a","source":"s","stripe":"{"ab" * 16}"}}]'}, "needs"),
        ({VERSION_KEY: "2", DATASETS_KEY: '[{"name":"a","source":"s","stripe":"../x"}]'}, "version digest"),
        ({}, "is missing"),
        ({DATASETS_KEY: "[]"}, "list of 1-64"),
        ({DATASETS_KEY: '[{"name":"a"}]'}, "'name' and 'source'"),
        ({DATASETS_KEY: '[{"name":"a","source":"s","src":"x"}]'}, "unknown keys"),
        ({DATASETS_KEY: '[{"name":"../a","source":"s"}]'}, "invalid dataset name"),
        ({DATASETS_KEY: '[{"name":"a","source":"s","secretKey":"a/b"}]'}, "invalid secretKey"),
        ({DATASETS_KEY: '[{"name":"a","source":"s"},{"name":"a","source":"t"}]'}, "repeat"),
        ({DATASETS_KEY: "[" * 100_000}, DATASETS_KEY),
    ],
    ids=[
        "version",
        "stripe-in-v1",
        "bad-stripe",
        "missing",
        "empty",
        "no-source",
        "unknown-key",
        "bad-name",
        "bad-secret-key",
        "repeat",
        "deep",
    ],
)
def test_hostile_attributes_are_refused_naming_the_field(attributes: dict[str, str], complaint: str) -> None:
    with pytest.raises(InvalidInput) as excinfo:
        decode(attributes)
    assert complaint in str(excinfo.value)
