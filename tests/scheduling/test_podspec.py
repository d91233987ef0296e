"""Reading a pod's datasets, GPUs and job."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.settings import DEFAULT_JOB_LABELS
from scheduler_plugin.testing import pod
from scheduling.podspec import (
    DatasetWant,
    parse_datasets,
    read_pod,
)


def read(p: dict[str, Any]):  # type: ignore[no-untyped-def]
    return read_pod(p, job_labels=DEFAULT_JOB_LABELS, gpu_resource="nvidia.com/gpu", roce_prefix="dsagent.io/gpu-roce")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[{"name": "imagenet", "source": "s3://b/imagenet", "digest": "' + "ab" * 16 + '"}]',
            (DatasetWant("imagenet", "ab" * 16),),
        ),
        (
            '[{"name": "a", "source": "s3://x", "bundles": "s3://y", "storage_options": {"anon": true}}]',
            (DatasetWant("a"),),
        ),
        ("imagenet, coco", (DatasetWant("imagenet"), DatasetWant("coco"))),
        ("imagenet", (DatasetWant("imagenet"),)),
        ("imagenet,,coco", (DatasetWant("imagenet"), DatasetWant("coco"))),
        ("", ()),
        (None, ()),
    ],
    ids=[
        "json-list-with-digest",
        "json-list-extra-keys",
        "comma-list",
        "one-name",
        "empty-item-skipped",
        "blank",
        "absent",
    ],
)
def test_datasets_annotation_is_read(text: str | None, expected: tuple[DatasetWant, ...]) -> None:
    assert parse_datasets(text) == (expected, None)


@pytest.mark.parametrize(
    "text",
    [
        '[{"name": "a"',
        '[{"source": "s3://x"}]',
        '[{"name": ""}]',
        "[42]",
        "imagenet,imagenet",
        '[{"name": "a", "src": "s3://x"}]',
        '[{"name": "a", "digest": "AB"}]',
        '{"name": "a"}',
        '[{"name": "a", "digest": 7}]',
    ],
    ids=[
        "broken-json",
        "no-name",
        "empty-name",
        "not-an-object",
        "duplicate",
        "unknown-key",
        "digest-not-lowercase-hex",
        "object-not-list",
        "digest-not-string",
    ],
)
def test_unparseable_datasets_annotation_is_reported_not_raised(text: str) -> None:
    wants, error = parse_datasets(text)
    assert wants == () and error and "dsagent.io/datasets" in error


def test_gpu_count_job_and_datasets_come_from_the_pod() -> None:
    request = read(pod(datasets="imagenet", gpus=4, job="bert"))
    assert (request.key, request.gpus, request.gpu_class, request.job) == ("ml/train-worker-0", 4, None, "ml/bert")
    assert request.datasets == (DatasetWant("imagenet"),)


def test_a_roce_class_resource_counts_as_gpus_and_names_the_class() -> None:
    request = read(pod(gpus=2, gpu_resource="dsagent.io/gpu-roce2"))
    assert (request.gpus, request.gpu_class) == (2, "gpu-roce2")


@pytest.mark.parametrize(
    "label", ["training.kubeflow.org/job-name", "volcano.sh/job-name", "batch.kubernetes.io/job-name", "job-name"]
)
def test_common_training_operator_labels_name_the_job(label: str) -> None:
    assert read(pod(job="resnet", job_label=label)).job == "ml/resnet"


def test_init_containers_count_by_their_maximum() -> None:
    p = pod(gpus=2)
    p["spec"]["initContainers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert read(p).gpus == 2
    p["spec"]["initContainers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "3"}}
    assert read(p).gpus == 3


def test_a_garbled_pod_never_raises() -> None:
    for garbage in (
        {},
        {"metadata": 5, "spec": []},
        {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "x"}}}]}},
    ):
        request = read(garbage)
        assert request.gpus == 0


@pytest.mark.parametrize(
    ("created", "deadline"),
    [
        ("2026-11-22T18:00:00Z", 1_795_370_400.0 + 6 * 3600),
        ("2026-11-22T20:00:00+02:00", 1_795_370_400.0 + 6 * 3600),  # an offset is the same instant
        ("2026-11-22T18:00:00.500000Z", 1_795_370_400.5 + 6 * 3600),
        ("2026-11-22T18:00:00", None),  # no zone: not a Kubernetes time (was read as local time elsewhere)
        ("2026-11-22 18:00:00Z", None),
        ("2026-11-22", None),
    ],
)
def test_a_relative_deadline_counts_from_the_creation_time_the_api_server_wrote(
    created: str, deadline: float | None
) -> None:
    p = pod()
    p["metadata"]["creationTimestamp"] = created
    p["metadata"]["annotations"] = {
        "dsagent.io/params": "1M",
        "dsagent.io/step-seconds": "1",
        "dsagent.io/steps": "10",
        "dsagent.io/deadline": "6h",
    }
    request = read(p)
    if deadline is None:
        assert request.time is None and request.time_error is not None and "creationTimestamp" in request.time_error
    else:
        assert request.time is not None and request.time.deadline == pytest.approx(deadline)
