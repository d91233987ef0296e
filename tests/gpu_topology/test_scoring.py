"""GPU-pair scores, set scores and the best GPU set (docs/design.md#gpu-pair-scores, go-gpuallocator's numbers)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from gpu_topology import (
    GpuSet,
    InvalidTopology,
    Link,
    Topology,
    UnknownDevice,
    best_gpu_set,
    pair_score,
    scoring,
    set_score,
)
from gpu_topology.dumps import parse_dump
from gpu_topology.scoring import EXACT_COMBINATIONS, link_score
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
def test_up_to_eight_free_gpus_the_choice_is_exactly_optimal(seed: int) -> None:
    rng = random.Random(seed)
    topology = random_topology(rng, 8)
    free = sorted(rng.sample(range(8), rng.randint(2, 8)))
    count = rng.randint(1, len(free))
    must = sorted(rng.sample(free, rng.randint(0, min(2, count))))
    chosen = best_gpu_set(topology, free, count, must)
    assert chosen is not None
    assert set(must) <= set(chosen.gpus) <= set(free)
    assert len(chosen.gpus) == count
    assert chosen.score == set_score(topology, chosen.gpus) == brute_force_best_score(topology, free, count, must)


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize(
    ("free", "count", "must", "expected"),
    [
        ([0, 1, 2, 3], 3, [2, 3], (0, 2, 3)),  # the design's example
        ([0, 1, 2, 3], 1, [], (0,)),
        ([0, 1, 2, 3], 2, [], (2, 3)),  # NV2 beats every other pair
        ([0, 1, 2], 2, [], (0, 2)),  # NV1 beats PHB
        ([1, 2, 3], 2, [1], (1, 2)),  # must-include 1: PHB to 2 or 3, tie -> lowest
        ([0, 1, 2, 3], 4, [], (0, 1, 2, 3)),
        ([3, 2, 1, 0, 3], 3, [3], (0, 2, 3)),  # order and duplicates of free do not matter
        ([0, 1, 2, 3], 0, [], ()),
    ],
)
def test_best_set_on_the_papers_topology(
    free: list[int], count: int, must: list[int], expected: tuple[int, ...], fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fast:
        monkeypatch.setattr(scoring, "EXACT_FREE_GPUS", 0)
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


def test_equal_scores_go_to_one_numa_node_before_lower_indices() -> None:
    flat = {(f"GPU{a}", f"GPU{b}"): "SYS" for a, b in itertools.combinations(range(4), 2)}
    topology = build(flat, numa={0: 0, 1: 1, 2: 1, 3: 0})
    assert best_gpu_set(topology, [0, 1, 2, 3], 2) == GpuSet((0, 3), 10, True, None)


def test_a_better_score_beats_one_numa_node() -> None:
    links = {("GPU0", "GPU1"): "NV1", ("GPU0", "GPU2"): "PHB", ("GPU1", "GPU2"): "PHB"}
    topology = build(links, numa={0: 0, 1: 1, 2: 0})
    assert best_gpu_set(topology, [0, 1, 2], 2) == GpuSet((0, 1), 100, False, None)


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
def test_equal_scores_go_to_the_gpus_closest_to_a_nic(
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
    monkeypatch.setattr(scoring, "EXACT_FREE_GPUS", 0)
    monkeypatch.setattr(scoring, "EXACT_COMBINATIONS", 0)
    chosen = best_gpu_set(islands(sizes), free, count, must)
    assert chosen is not None and chosen.gpus == expected


def test_sixteen_free_gpus_take_the_fast_method() -> None:
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
    assert best_gpu_set(dgx1, range(8), 4) == GpuSet((0, 1, 2, 3), 900, True, "PIX")
    # GPU0-GPU4 and GPU4-GPU7 are both NV2; only 4 and 7 share a socket.
    assert best_gpu_set(dgx1, [0, 4, 7], 2) == GpuSet((4, 7), 200, True, "PIX")
    a100 = parse_dump(read_fixture("dgx-a100-class"))
    assert best_gpu_set(a100, [1, 2, 3, 6], 2) == GpuSet((2, 3), 1200, True, "PXB")
    della = parse_dump(read_fixture("princeton-della"))
    assert best_gpu_set(della, [0, 1], 2) == GpuSet((0, 1), 10, False, "NODE")
