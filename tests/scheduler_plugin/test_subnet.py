"""GPU-RoCE class choice and best-fit scoring."""

from __future__ import annotations

import pytest

from gpu_topology.classvote import choose_class, suggest
from scheduler_plugin.plugins.subnet import fit


def test_the_class_suggested_by_most_nodes_wins() -> None:
    # gpu-roce-allocation.md: GPUs 0-3 form gpu-roce1 (VFs of mlx5_4..7), GPUs 4-7 form
    # gpu-roce2 (mlx5_8..11). Node A has free GPUs {0,1,2,5}: roce1 has 3 free, roce2 1,
    # so A suggests roce1. Node B has {4,5,6}: suggests roce2. Node C has {1,4,5,6,7}:
    # roce2 (4 free) beats roce1 (1). roce2 is suggested by two nodes of three and wins,
    # although roce1 holds the most free GPUs on a single node.
    nodes = [
        {"gpu-roce1": 3, "gpu-roce2": 1},
        {"gpu-roce1": 0, "gpu-roce2": 3},
        {"gpu-roce1": 1, "gpu-roce2": 4},
    ]
    choice = choose_class(nodes)
    assert choice is not None
    assert choice.name == "gpu-roce2"
    assert dict(choice.votes) == {"gpu-roce1": 1, "gpu-roce2": 2}


@pytest.mark.parametrize(
    ("free_by_class", "need", "expected"),
    [
        ({"gpu-roce1": 3, "gpu-roce2": 1}, 1, ("gpu-roce1",)),
        ({"gpu-roce1": 2, "gpu-roce2": 2}, 1, ("gpu-roce1", "gpu-roce2")),
        ({"gpu-roce1": 2, "gpu-roce2": 1}, 3, ()),
        ({"gpu-roce1": 0, "gpu-roce2": 0}, 1, ()),
        ({}, 1, ()),
    ],
    ids=["most-free", "tie-suggests-both", "too-few-for-the-worker", "nothing-free", "no-classes"],
)
def test_a_node_suggests_its_class_with_the_most_free_gpus(
    free_by_class: dict[str, int], need: int, expected: tuple[str, ...]
) -> None:
    assert suggest(free_by_class, need) == expected


def test_nodes_that_cannot_host_a_worker_do_not_vote() -> None:
    nodes = [{"gpu-roce1": 4, "gpu-roce2": 0}, {"gpu-roce1": 0, "gpu-roce2": 2}, {"gpu-roce1": 1, "gpu-roce2": 2}]
    assert choose_class(nodes, need=1).name == "gpu-roce2"
    assert choose_class(nodes, need=4).name == "gpu-roce1"
    assert choose_class(nodes, need=5) is None


def test_a_tie_between_classes_goes_to_more_free_gpus_then_name() -> None:
    assert choose_class([{"r1": 2, "r2": 0}, {"r1": 0, "r2": 3}]).name == "r2"
    assert choose_class([{"r1": 2, "r2": 0}, {"r1": 0, "r2": 2}]).name == "r1"


@pytest.mark.parametrize(
    ("free", "need", "expected"),
    [(4, 4, 1.0), (5, 4, 0.5), (8, 4, 0.2), (3, 4, 0.0), (0, 1, 0.0), (4, 0, 0.0)],
    ids=["exact-fit", "one-left", "four-left", "too-few", "none-free", "no-gpus-needed"],
)
def test_best_fit_prefers_the_smallest_sufficient_leftover(free: int, need: int, expected: float) -> None:
    assert fit(free, need) == pytest.approx(expected)
