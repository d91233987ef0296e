"""GPU-pair scores, set scores and the best GPU set (docs/design.md#gpu-pair-scores: go-gpuallocator's rule and search).

test_go_gpuallocator.py checks them against an independent re-derivation on every fixture."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from gpu_topology import (
    Gpu,
    GpuSet,
    InvalidTopology,
    Link,
    LinkKind,
    Topology,
    UnknownDevice,
    best_gpu_set,
    pair_score,
    scoring,
    set_score,
)
from gpu_topology.dumps import parse_dump
from gpu_topology.scoring import EXACT_COMBINATIONS, LINK_SCORES, link_score, partition_count, pcie_level
from tests.gpu_topology import go_reference
from tests.gpu_topology.conftest import build


@pytest.mark.parametrize(
    ("cell", "score"),
    [
        ("BOARD", 60),
        ("PIX", 50),
        ("PXB", 40),
        ("PHB", 30),
        ("NODE", 20),
        ("SYS", 10),
        ("SOC", 10),
    ],
)
def test_each_pcie_level_scores_as_go_gpuallocator_does(cell: str, score: int) -> None:
    assert link_score(Link.parse(cell)) == score
    assert pair_score(build({("GPU0", "GPU1"): cell}), 0, 1) == score
    assert pair_score(build({("GPU0", "GPU1"): cell}), 1, 0) == score


@pytest.mark.parametrize(("links", "score"), [(1, 100), (2, 200), (12, 1200), (18, 1800), (24, 1800)])
@pytest.mark.parametrize(
    ("beneath", "extra"), [(None, 0), (LinkKind.PIX, 50), (LinkKind.SYS, 10), (LinkKind.BOARD, 60)]
)
def test_an_nvlink_scores_100_per_link_up_to_18_plus_the_pcie_level_beneath_it(
    links: int, score: int, beneath: LinkKind | None, extra: int
) -> None:
    assert link_score(Link(LinkKind.NVLINK, links, pcie=beneath)) == score + extra
    assert link_score(Link(LinkKind.NVLINK, links), beneath) == score + extra


def test_an_nvlink_between_gpus_nothing_else_places_counts_its_pcie_path_as_sys() -> None:
    assert pair_score(build({("GPU0", "GPU1"): "NV2"}), 0, 1) == 200 + 10
    assert pcie_level(build({("GPU0", "GPU1"): "NV2"}), 0, 1) is LinkKind.SYS


@pytest.mark.parametrize(
    ("links", "numa", "level"),
    [
        # Different NUMA nodes: SYS whatever else is known.
        ({("GPU0", "n"): "PIX", ("GPU1", "n"): "PIX"}, {0: 0, 1: 1}, "SYS"),
        # A third device at different levels from the two fixes the level: the larger.
        ({("GPU0", "n"): "PIX", ("GPU1", "n"): "PHB"}, {}, "PHB"),
        ({("GPU0", "GPU2"): "NODE", ("GPU1", "GPU2"): "PXB"}, {}, "NODE"),
        # Equal levels bound it from above: the closest such bound.
        ({("GPU0", "n"): "PXB", ("GPU1", "n"): "PXB", ("GPU0", "m"): "NODE", ("GPU1", "m"): "NODE"}, {}, "PXB"),
        ({("GPU0", "n"): "PIX", ("GPU1", "n"): "PIX"}, {0: 0, 1: 0}, "PIX"),
        # One NUMA node and nothing else: NODE.
        ({}, {0: 0, 1: 0}, "NODE"),
        ({("GPU0", "n"): "SYS", ("GPU1", "n"): "SYS"}, {0: 0, 1: 0}, "NODE"),
    ],
)
def test_the_pcie_level_beneath_an_nvlink_is_inferred_from_the_other_links(
    links: dict[tuple[str, str], str], numa: dict[int, int], level: str
) -> None:
    topology = build({("GPU0", "GPU1"): "NV4", **links}, numa=numa)
    assert pcie_level(topology, 0, 1) is LinkKind(level)
    assert pair_score(topology, 0, 1) == 400 + LINK_SCORES[LinkKind(level)]


def test_a_measured_pcie_level_beats_the_inference() -> None:
    topology = Topology(
        gpus=(Gpu(0, numa_node=0), Gpu(1, numa_node=0)),
        links={"GPU0": {"GPU1": Link(LinkKind.NVLINK, 2, pcie=LinkKind.PIX)}},
    )
    assert pcie_level(topology, 0, 1) is LinkKind.PIX and pair_score(topology, 0, 1) == 250


def test_an_unknown_link_scores_zero_and_a_gpu_with_itself_scores_zero() -> None:
    topology = build({("GPU0", "GPU1"): "NV1"}, gpus=3)
    assert pair_score(topology, 0, 2) == 0
    assert pair_score(topology, 1, 1) == 0
    assert link_score(None) == 0


def test_pair_score_of_a_gpu_the_topology_lacks_is_an_error() -> None:
    with pytest.raises(UnknownDevice):
        pair_score(build({("GPU0", "GPU1"): "NV1"}), 0, 5)


def paper_topology() -> Topology:
    """The design's example (docs/design.md#gpu-pair-scores): GPU0 NVLinked to GPU2 and GPU3, GPU1 not."""
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
    # The NVLinked pairs' PCIe path is PHB, as GPU1 (PHB to all three) shows.
    assert chosen.score == 130 + 130 + 230


@pytest.mark.parametrize(
    ("gpus", "score"),
    [
        ([], 0),
        ([0], 0),
        ([0, 1], 30),
        ([2, 3], 230),
        ([0, 2, 3], 490),
        ([1, 2, 3], 290),
        ([0, 1, 2, 3], 30 + 130 + 130 + 30 + 30 + 230),
        ([3, 2, 2], 230),
    ],
)
def test_a_set_scores_the_sum_of_its_pairs(gpus: list[int], score: int) -> None:
    assert set_score(paper_topology(), gpus) == score


def brute_force_best_score(topology: Topology, free: list[int], count: int, must: list[int]) -> int:
    """An independent optimum: try every set, score it with set_score."""
    rest = [g for g in free if g not in must]
    return max(set_score(topology, must + list(extra)) for extra in itertools.combinations(rest, count - len(must)))


PCIE_CELLS = ["PIX", "PXB", "PHB", "NODE", "SYS"]


def random_topology(rng: random.Random, gpus: int) -> Topology:
    cells = PCIE_CELLS + ["NV1", "NV2", "NV4", "NV12", "NV18", "BOARD"]
    links = {(f"GPU{a}", f"GPU{b}"): rng.choice(cells) for a, b in itertools.combinations(range(gpus), 2)}
    return build(links, numa={i: rng.randint(0, 1) for i in range(gpus)})


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_is_go_gpuallocator_s_on_random_topologies(seed: int) -> None:
    rng = random.Random(seed)
    topology = random_topology(rng, 8)
    free = sorted(rng.sample(range(8), rng.randint(2, 8)))
    count = rng.randint(1, len(free))
    must = sorted(rng.sample(free, rng.randint(0, min(2, count))))
    chosen = best_gpu_set(topology, free, count, must)
    assert chosen is not None
    assert set(must) <= set(chosen.gpus) <= set(free)
    assert len(chosen.gpus) == count
    assert chosen.score == set_score(topology, chosen.gpus)
    pair = lambda a, b: pair_score(topology, a, b)  # noqa: E731
    assert chosen.gpus == go_reference.expected_choice(free, must, count, pair)


def test_the_best_partition_can_beat_the_best_set() -> None:
    # Four GPUs, two wanted: {0,1} is the best pair (NV3), but taking it leaves {2,3}
    # apart (SYS); {0,2} + {1,3} (NV2 each) scores more in all, so {0,2} is chosen.
    links = {
        ("GPU0", "GPU1"): "NV3",
        ("GPU2", "GPU3"): "SYS",
        ("GPU0", "GPU2"): "NV2",
        ("GPU1", "GPU3"): "NV2",
        ("GPU0", "GPU3"): "SYS",
        ("GPU1", "GPU2"): "SYS",
    }
    topology = build(links)
    chosen = best_gpu_set(topology, range(4), 2)
    assert chosen is not None and chosen.gpus == (0, 2)
    assert chosen.score < set_score(topology, (0, 1))


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize(
    ("free", "count", "must", "expected"),
    [
        ([0, 1, 2, 3], 3, [2, 3], (0, 2, 3)),  # the design's example
        ([0, 1, 2, 3], 1, [], (0,)),
        ([0, 1, 2, 3], 2, [], (2, 3)),  # NV2 beats every other pair
        ([0, 1, 2], 2, [], (0, 2)),  # NV1 beats PHB
        ([1, 2, 3], 2, [1], (1, 2)),  # must-include 1: PHB to 2 or 3, tie -> first found
        ([0, 1, 2, 3], 4, [], (0, 1, 2, 3)),
        ([3, 2, 1, 0, 3], 3, [3], (0, 2, 3)),  # order and duplicates of free do not matter
        ([0, 1, 2, 3], 0, [], ()),
    ],
)
def test_best_set_on_the_papers_topology(
    free: list[int], count: int, must: list[int], expected: tuple[int, ...], fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fast:
        monkeypatch.setattr(scoring, "EXACT_PARTITIONS", 0)
        monkeypatch.setattr(scoring, "EXACT_COMBINATIONS", 0)
    chosen = best_gpu_set(paper_topology(), free, count, must)
    assert chosen is not None and chosen.gpus == expected


@pytest.mark.parametrize(
    ("free", "count", "must"),
    [
        ([0, 1], 3, []),  # too few free GPUs
        ([0, 1, 2], 2, [3]),  # must-include GPU is not free
        ([0, 1, 2, 3], 1, [2, 3]),  # more must-include than wanted
        ([], 1, []),
    ],
)
def test_no_set_when_the_request_cannot_be_met(free: list[int], count: int, must: list[int]) -> None:
    assert best_gpu_set(paper_topology(), free, count, must) is None


def test_a_negative_count_or_an_unknown_gpu_is_an_error() -> None:
    with pytest.raises(InvalidTopology):
        best_gpu_set(paper_topology(), [0, 1], -1)
    with pytest.raises(UnknownDevice, match="no GPU 9"):
        best_gpu_set(paper_topology(), [0, 1, 9], 2)
    with pytest.raises(UnknownDevice):
        best_gpu_set(paper_topology(), [0, 1], 1, must_include=[7])


def test_equal_partitions_go_to_the_first_found_as_in_go_gpuallocator() -> None:
    flat = {(f"GPU{a}", f"GPU{b}"): "SYS" for a, b in itertools.combinations(range(4), 2)}
    topology = build(flat, numa={0: 0, 1: 1, 2: 1, 3: 0})
    assert best_gpu_set(topology, [0, 1, 2, 3], 2) == GpuSet((0, 1), 10, False, None)


@pytest.fixture
def fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past EXACT_PARTITIONS the best set is taken directly, with its own tie-breaks."""
    monkeypatch.setattr(scoring, "EXACT_PARTITIONS", 0)


@pytest.mark.usefixtures("fallback")
def test_past_the_partition_limit_equal_scores_go_to_one_numa_node_before_lower_indices() -> None:
    flat = {(f"GPU{a}", f"GPU{b}"): "SYS" for a, b in itertools.combinations(range(4), 2)}
    topology = build(flat, numa={0: 0, 1: 1, 2: 1, 3: 0})
    assert best_gpu_set(topology, [0, 1, 2, 3], 2) == GpuSet((0, 3), 10, True, None)


@pytest.mark.usefixtures("fallback")
def test_past_the_partition_limit_a_better_score_beats_one_numa_node() -> None:
    links = {("GPU0", "GPU1"): "NV1", ("GPU0", "GPU2"): "PHB", ("GPU1", "GPU2"): "PHB"}
    topology = build(links, numa={0: 0, 1: 1, 2: 0})
    assert best_gpu_set(topology, [0, 1, 2], 2) == GpuSet((0, 1), 110, False, None)


@pytest.mark.usefixtures("fallback")
@pytest.mark.parametrize(
    ("nic_cells", "count", "expected", "level"),
    [
        ({"GPU0": "NODE", "GPU1": "NODE", "GPU2": "PIX", "GPU3": "NODE"}, 1, (2,), "PIX"),
        ({"GPU0": "NODE", "GPU1": "NODE", "GPU2": "PIX", "GPU3": "NODE"}, 2, (0, 2), "PIX"),
        ({"GPU0": "NODE", "GPU1": "PHB", "GPU2": "PXB", "GPU3": "PHB"}, 1, (2,), "PXB"),
        ({"GPU0": "SYS", "GPU1": "SYS", "GPU2": "SYS", "GPU3": "NODE"}, 1, (3,), "NODE"),
        ({"GPU0": "SYS", "GPU1": "SYS", "GPU2": "SYS", "GPU3": "SYS"}, 1, (0,), "SYS"),
    ],
)
def test_past_the_partition_limit_equal_scores_go_to_the_gpus_closest_to_a_nic(
    nic_cells: dict[str, str], count: int, expected: tuple[int, ...], level: str
) -> None:
    links = {(f"GPU{a}", f"GPU{b}"): "PHB" for a, b in itertools.combinations(range(4), 2)}
    links.update({(gpu, "mlx5_0"): cell for gpu, cell in nic_cells.items()})
    topology = build(links, numa={i: 0 for i in range(4)})
    chosen = best_gpu_set(topology, range(4), count)
    assert chosen is not None
    assert (chosen.gpus, chosen.nic_level, chosen.single_numa) == (expected, level, True)


def islands(sizes: list[int], inside: str = "NV12", across: str = "SYS") -> Topology:
    """GPUs in NVLink islands (numbered in turn) joined by ``across``."""
    members: list[int] = []
    for island, size in enumerate(sizes):
        members += [island] * size
    links = {
        (f"GPU{a}", f"GPU{b}"): inside if members[a] == members[b] else across
        for a, b in itertools.combinations(range(len(members)), 2)
    }
    return build(links, numa=dict(enumerate(members)))


@pytest.mark.parametrize(
    ("sizes", "free", "count", "must", "expected"),
    [
        ([8, 8], range(16), 8, [], tuple(range(8))),
        ([8, 8], range(16), 8, [9], tuple(range(8, 16))),
        ([8, 8], [0, 1, 2] + list(range(8, 16)), 6, [], tuple(range(8, 14))),
        ([4, 4, 4, 4], range(16), 4, [13], (12, 13, 14, 15)),
        ([6, 6, 6], range(18), 9, [], tuple(range(6)) + (6, 7, 8)),
    ],
)
def test_the_fast_method_keeps_nvlink_islands_whole(
    sizes: list[int],
    free: range | list[int],
    count: int,
    must: list[int],
    expected: tuple[int, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scoring, "EXACT_PARTITIONS", 0)
    monkeypatch.setattr(scoring, "EXACT_COMBINATIONS", 0)
    chosen = best_gpu_set(islands(sizes), free, count, must)
    assert chosen is not None and chosen.gpus == expected


def test_sixteen_free_gpus_take_the_fast_method() -> None:
    assert partition_count(16, 6) > scoring.EXACT_PARTITIONS
    assert math.comb(16, 6) > EXACT_COMBINATIONS


@pytest.mark.parametrize("seed", range(3))
def test_the_fast_method_stays_near_brute_force_on_sixteen_random_gpus(seed: int) -> None:
    rng = random.Random(1000 + seed)
    topology = random_topology(rng, 16)
    chosen = best_gpu_set(topology, range(16), 6)
    assert chosen is not None
    optimum = brute_force_best_score(topology, list(range(16)), 6, [])
    # greedy + single swaps is a heuristic: it must stay within 5% of the optimum here.
    assert chosen.score >= 0.95 * optimum


def test_real_machines_pick_their_nvlink_and_nic_locality(read_fixture: Callable[[str], str]) -> None:
    dgx1 = parse_dump(read_fixture("dgx1-v100-4ib"))
    assert best_gpu_set(dgx1, range(8), 4) == GpuSet((0, 1, 2, 3), 1120, True, "PIX")
    # GPU0-GPU4 and GPU4-GPU7 are both NV2; only 4 and 7 share a socket (PHB 30 beats
    # SYS 10 beneath the NVLinks).
    assert best_gpu_set(dgx1, [0, 4, 7], 2) == GpuSet((4, 7), 230, True, "PIX")
    a100 = parse_dump(read_fixture("dgx-a100-class"))
    assert best_gpu_set(a100, [1, 2, 3, 6], 2) == GpuSet((2, 3), 1240, True, "PXB")
    della = parse_dump(read_fixture("princeton-della"))
    assert best_gpu_set(della, [0, 1], 2) == GpuSet((0, 1), 10, False, "NODE")


@pytest.mark.parametrize("link", [Link(LinkKind.PIX), Link(LinkKind.NVLINK, 2)])
def test_only_an_nvlink_carries_a_pcie_level_beneath_it(link: Link) -> None:
    if link.is_nvlink:
        assert Link(LinkKind.NVLINK, 2, pcie=LinkKind.NODE).pcie is LinkKind.NODE
        with pytest.raises(InvalidTopology):
            Link(LinkKind.NVLINK, 2, pcie=LinkKind.NVLINK)
    else:
        with pytest.raises(InvalidTopology, match="only an NVLink"):
            Link(LinkKind.PIX, pcie=LinkKind.PIX)
