"""NUMA placement: the best set a node can still give, relative to the best possible."""

from __future__ import annotations

import pytest

from gpu_topology import Topology
from scheduler_plugin.plugins.numa import PlacementMemo, placement
from scheduler_plugin.testing import two_class_topology

TOPO = two_class_topology()


@pytest.mark.parametrize(
    ("free", "need", "expected"),
    [
        pytest.param(range(8), 4, 10, id="fully-free-node-is-ideal"),
        pytest.param([4, 5, 6, 7], 4, 10, id="one-whole-quad-free-is-ideal"),
        pytest.param([0, 1, 4, 5], 2, 10, id="a-pair-on-one-numa-node-is-ideal"),
        pytest.param([0, 4, 5, 6], 4, 3, id="four-across-numa-nodes-scores-low"),
        pytest.param([0, 4], 2, 1, id="a-pair-split-across-cpus"),
        pytest.param([0, 1, 2], 4, 0, id="too-few-free"),
        pytest.param(range(8), 0, 0, id="no-gpus-requested"),
    ],
)
def test_placement_score_table(free: range | list[int], need: int, expected: int) -> None:
    assert placement(TOPO, free, need) == expected


def test_one_numa_node_with_a_nearby_nic_beats_any_split_placement() -> None:
    split_best = max(placement(TOPO, free, 2) for free in ([0, 4], [1, 5], [3, 7]))
    single = placement(TOPO, [2, 3], 2)
    assert single > split_best
    assert single >= 6 and split_best <= 5


def test_a_node_without_topology_or_free_list_scores_zero() -> None:
    assert placement(None, range(8), 2) == 0
    assert placement(TOPO, None, 2) == 0


def test_free_indices_the_topology_lacks_score_zero_instead_of_failing() -> None:
    assert placement(TOPO, [0, 1, 42], 2) == 0


def test_memo_returns_the_same_scores() -> None:
    memo = PlacementMemo()
    for free in ([0, 1, 4, 5], [0, 4, 5, 6], [1, 2, 3]):
        for need in (1, 2, 3):
            expected = placement(TOPO, free, need)
            assert memo.score(TOPO, 7, frozenset(free), need) == expected
            assert memo.score(TOPO, 7, frozenset(free), need) == expected


def test_real_dgx_a100_topology_prefers_a_numa_local_pair(read_fixture_text: str) -> None:
    from gpu_topology.discovery.nvidia_smi import parse_topo_matrix

    topology: Topology = parse_topo_matrix(read_fixture_text)
    everything = [g.index for g in topology.gpus]
    assert placement(topology, everything, 2) == 10
    assert 0 < placement(topology, [0, 7], 2) < placement(topology, everything, 2)
