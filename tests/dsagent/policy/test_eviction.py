"""The pure victim choice: the 1.2x target of docs/design.md#eviction, LRU order, in-use and
fetching protection, and the classes that order copies and stripe shares
(docs/design-striping.md#eviction)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dsagent.policy import eviction
from dsagent.policy.eviction import (
    EVICT_RATIO,
    Candidate,
    idle_victims,
    lru_order,
    needed_bytes,
    plan_for_fetch,
    unused_victims,
)
from tests.conftest import REPO_ROOT

PRODUCT_PACKAGES = ("dsplatform", "dsagent", "scheduler_plugin", "scheduling", "gpu_topology")

D = "0" * 32


def c(name: str, size: int, last_used: float, *, in_use: bool = False, fetching: bool = False) -> Candidate:
    return Candidate(name, D, size, last_used, in_use=in_use, fetching=fetching)


@pytest.mark.parametrize(
    ("size", "ratio", "expected"),
    [(100, 1.2, 120), (1, 1.2, 2), (0, 1.2, 0), (1000, 1.0, 1000), (10, 1.5, 15), (7, 1.2, 9)],
    ids=["plain", "rounds-up", "empty-dataset", "ratio-one", "custom-ratio", "rounds-up-odd"],
)
def test_the_target_is_ratio_times_the_size_rounded_up(size: int, ratio: float, expected: int) -> None:
    assert needed_bytes(size, ratio) == expected


CASES = [
    # id, candidates, size, free, ratio, expected victims, sufficient
    ("enough-free-evicts-nothing", [c("a", 50, 1)], 100, 120, 1.2, [], True),
    ("exactly-at-target-evicts-nothing", [c("a", 50, 1)], 100, 120, 1.2, [], True),
    ("one-below-target-evicts", [c("a", 50, 1)], 100, 119, 1.2, ["a"], True),
    ("oldest-first", [c("new", 30, 3), c("old", 30, 1), c("mid", 30, 2)], 100, 70, 1.2, ["old", "mid"], True),
    ("stops-as-soon-as-target-reached", [c("a", 60, 1), c("b", 60, 2), c("c", 60, 3)], 100, 0, 1.2, ["a", "b"], True),
    ("in-use-never-evicted", [c("busy", 500, 0, in_use=True), c("a", 50, 1)], 100, 70, 1.2, ["a"], True),
    ("fetching-never-evicted", [c("f", 500, 0, fetching=True), c("a", 50, 1)], 100, 70, 1.2, ["a"], True),
    ("not-enough-evicts-nothing", [c("a", 10, 1), c("busy", 500, 0, in_use=True)], 100, 50, 1.2, [], False),
    ("only-in-use-left", [c("busy", 500, 0, in_use=True)], 100, 0, 1.2, [], False),
    ("ratio-one-needs-exact-size", [c("a", 20, 1), c("b", 20, 2)], 100, 80, 1.0, ["a"], True),
    ("ratio-one-point-five", [c("a", 20, 1), c("b", 20, 2), c("c", 20, 3)], 100, 110, 1.5, ["a", "b"], True),
    ("negative-free-after-reservations", [c("a", 100, 1), c("b", 100, 2)], 50, -40, 1.2, ["a"], True),
    ("tie-in-time-evicts-larger-first", [c("small", 10, 1), c("large", 90, 1)], 100, 40, 1.2, ["large"], True),
    ("empty-cache-and-no-space", [], 100, 10, 1.2, [], False),
    ("zero-size-dataset-fits", [c("a", 10, 1)], 0, 0, 1.2, [], True),
]


@pytest.mark.parametrize(
    ("candidates", "size", "free", "ratio", "victims", "sufficient"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_victims_are_lru_unused_datasets_until_free_reaches_the_target(
    candidates: list[Candidate], size: int, free: int, ratio: float, victims: list[str], sufficient: bool
) -> None:
    plan = plan_for_fetch(candidates, size=size, free=free, ratio=ratio)
    assert [v.name for v in plan.victims] == victims
    assert plan.sufficient is sufficient
    assert plan.needed_bytes == needed_bytes(size, ratio)
    assert plan.evictable_bytes == sum(x.size_bytes for x in candidates if x.evictable)


def test_an_insufficient_plan_reports_the_numbers() -> None:
    plan = plan_for_fetch([c("a", 30, 1), c("b", 999, 2, in_use=True)], size=1000, free=100, ratio=1.2)
    assert (plan.needed_bytes, plan.free_bytes, plan.evictable_bytes, plan.victims) == (1200, 100, 30, ())


def test_datasets_in_use_are_never_evicted_whatever_the_pressure() -> None:
    candidates = [c(f"busy{i}", 100, i, in_use=True) for i in range(5)] + [c(f"free{i}", 100, 10 + i) for i in range(5)]
    for free in range(-1000, 1000, 37):
        plan = plan_for_fetch(candidates, size=800, free=free)
        assert all(not v.in_use for v in plan.victims)


@pytest.mark.parametrize(
    ("last_used", "now", "ttl", "evicted"),
    [(0, 100, 50, True), (60, 100, 50, False), (50, 100, 50, False), (0, 100, 0, False)],
    ids=["idle-past-ttl", "recently-used", "exactly-at-ttl-stays", "zero-ttl-disables"],
)
def test_idle_datasets_are_evicted_after_the_idle_ttl(last_used: float, now: float, ttl: float, evicted: bool) -> None:
    victims = idle_victims([c("a", 10, last_used), c("busy", 10, 0, in_use=True)], now=now, idle_ttl=ttl)
    assert [v.name for v in victims] == (["a"] if evicted else [])


def test_all_unused_lists_every_evictable_dataset_oldest_first() -> None:
    victims = unused_victims([c("b", 1, 2), c("a", 1, 1), c("busy", 1, 0, in_use=True), c("f", 1, 0, fetching=True)])
    assert [v.name for v in victims] == ["a", "b"]
    assert lru_order([]) == []


def test_the_ratio_is_written_once_in_the_product() -> None:
    # every rule that needs the factor refers to EVICT_RATIO: a second literal would drift from it
    found = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_bytes(), filename=str(path))
            found += [
                f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and type(node.value) is float and node.value == EVICT_RATIO
            ]
    assert eviction.__file__ is not None
    defined = str(Path(eviction.__file__).resolve().relative_to(REPO_ROOT))
    assert [place for place in found if not place.startswith(f"{defined}:")] == []
    assert len(found) == 1, found


def _class(*, striped: bool, other_copies: int | None) -> int:
    return eviction.eviction_class(Candidate("", "", 0, 0.0, copies=other_copies, striped=striped))


def _order(candidates: list[tuple[str, bool, int | None, float]]) -> list[str]:
    """Names of ``(name, striped, other_copies, last_used)`` candidates in the agent's order."""
    return [
        c.name
        for c in eviction.eviction_order(
            Candidate(name, "", 0, last_used, copies=copies, striped=striped)
            for name, striped, copies, last_used in candidates
        )
    ]


def test_eviction_gives_back_replicated_copies_then_shares_and_last_copies_least_recently_used_first() -> None:
    assert _class(striped=False, other_copies=2) == eviction.REPLICATED
    assert _class(striped=True, other_copies=None) == eviction.LAST_COPY  # the only copy of its bundles
    assert _class(striped=True, other_copies=1) == eviction.REPLICATED  # its version is held whole elsewhere
    assert _class(striped=False, other_copies=0) == eviction.LAST_COPY
    assert _class(striped=False, other_copies=None) == eviction.LAST_COPY  # unknown: the safe side
    order = _order(
        [("last", False, 0, 1.0), ("share-c", True, None, 5.0), ("rep", False, 3, 9.0), ("share-b", True, 1, 2.0)]
    )
    assert order == ["rep", "share-b", "last", "share-c"]
