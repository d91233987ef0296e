"""Pair scores and best sets checked against go-gpuallocator's rule on every fixture.

Pair rule (NVIDIA/go-gpuallocator, calculateGPUPairScore): every GPU pair has a PCIe
("P2P") link scoring SYS 10, NODE 20, PHB 30, PXB 40, PIX 50, same board 60, and an
NVLinked pair adds 100 per bonded link (up to 18). The PCIe level beneath each NVLink
below is derived by hand from each fixture file (the GPUs' NUMA nodes or CPU lists and
their NIC columns; see the comments), independently of gpu_topology.scoring.pcie_level.
The search is checked against tests/gpu_topology/go_reference.py.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from gpu_topology import Topology, best_gpu_set, pair_score
from gpu_topology.dumps import parse_dump
from gpu_topology.scoring import partition_count
from tests.gpu_topology import go_reference
from tests.gpu_topology.test_fixtures import (
    CGROUP,
    DELLA,
    DGX1,
    DGX_A100,
    IBM_XML,
    ML_ENG,
    MYSTOUS,
    ONEFLOW,
    TRAVERSE,
)

P2P = {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50, "BOARD": 60}


def socket_of_four(a: int, b: int) -> bool:
    return a // 4 == b // 4


# fixture -> (a, b) -> the PCIe level between two NVLinked GPUs a < b.
BENEATH: dict[str, Callable[[int, int], str]] = {
    # NPS4: GPU pairs 0-1, 2-3, 4-5, 6-7 share a NUMA node and both reach their two NICs
    # at PXB (an upper bound: nothing tells them apart); other pairs cross NUMA nodes.
    DGX_A100: lambda a, b: "PXB" if a // 2 == b // 2 else "SYS",
    # CPU lists split the sockets (0-3, 4-7). mlx5_0 is PIX to GPU0/1 and PHB to GPU2/3
    # (so 0-1 is PIX and 0-2 PHB); mlx5_1 likewise for GPU2/3.
    DGX1: lambda a, b: ("PIX" if a // 2 == b // 2 else "PHB") if socket_of_four(a, b) else "SYS",
    # No NICs: one NUMA node (0-3, 4-7) bounds the path at NODE.
    ML_ENG: lambda a, b: "NODE" if socket_of_four(a, b) else "SYS",
    # One NIC per GPU at PIX: NIC0 is PXB to GPU1 and NODE to GPU2/3, and so on; GPU6/7
    # share NIC8 (PIX/PXB).
    MYSTOUS: lambda a, b: ("PXB" if a // 2 == b // 2 else "NODE") if socket_of_four(a, b) else "SYS",
    CGROUP: lambda a, b: ("PXB" if a // 2 == b // 2 else "NODE") if socket_of_four(a, b) else "SYS",
    # mlx5_0 is NODE to GPU0/1, PIX to GPU2/3 (mlx5_1 likewise for 4/5 and 6/7): 2-3 PIX,
    # 0-1 NODE (bound), 0/1 to 2/3 NODE.
    ONEFLOW: lambda a, b: ("PIX" if a // 2 == b // 2 and a % 4 >= 2 else "NODE") if socket_of_four(a, b) else "SYS",
    # The NCCL dump's PCI tree: each GPU behind its own switch under one CPU per socket.
    IBM_XML: lambda a, b: "PHB" if socket_of_four(a, b) else "SYS",
    DELLA: lambda a, b: pytest.fail("no NVLink on this machine"),
    TRAVERSE: lambda a, b: pytest.fail("one GPU"),
}


def go_pair_score(topology: Topology, fixture: str, a: int, b: int) -> int:
    cell = str(topology.link(f"GPU{a}", f"GPU{b}"))
    if cell.startswith("NV"):
        return 100 * min(int(cell[2:]), 18) + P2P[BENEATH[fixture](min(a, b), max(a, b))]
    return P2P[cell]


@pytest.fixture(scope="module", params=sorted(BENEATH))
def fixture(request: pytest.FixtureRequest, read_fixture: Callable[[str], str]) -> tuple[str, Topology]:
    name: str = request.param
    return name, parse_dump(read_fixture(name))


def test_every_pair_of_every_fixture_scores_by_go_gpuallocator_s_rule(fixture: tuple[str, Topology]) -> None:
    name, topology = fixture
    pairs = list(itertools.combinations(topology.gpu_indices, 2))
    for a, b in pairs:
        expected = go_pair_score(topology, name, a, b)
        assert pair_score(topology, a, b) == pair_score(topology, b, a) == expected, (a, b)


def test_dgx1_explicit_pair_scores(read_fixture: Callable[[str], str]) -> None:
    dgx1 = parse_dump(read_fixture(DGX1))
    assert pair_score(dgx1, 0, 1) == 100 + 50  # NV1 over one PCIe switch
    assert pair_score(dgx1, 0, 3) == 200 + 30  # NV2 through the host bridge
    assert pair_score(dgx1, 0, 4) == 200 + 10  # NV2 across the sockets
    assert pair_score(dgx1, 0, 5) == 10  # SYS, no NVLink


def every_case(gpus: int) -> list[tuple[tuple[int, ...], int]]:
    """Every non-empty free set with every count from 2 to its size: 769 for 8 GPUs."""
    return [
        (free, count)
        for size in range(1, gpus + 1)
        for free in itertools.combinations(range(gpus), size)
        for count in range(2, size + 1)
    ]


def test_the_dgx1_has_769_cases() -> None:
    assert len(every_case(8)) == 769


def test_all_769_dgx1_cases_pick_what_go_gpuallocator_picks(read_fixture: Callable[[str], str]) -> None:
    dgx1 = parse_dump(read_fixture(DGX1))
    pair = lambda a, b: go_pair_score(dgx1, DGX1, a, b)  # noqa: E731
    wrong = []
    for free, count in every_case(8):
        chosen = best_gpu_set(dgx1, free, count)
        assert chosen is not None
        expected = go_reference.expected_choice(free, (), count, pair)
        if chosen.gpus != expected:
            wrong.append((free, count, chosen.gpus, expected))
    assert wrong == []


@pytest.mark.parametrize("must_size", [1, 2])
def test_must_include_sets_on_every_fixture_pick_what_go_gpuallocator_picks(
    fixture: tuple[str, Topology], must_size: int
) -> None:
    name, topology = fixture
    gpus = topology.gpu_indices
    pair = lambda a, b: go_pair_score(topology, name, a, b)  # noqa: E731
    for count in range(1, len(gpus) + 1):
        for must in itertools.combinations(gpus, min(must_size, count)):
            chosen = best_gpu_set(topology, gpus, count, must)
            expected = go_reference.expected_choice(gpus, must, count, pair)
            assert (chosen.gpus if chosen else None) == expected, (count, must)


@pytest.mark.parametrize("seed", range(6))
def test_random_free_sets_on_every_fixture_pick_what_go_gpuallocator_picks(
    fixture: tuple[str, Topology], seed: int
) -> None:
    name, topology = fixture
    rng = random.Random(seed)
    pair = lambda a, b: go_pair_score(topology, name, a, b)  # noqa: E731
    gpus = list(topology.gpu_indices)
    for _ in range(20):
        free = sorted(rng.sample(gpus, rng.randint(1, len(gpus))))
        count = rng.randint(1, len(free))
        must = sorted(rng.sample(free, rng.randint(0, min(2, count))))
        chosen = best_gpu_set(topology, free, count, must)
        assert (chosen.gpus if chosen else None) == go_reference.expected_choice(free, must, count, pair)


@pytest.mark.parametrize(("gpus", "count"), [(n, k) for n in range(1, 11) for k in range(1, n + 1)])
def test_the_partition_count_is_what_the_search_visits(gpus: int, count: int) -> None:
    visited = sum(1 for _ in go_reference.partitions(list(range(gpus)), count))
    assert partition_count(gpus, count) == visited


def test_a_padded_set_is_never_returned() -> None:
    # GPUs 3 and 4 share 12 NVLinks; 0-2 only PCIe. Three from five: go-gpuallocator's best
    # partition is {0,1,2} + {3,4,pad}, whose padded set scores highest; we return {0,1,2}.
    from tests.gpu_topology.conftest import build

    links = {(f"GPU{a}", f"GPU{b}"): "PHB" for a, b in itertools.combinations(range(5), 2)}
    links[("GPU3", "GPU4")] = "NV12"
    topology = build(links)
    pair = lambda a, b: pair_score(topology, a, b)  # noqa: E731
    pick, _ = go_reference.allocate(range(5), (), 3, pair)
    assert go_reference.PAD in pick
    chosen = best_gpu_set(topology, range(5), 3)
    assert chosen is not None and len(chosen.gpus) == 3
    assert chosen.gpus == go_reference.expected_choice(range(5), (), 3, pair)
