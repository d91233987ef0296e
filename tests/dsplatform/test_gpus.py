"""The one rule for how many GPUs a pod requests, and the GPU resource names."""

from __future__ import annotations

from typing import Any

import pytest

from dsplatform.gpus import (
    CLASS_RESOURCE_PREFIX,
    GpuResources,
    QuantityError,
    gpu_requests,
    node_gpus,
    parse_quantity,
    pod_gpus,
)

GPU = "nvidia.com/gpu"


def container(
    gpus: int | str | None = None, resource: str = GPU, *, kind: str = "limits", **extra: Any
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", **extra}
    if gpus is not None:
        c["resources"] = {kind: {resource: gpus, "cpu": "2"}}
    return c


def spec(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"containers": list(containers), "initContainers": list(init)}


def sidecar(gpus: int, resource: str = GPU) -> dict[str, Any]:
    return container(gpus, resource, restartPolicy="Always")


def test_app_containers_add_up() -> None:
    assert pod_gpus(spec(container(2), container(3), container())) == 5


def test_requests_win_and_limits_stand_in_when_there_are_none() -> None:
    both = {"name": "c", "resources": {"requests": {GPU: "2"}, "limits": {GPU: "4"}}}
    assert pod_gpus(spec(both)) == 2
    assert pod_gpus(spec(container(3, kind="requests"))) == 3
    assert pod_gpus(spec(container(3, kind="limits"))) == 3


def test_a_regular_init_container_counts_when_it_is_the_largest_moment() -> None:
    assert pod_gpus(spec(container(2), init=(container(1),))) == 2
    assert pod_gpus(spec(container(2), init=(container(8),))) == 8
    # init containers run one after the other: the largest, not their sum
    assert pod_gpus(spec(container(2), init=(container(3), container(3)))) == 3


def test_a_sidecar_runs_alongside_the_app_containers_and_the_init_containers_after_it() -> None:
    assert pod_gpus(spec(container(2), init=(sidecar(1),))) == 3
    # the regular init container after the sidecar runs beside it: 1 + 4
    assert pod_gpus(spec(container(2), init=(sidecar(1), container(4)))) == 5
    # one started before the sidecar runs alone
    assert pod_gpus(spec(container(2), init=(container(4), sidecar(1)))) == 4


def test_each_resource_takes_its_own_effective_request_and_the_pod_sums_them() -> None:
    names = GpuResources()
    s = spec(container(2, "dsagent.io/gpu-roce1"), init=(container(4, GPU),))
    assert gpu_requests(s, names) == {GPU: 4, "dsagent.io/gpu-roce1": 2}
    assert pod_gpus(s, names) == 6


@pytest.mark.parametrize(
    ("resource", "counts"),
    [
        ("nvidia.com/gpu", True),
        ("dsagent.io/gpu-roce1", True),
        ("dsagent.io/gpu-roce12", True),
        ("dsagent.io/gpu-roce1-2", True),  # a class set (docs/design.md#class-sets)
        ("dsagent.io/gpu-roce1-2-3", True),
        ("dsagent.io/gpu-all", True),  # every GPU of the node
        ("dsagent.io/gpu-roce", False),
        ("dsagent.io/gpu-rocex", False),
        ("dsagent.io/gpu-roce1-", False),
        ("example.com/gpu-roce1", False),  # another prefix than the configured one
        ("dsagent.io/datasets", False),
        ("nvidia.com/gpu.shared", False),
        ("cpu", False),
    ],
)
def test_what_counts_as_a_gpu_resource_by_default(resource: str, counts: bool) -> None:
    assert GpuResources().is_gpu(resource) is counts
    assert pod_gpus(spec(container(2, resource))) == (2 if counts else 0)


def test_configured_names_replace_the_defaults() -> None:
    names = GpuResources(gpu="amd.com/gpu", prefix="example.com")
    assert pod_gpus(spec(container(2, "amd.com/gpu"), container(3, "example.com/gpu-roce1-2")), names) == 5
    assert pod_gpus(spec(container(2, GPU), container(3, "dsagent.io/gpu-roce1")), names) == 0
    assert names.class_of("example.com/gpu-roce1-2") == "gpu-roce1-2"
    assert names.class_of("example.com/gpu-all") is None


def test_the_extenders_class_prefix_setting_reads_into_the_same_names() -> None:
    assert GpuResources.of_class_prefix(GPU, CLASS_RESOURCE_PREFIX) == GpuResources()
    custom = GpuResources.of_class_prefix(GPU, "example.com/roce")
    assert (custom.prefix, custom.stem, custom.whole_node) == ("example.com", "roce", "example.com/gpu-all")
    assert custom.class_of("example.com/roce3") == "roce3"


@pytest.mark.parametrize(
    "garbage",
    [None, 5, [], {"containers": 5}, {"containers": [5, None, {"resources": []}, {"resources": {"limits": 3}}]}],
)
def test_any_shape_requests_nothing(garbage: Any) -> None:
    assert pod_gpus(garbage) == 0


def test_an_unreadable_gpu_quantity_raises_and_other_resources_are_not_read() -> None:
    with pytest.raises(QuantityError):
        pod_gpus(spec(container("four")))
    assert pod_gpus(spec({"resources": {"limits": {"example.com/foo": "x", GPU: "1"}}})) == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4", 4),
        (4, 4),
        ("1k", 1000),
        ("1Ki", 1024),
        ("500m", 1),
        ("0", 0),
        (1.5, 2),
        ("16.1k", 16100),
        ("1.5Gi", 3 << 29),
    ],
)
def test_quantities(value: object, expected: int) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize("value", ["four", "", True, None, "1.2.3", float("nan")])
def test_bad_quantities_raise_a_value_error(value: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(value)


def test_a_nodes_gpus_count_each_gpu_once_whatever_it_is_advertised_as() -> None:
    """The device plugin advertises a GPU in its class, in every class set holding that
    class and in gpu-all; NVIDIA's plugin may advertise it as nvidia.com/gpu too."""
    eight = {
        "dsagent.io/gpu-roce1": "4",
        "dsagent.io/gpu-roce2": "4",
        "dsagent.io/gpu-roce1-2": "8",  # a class set: the same eight GPUs
        "dsagent.io/gpu-all": "8",
    }
    assert node_gpus(eight) == 8
    assert node_gpus({**eight, GPU: "8"}) == 8
    assert node_gpus({"dsagent.io/gpu-roce1": "4", "dsagent.io/gpu-roce2": "2"}) == 6  # classes only
    assert node_gpus({GPU: "8", "cpu": "64"}) == 8
    assert node_gpus({GPU: "lots", "cpu": "64"}) is None  # unreadable: not named
    assert node_gpus({"cpu": "64"}) is None and node_gpus(None) is None
    names = GpuResources(gpu="amd.com/gpu", prefix="example.com")
    assert node_gpus({"example.com/gpu-roce1": "2", "example.com/gpu-roce1-2": "4", GPU: "8"}, names) == 2
