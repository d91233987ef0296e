"""GPU-pair scores, set scores and the best GPU set (the paper's rule, go-gpuallocator's numbers)."""

from __future__ import annotations

import itertools

import pytest

from gpu_topology import GpuSet, InvalidTopology, Link, Topology, UnknownDevice, best_gpu_set, pair_score, set_score
from gpu_topology.scoring import link_score
from tests.gpu_topology.conftest import build


@pytest.mark.parametrize(
    ("cell", "score"),
    [
        ("NV1", 100),
        ("NV2", 200),
        ("NV12", 1200),
        ("NV18", 1800),
        ("BOARD", 60),
        ("PIX", 50),
        ("PXB", 40),
        ("PHB", 30),
        ("NODE", 20),
        ("SYS", 10),
        ("SOC", 10),
    ],
)
def test_each_link_type_scores_as_go_gpuallocator_does(cell: str, score: int) -> None:
    assert link_score(Link.parse(cell)) == score
    assert pair_score(build({("GPU0", "GPU1"): cell}), 0, 1) == score
    assert pair_score(build({("GPU0", "GPU1"): cell}), 1, 0) == score


def test_an_unknown_link_scores_zero_and_a_gpu_with_itself_scores_zero() -> None:
    topology = build({("GPU0", "GPU1"): "NV1"}, gpus=3)
    assert pair_score(topology, 0, 2) == 0
    assert pair_score(topology, 1, 1) == 0
    assert link_score(None) == 0


def test_pair_score_of_a_gpu_the_topology_lacks_is_an_error() -> None:
    with pytest.raises(UnknownDevice):
        pair_score(build({("GPU0", "GPU1"): "NV1"}), 0, 5)


def paper_topology() -> Topology:
    """The paper's example: GPU0 NVLinked to GPU2 and GPU3, GPU1 not."""
    return build(
        {
            ("GPU0", "GPU1"): "PHB",
            ("GPU0", "GPU2"): "NV1",
            ("GPU0", "GPU3"): "NV1",
            ("GPU1", "GPU2"): "PHB",
            ("GPU1", "GPU3"): "PHB",
            ("GPU2", "GPU3"): "NV2",
        }
    )


def test_the_papers_example_picks_the_gpu_nvlinked_to_the_must_include_pair() -> None:
    chosen = best_gpu_set(paper_topology(), free=[0, 1, 2, 3], count=3, must_include=[2, 3])
    assert chosen is not None
    assert chosen.gpus == (0, 2, 3)
    assert chosen.score == 100 + 100 + 200


@pytest.mark.parametrize(
    ("gpus", "score"),
    [
        ([], 0),
        ([0], 0),
        ([0, 1], 30),
        ([2, 3], 200),
        ([0, 2, 3], 400),
        ([1, 2, 3], 260),
        ([0, 1, 2, 3], 30 + 100 + 100 + 30 + 30 + 200),
        ([3, 2, 2], 200),
    ],
)
def test_a_set_scores_the_sum_of_its_pairs(gpus: list[int], score: int) -> None:
    assert set_score(paper_topology(), gpus) == score
