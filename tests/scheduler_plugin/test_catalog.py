"""Resolving unpinned dataset names to their Dataset resources' current versions."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.catalog import CurrentVersion, read_dataset, resolve
from scheduling.podspec import DatasetWant, PodRequest

A, B = "a" * 32, "b" * 32


def dataset(status: Any = None, namespace: str | None = "ml") -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "imagenet", "namespace": namespace}, "spec": {"source": "s3://x"}}
    if status is not None:
        obj["status"] = status
    return obj


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (dataset({"digest": A, "bytes": 10}), (("ml", "imagenet"), CurrentVersion(A, 10))),
        (dataset({"digest": A.upper()}), (("ml", "imagenet"), CurrentVersion(A, None))),
        (dataset({"digest": A, "bytes": -1}), (("ml", "imagenet"), CurrentVersion(A, None))),
        (dataset(), (("ml", "imagenet"), None)),
        (dataset({"digest": "not-a-digest"}), (("ml", "imagenet"), None)),
        (dataset({"digest": A}, namespace=None), (("default", "imagenet"), CurrentVersion(A, None))),
        ({"metadata": {}}, (None, None)),
        ("garbage", (None, None)),
    ],
    ids=[
        "published",
        "uppercase-digest",
        "bad-size",
        "unpublished",
        "bad-digest",
        "no-namespace",
        "nameless",
        "not-an-object",
    ],
)
def test_reading_a_dataset_resource(obj: Any, expected: tuple[Any, Any]) -> None:
    assert read_dataset(obj) == expected


CURRENT = {("ml", "imagenet"): CurrentVersion(A, 100)}


@pytest.mark.parametrize(
    ("namespace", "want", "expected"),
    [
        ("ml", DatasetWant("imagenet"), DatasetWant("imagenet", A, 100)),
        ("ml", DatasetWant("imagenet", A), DatasetWant("imagenet", A, 100)),
        ("ml", DatasetWant("imagenet", B), DatasetWant("imagenet", B)),
        ("other", DatasetWant("imagenet"), DatasetWant("imagenet")),
        ("ml", DatasetWant("coco"), DatasetWant("coco")),
    ],
    ids=["unpinned-gets-current", "same-pin-gets-size", "own-pin-wins", "other-namespace", "no-dataset-resource"],
)
def test_resolving_a_pods_datasets(namespace: str, want: DatasetWant, expected: DatasetWant) -> None:
    pod = PodRequest(f"{namespace}/p", namespace=namespace, datasets=(want,))
    assert resolve(pod, CURRENT).datasets == (expected,)
