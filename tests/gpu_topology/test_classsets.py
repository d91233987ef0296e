"""Job-level class sets: one set of RoCE classes (subnets) for every worker of a job."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpu_topology import roce_classes
from gpu_topology.classsets import (
    NodeRoom,
    assign,
    candidate_sets,
    choose_class_set,
    gpus_in_set,
    parse_set,
    set_key,
    shares,
    single_set_exists,
    single_set_placement,
)
from gpu_topology.dumps import parse_dump
from tests.gpu_topology.test_fixtures import DGX1, DGX_A100, ONEFLOW

R = "gpu-roce"
A100 = {f"{R}1": 2, f"{R}2": 2, f"{R}3": 2, f"{R}4": 2}  # the 10-NIC DGX A100: a class per NIC pair
QUADS = {f"{R}1": 4, f"{R}2": 4}  # DGX-1 / 2-NIC V100: a class per CPU


def test_a_set_is_written_in_rail_order_and_read_back() -> None:
    assert set_key([f"{R}10", f"{R}2"]) == "gpu-roce2+gpu-roce10"
    assert parse_set(" gpu-roce2 ++gpu-roce10") == ("gpu-roce2", "gpu-roce10")


@pytest.mark.parametrize(("need", "count", "out"), [(4, 2, (2, 2)), (5, 2, (3, 2)), (8, 4, (2, 2, 2, 2)), (1, 1, (1,))])
def test_a_worker_is_split_evenly_over_its_classes(need: int, count: int, out: tuple[int, ...]) -> None:
    assert shares(need, count) == out


def test_a_node_serves_a_set_only_when_every_class_can_give_its_share() -> None:
    assert assign(A100, (f"{R}1", f"{R}2"), 4) == {f"{R}1": 2, f"{R}2": 2}
    assert assign(QUADS, (f"{R}1", f"{R}2"), 4) == {f"{R}1": 2, f"{R}2": 2}
    assert assign({f"{R}1": 3, f"{R}2": 1}, (f"{R}1", f"{R}2"), 4) is None  # 1 free cannot give 2
    assert assign(A100, (f"{R}1",), 4) is None
    assert assign(A100, (f"{R}1", f"{R}5"), 2) is None  # a class the node lacks
    assert assign(QUADS, (f"{R}1", f"{R}2"), 1) is None  # one GPU cannot touch two rails


def test_candidate_sets_take_as_many_classes_as_the_worker_needs() -> None:
    sets = candidate_sets([A100, QUADS], 8)
    assert sets[0] == (f"{R}1", f"{R}2")  # the quads: two classes of four
    assert (f"{R}1", f"{R}2", f"{R}3", f"{R}4") in sets  # the A100: all four pairs
    assert (f"{R}1", f"{R}3") not in sets  # 2 + 2 < 8 on the A100, 4 + 4 < 8 impossible on quads


def test_the_job_gets_the_smallest_set_that_holds_every_worker_now() -> None:
    free_quad = NodeRoom(QUADS, QUADS)
    free_a100 = NodeRoom(A100, A100)
    # two 4-GPU workers: the two quad nodes hold them in one class (one NUMA group each)
    choice = choose_class_set([free_quad, NodeRoom(QUADS, QUADS), free_a100], 4, 2)
    assert choice is not None and (choice.classes, choice.holds) == ((f"{R}1",), True) and choice.hosts == 2
    # three workers: one class holds only two; rail-aligned 2 + 2 over classes 1 and 2 holds all three
    choice = choose_class_set([NodeRoom(QUADS, QUADS, weight=2), free_a100], 4, 3)
    assert choice is not None and choice.key == "gpu-roce1+gpu-roce2" and choice.holds and choice.hosts == 3


def test_when_no_set_holds_the_job_the_set_most_nodes_could_serve_is_named_not_holding() -> None:
    busy_quad = NodeRoom(QUADS, {f"{R}1": 0, f"{R}2": 0}, weight=3)
    choice = choose_class_set([busy_quad, NodeRoom(A100, A100)], 8, 2)
    assert choice is not None and not choice.holds and choice.key == "gpu-roce1+gpu-roce2"
    assert choose_class_set([NodeRoom(QUADS, QUADS)], 9, 2) is None  # larger than any node


def test_a_single_set_placement_keeps_mixed_worker_sizes_in_one_set() -> None:
    rooms = [NodeRoom(QUADS, QUADS), NodeRoom(A100, A100), NodeRoom(QUADS, {f"{R}1": 4, f"{R}2": 0})]
    found = single_set_placement(rooms, [8, 4])
    assert found is not None
    class_set, where = found
    assert class_set == (f"{R}1", f"{R}2") and where[0] == 0 and where[1] == 1
    assert not single_set_exists(rooms[1:], [8, 4])  # the A100 needs classes 3 and 4 for 8, the quad lacks them
    assert single_set_exists(rooms, [])


def test_a_worker_gets_its_share_of_every_class_on_the_real_fixtures(read_fixture: Callable[[str], str]) -> None:
    a100 = parse_dump(read_fixture(DGX_A100))
    classes = {c.name: c.gpus for c in roce_classes(a100)}
    assert gpus_in_set(a100, classes, range(8), (f"{R}1", f"{R}2"), 4) == (0, 1, 2, 3)
    assert gpus_in_set(a100, classes, [0, 2, 3, 4, 5], (f"{R}1", f"{R}2"), 4) is None  # class 1 has one free
    assert gpus_in_set(a100, classes, range(8), (f"{R}1", f"{R}3"), 2) == (0, 4)
    for stem in (DGX1, ONEFLOW):
        quads = parse_dump(read_fixture(stem))
        classes = {c.name: c.gpus for c in roce_classes(quads)}
        assert gpus_in_set(quads, classes, range(8), (f"{R}2",), 4) == (4, 5, 6, 7)
        rail_aligned = gpus_in_set(quads, classes, range(8), (f"{R}1", f"{R}2"), 4)
        assert rail_aligned is not None and sum(g < 4 for g in rail_aligned) == 2
