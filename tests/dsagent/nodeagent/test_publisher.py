"""What the agent writes on its Node: pure tables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsagent.nodeagent.publisher import (
    FOLLOW_UPS,
    FREE_GPUS,
    INVENTORY,
    TOPOLOGY,
    annotation_patch,
    applied,
    clearing_patch,
    desired_annotations,
    follow_ups,
    free_gpus,
    gpu_request,
    node_annotations,
    quantized,
)
from tools.support.fake_apiserver import make_pod

GiB = 1 << 30


@pytest.mark.parametrize(
    ("current", "desired", "expected"),
    [
        (None, {}, None),
        ({}, {INVENTORY: "a"}, {INVENTORY: "a"}),
        ({INVENTORY: "a"}, {INVENTORY: "a"}, None),
        ({INVENTORY: "a", "other": "x"}, {INVENTORY: "b"}, {INVENTORY: "b"}),
        ({INVENTORY: "a", FREE_GPUS: "0,1"}, {INVENTORY: "a"}, {FREE_GPUS: None}),
        ({INVENTORY: "a", "other": "x"}, {INVENTORY: "a", TOPOLOGY: "t"}, {TOPOLOGY: "t"}),
        ({"other": "x"}, {}, None),  # never touches what it does not own
    ],
)
def test_the_patch_names_only_what_changed(current: Any, desired: dict[str, str], expected: Any) -> None:
    assert annotation_patch(current, desired) == expected


def test_clearing_removes_only_owned_annotations() -> None:
    current = {INVENTORY: "a", TOPOLOGY: "t", "other": "x"}
    patch = clearing_patch(current)
    assert patch == {INVENTORY: None, TOPOLOGY: None}
    assert applied(current, patch) == {"other": "x"}
    assert clearing_patch({"other": "x"}) is None


@pytest.mark.parametrize(
    ("gpus", "gpu_pods", "expected"),
    [(8, 0, [0, 1, 2, 3, 4, 5, 6, 7]), (8, 1, None), (None, 0, None), (0, 0, [])],
)
def test_free_gpus_are_published_only_when_certain(gpus: int | None, gpu_pods: int, expected: Any) -> None:
    assert free_gpus(gpus, gpu_pods) == expected


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (make_pod("p"), 0),
        (make_pod("p", gpus=4), 4),
        (
            {
                "spec": {
                    "containers": [
                        {"resources": {"limits": {"nvidia.com/gpu": "2"}}},
                        {"resources": {"requests": {"nvidia.com/gpu": "1"}}},
                    ]
                }
            },
            3,
        ),
        ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "lots"}}}]}}, 0),
        ({}, 0),
    ],
)
def test_gpu_requests_of_raw_pods(pod: dict[str, Any], expected: int) -> None:
    assert gpu_request(pod) == expected


@pytest.mark.parametrize(
    ("free", "capacity", "published"),
    [
        (10 * GiB + 12345, 100 * GiB, 10 * GiB),  # quantum 0.5 GiB: 10 GiB is a multiple
        (10 * GiB + (600 << 20), 100 * GiB, 10 * GiB + (512 << 20)),
        (100 << 20, 1 * GiB, 64 << 20),  # small disks: 64 MiB steps
        (0, 1 * GiB, 0),
    ],
)
def test_free_bytes_are_rounded_down_so_noise_never_patches(free: int, capacity: int, published: int) -> None:
    assert quantized({"freeBytes": free, "capacityBytes": capacity})["freeBytes"] == published


def test_desired_annotations_are_compact_and_respect_the_topology_budget() -> None:
    inventory = {"version": 1, "node": "n", "capacityBytes": GiB, "freeBytes": GiB, "datasets": {}}
    desired = desired_annotations(inventory, '{"version":1}', [0, 2, 1])
    assert desired[FREE_GPUS] == "0,1,2"
    assert " " not in desired[INVENTORY] and json.loads(desired[INVENTORY])["node"] == "n"
    assert TOPOLOGY not in desired_annotations(inventory, "x" * (33 * 1024), None)
    assert FREE_GPUS not in desired_annotations(None, None, None)


def test_the_follow_up_namespaces_are_sorted_bounded_and_cleared_with_the_rest() -> None:
    assert node_annotations(None, ["team-b", "ml", "ml"]) == {FOLLOW_UPS: "ml,team-b"}
    assert FOLLOW_UPS not in node_annotations([0], [])
    many = node_annotations(None, [f"n{i:03d}" for i in range(100)])[FOLLOW_UPS].split(",")
    assert many == [f"n{i:03d}" for i in range(4)]
    assert annotation_patch({FOLLOW_UPS: "ml", FREE_GPUS: "0"}, {FREE_GPUS: "0"}) == {FOLLOW_UPS: None}
    assert clearing_patch({FOLLOW_UPS: "ml"}) == {FOLLOW_UPS: None}
    naming = make_pod("a", namespace="ml", annotations={"dsagent.io/next-job": "train-b"})
    plain = make_pod("b", namespace="other")
    typo = make_pod("c", namespace="typo", annotations={"dsagent.io/next-job": "Not a name"})
    assert follow_ups([naming, plain, typo, {"metadata": None}]) == ["ml"]
