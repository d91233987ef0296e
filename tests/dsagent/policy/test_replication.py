"""Replication of hot data, the pure part (docs/design.md#replication): the target from the
demand, and where the copies go."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsagent.policy.replication import AUTO, NodeRoom, Ranked, choose, choose_ranked, parse_mode, target

GB = 10**9


def test_modes_are_auto_or_a_bounded_number() -> None:
    assert parse_mode("auto") == AUTO and parse_mode(3) == 3 and parse_mode(0) == 0
    for hostile in ("AUTO", "3", -1, 10_001, True, None, 2.5, {"n": 1}):
        assert parse_mode(hostile) is None


def test_auto_follows_the_demand_up_and_down_within_its_cap() -> None:
    assert [target(AUTO, d, max_auto=4) for d in (0, 1, 3, 9, 2, 0)] == [0, 1, 3, 4, 2, 0]
    assert target(5, 0, max_auto=1) == 5  # a number is taken as given


def test_holders_first_then_room_and_free_gpus() -> None:
    nodes = [
        NodeRoom("full", holds_ready=False, free_bytes=1 * GB, free_gpus=8),  # no room for 10 GB x 1.2
        NodeRoom("busy", holds_ready=False, free_bytes=100 * GB, free_gpus=0),  # no GPU for a pod
        NodeRoom("roomy", holds_ready=False, free_bytes=50 * GB, free_gpus=2),
        NodeRoom("idle", holds_ready=False, free_bytes=20 * GB, free_gpus=8),
        NodeRoom("holder", holds_ready=True, free_bytes=0, free_gpus=0),
    ]
    assert choose(nodes, 1, size_bytes=10 * GB) == ["holder"]
    assert choose(nodes, 2, size_bytes=10 * GB) == ["holder", "idle"]
    assert choose(nodes, 5, size_bytes=10 * GB) == ["holder", "idle", "roomy"]  # the others never qualify
    # a node chosen before keeps its place while its copy arrives (no room left meanwhile)
    assert choose(nodes, 2, size_bytes=10 * GB, before=["full"]) == ["full", "holder"]


rooms = st.lists(
    st.builds(
        NodeRoom,
        name=st.sampled_from([f"n{i}" for i in range(8)]),
        holds_ready=st.booleans(),
        free_bytes=st.integers(0, 100),
        free_gpus=st.integers(0, 8),
    ),
    max_size=8,
    unique_by=lambda n: n.name,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(nodes=rooms, wanted=st.integers(0, 10), size=st.integers(0, 80), before=st.lists(st.sampled_from(["n0", "n3"])))
def test_choice_properties(nodes: list[NodeRoom], wanted: int, size: int, before: list[str]) -> None:
    chosen = choose(nodes, wanted, size_bytes=size, before=before)
    by_name = {n.name: n for n in nodes}
    assert chosen == sorted(set(chosen)) and len(chosen) <= wanted
    for name in chosen:
        n = by_name[name]
        assert n.holds_ready or name in before or (n.free_bytes >= math.ceil(size * 1.2) and n.free_gpus > 0)
    holders = [n.name for n in nodes if n.holds_ready]
    if len(holders) >= wanted:
        assert set(chosen) <= set(holders)  # no transfer while holders suffice
    else:
        assert set(holders) <= set(chosen)


def test_rooms_ranked_once_give_the_same_choice_reading_only_what_they_pick() -> None:
    rooms = [NodeRoom(f"n{i}", False, (i % 7) * GB, i % 4) for i in range(2000)]
    ranked = Ranked(rooms)
    asked: list[str] = []

    def admit(node: str) -> bool:
        asked.append(node)
        return True

    chosen = choose_ranked(ranked, {"n5"}, 3, size_bytes=GB, before=["n9"], admit=admit)
    holding = [NodeRoom(n.name, n.name == "n5", n.free_bytes, n.free_gpus) for n in rooms]
    assert chosen == choose(holding, 3, size_bytes=GB, before=["n9"])
    assert len(asked) == 3  # the holder, the earlier pick, then the first with room: no walk of the rest
    closed_after: list[str] = []

    def refuse(node: str) -> bool:
        closed_after.append(node)
        return False

    assert choose_ranked(ranked, (), 2, size_bytes=0, admit=refuse, closed=lambda: True) == []
    assert len(closed_after) == 1  # a bound no node can pass: one refusal ends the walk


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    nodes=rooms,
    wanted=st.integers(0, 10),
    size=st.integers(0, 80),
    before=st.lists(st.sampled_from(["n0", "n3", "n9"])),
    refused=st.sets(st.sampled_from([f"n{i}" for i in range(8)])),
    budget=st.integers(0, 8),
)
def test_ranked_choice_is_choose(
    nodes: list[NodeRoom], wanted: int, size: int, before: list[str], refused: set[str], budget: int
) -> None:
    """Over the same rooms, :func:`choose_ranked` picks what :func:`choose` picks, asking the
    admitter the same nodes in the same order (it refuses some nodes, and all once ``budget``
    are admitted: then ``closed`` ends the ranked walk early, with the same picks)."""

    def admitter() -> tuple[list[str], Any, Any]:
        asked: list[str] = []
        picked: list[str] = []

        def admit(node: str) -> bool:
            asked.append(node)
            if node in refused or len(picked) >= budget:
                return False
            picked.append(node)
            return True

        return asked, admit, lambda: len(picked) >= budget

    asked_a, admit_a, _ = admitter()
    expected = choose(nodes, wanted, size_bytes=size, before=before, admit=admit_a)
    asked_b, admit_b, closed_b = admitter()
    holding = {n.name for n in nodes if n.holds_ready}
    got = choose_ranked(Ranked(nodes), holding, wanted, size_bytes=size, before=before, admit=admit_b, closed=closed_b)
    assert got == expected
    assert asked_b == asked_a[: len(asked_b)]  # the same order, cut short once nothing more can be admitted
    if len(asked_b) < len(asked_a):
        assert closed_b()
