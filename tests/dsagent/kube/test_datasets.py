"""The Dataset resource: reads, status updates and ``publish`` after a real pack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dsagent.errors import NotFound
from dsagent.format.bundles.bundle import pack
from dsagent.kube.apiclient import KubeForbidden, KubeUnavailable, translated
from dsagent.kube.datasets import Dataset, DatasetClient, DatasetStatus, SecretRef, publish
from tests.charts.test_chart import dataset_schema, render
from tools.support.fake_apiserver import FakeApiServer, make_dataset

DIGEST = "0123456789abcdef0123456789abcdef"


def test_a_dataset_is_read_with_its_spec_and_current_digest(apiserver: FakeApiServer, api_client: Any) -> None:
    obj = make_dataset(
        "imagenet",
        namespace="ml",
        source="s3://b/imagenet",
        bundles="s3://b/bundles",
        status={"digest": DIGEST, "files": 3, "bytes": 30},
    )
    obj["spec"]["storageSecretRef"] = {"name": "creds", "key": "opts"}
    apiserver.create(obj)
    dataset = DatasetClient(api_client).get("ml", "imagenet")
    assert dataset == Dataset(
        "ml",
        "imagenet",
        "s3://b/imagenet",
        "s3://b/bundles",
        SecretRef("creds", "opts"),
        DatasetStatus(DIGEST, 3, 30),
        generation=1,
    )
    assert dataset.digest == DIGEST


def test_a_missing_dataset_is_not_found(api_client: Any) -> None:
    with pytest.raises(NotFound):
        DatasetClient(api_client).get("ml", "nope")


def test_listing_skips_datasets_without_a_source(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(make_dataset("a", namespace="x"))
    broken = make_dataset("b", namespace="y")
    broken["spec"] = {}
    apiserver.create(broken)
    assert [d.name for d in DatasetClient(api_client).list()] == ["a"]
    assert [d.name for d in DatasetClient(api_client).list("y")] == []


def test_a_status_update_changes_only_the_status(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.create(make_dataset("d", source="s3://b/d"))
    DatasetClient(api_client).update_status("default", "d", DatasetStatus(DIGEST, 5, 50, 1, 20, "2026-11-21T10:00:00Z"))
    stored = apiserver.get("datasets", "d")
    assert stored is not None
    assert stored["status"] == {
        "digest": DIGEST,
        "files": 5,
        "bytes": 50,
        "bundles": 1,
        "compressedBytes": 20,
        "packedTime": "2026-11-21T10:00:00Z",
    }
    assert stored["spec"] == {"source": "s3://b/d"}
    [patch] = apiserver.requests_matching("PATCH")
    assert patch.path.endswith("/datasets/d/status")
    assert patch.content_type == "application/merge-patch+json"


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Any, str, str]:
    source = tmp_path / "src"
    (source / "train").mkdir(parents=True)
    for i in range(5):
        (source / "train" / f"{i}.jpg").write_bytes(bytes([i]) * (100 + i))
    store = tmp_path / "store"
    manifest = pack(str(source), str(store), name="tiny", max_files=2)
    return manifest, str(source), str(store)


def test_publish_creates_the_dataset_and_records_what_was_packed(
    apiserver: FakeApiServer, api_client: Any, packed: tuple[Any, str, str]
) -> None:
    manifest, source, store = packed
    published = publish(
        manifest,
        namespace="ml",
        source=source,
        bundles=store,
        api_client=api_client,
        now=lambda: "2026-11-21T10:00:00Z",
    )
    assert published.digest == manifest.digest
    stored = apiserver.get("datasets", "tiny", "ml")
    assert stored is not None
    assert stored["spec"] == {"source": source, "bundles": store}
    assert stored["status"]["files"] == 5 and stored["status"]["bytes"] == sum(100 + i for i in range(5))
    assert stored["status"]["bundles"] == len(manifest.bundles) >= 3
    assert stored["status"]["observedGeneration"] == 1
    jsonschema.validate(stored, dataset_schema(render()))


def test_publish_keeps_the_spec_an_owner_wrote(
    apiserver: FakeApiServer, api_client: Any, packed: tuple[Any, str, str]
) -> None:
    manifest, source, store = packed
    owned = make_dataset("tiny", namespace="ml", source="s3://official/tiny", bundles="s3://official/bundles")
    owned["spec"]["storageSecretRef"] = {"name": "creds"}
    apiserver.create(owned)
    publish(manifest, namespace="ml", source=source, bundles=store, api_client=api_client)
    stored = apiserver.get("datasets", "tiny", "ml")
    assert stored is not None
    assert stored["spec"]["source"] == "s3://official/tiny" and stored["spec"]["storageSecretRef"] == {"name": "creds"}
    assert stored["status"]["digest"] == manifest.digest


def test_publish_without_create_needs_an_existing_dataset(api_client: Any, packed: tuple[Any, str, str]) -> None:
    manifest, source, store = packed
    with pytest.raises(NotFound):
        publish(manifest, namespace="ml", source=source, bundles=store, api_client=api_client, create=False)


def test_client_errors_are_translated_where_they_enter(apiserver: FakeApiServer, api_client: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(KubeForbidden) as forbidden:
        with translated("list pods"):
            raise ApiException(status=403, reason="Forbidden")
    assert "RBAC" in str(forbidden.value)
    apiserver.stop()
    with pytest.raises(KubeUnavailable):
        DatasetClient(api_client, request_timeout=1).get("ml", "x")
