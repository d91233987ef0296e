"""Cluster-aware victim choice (docs/design.md#cluster-eviction): versions other nodes hold go
first, most copies first, then LRU; the cluster's last copy only when nothing else frees enough.
The 1.2x target and the in-use / fetching protection stay as test_eviction.py checks them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsagent.policy.eviction import Candidate, eviction_order, lru_order, needed_bytes, plan_for_fetch

D = "0" * 32


def c(
    name: str, size: int, last_used: float, copies: int | None, *, in_use: bool = False, fetching: bool = False
) -> Candidate:
    return Candidate(name, D, size, last_used, in_use=in_use, fetching=fetching, copies=copies)


def test_a_replicated_version_goes_before_an_older_last_copy() -> None:
    # plain LRU would take "last" (older); the cluster still has "shared" on two other nodes
    plan = plan_for_fetch([c("last", 60, 1, 0), c("shared", 60, 5, 2)], size=50, free=0)
    assert [v.name for v in plan.victims] == ["shared"]


def test_more_copies_elsewhere_go_first_then_lru_within_a_count() -> None:
    order = eviction_order(
        [c("two-old", 10, 1, 2), c("five", 10, 9, 5), c("two-new", 10, 3, 2), c("none", 10, 0, 0), c("one", 10, 2, 1)]
    )
    assert [v.name for v in order] == ["five", "two-old", "two-new", "one", "none"]


def test_the_last_copy_goes_only_when_the_replicated_ones_cannot_free_enough() -> None:
    candidates = [c("last", 100, 1, 0), c("shared-a", 30, 2, 1), c("shared-b", 30, 3, 3)]
    # 60 replicated bytes reach a target of 60 (size 50 x 1.2): the last copy stays
    assert [v.name for v in plan_for_fetch(candidates, size=50, free=0).victims] == ["shared-b", "shared-a"]
    # a target of 72 needs more than the replicated 60: the last copy goes too, after them
    plan = plan_for_fetch(candidates, size=60, free=0)
    assert [v.name for v in plan.victims] == ["shared-b", "shared-a", "last"]
    assert plan.sufficient


def test_unknown_counts_are_plain_lru_as_before() -> None:
    candidates = [c("new", 30, 3, None), c("old", 30, 1, None), c("mid", 30, 2, None)]
    assert eviction_order(candidates) == lru_order(candidates)
    assert [v.name for v in plan_for_fetch(candidates, size=100, free=70).victims] == ["old", "mid"]


def test_an_unknown_count_ranks_as_a_last_copy_and_nonsense_counts_too() -> None:
    order = eviction_order([c("unknown", 10, 1, None), c("negative", 10, 0, -3), c("shared", 10, 9, 1)])
    assert [v.name for v in order] == ["shared", "negative", "unknown"]


def test_copies_never_override_in_use_or_fetching() -> None:
    candidates = [
        c("busy", 500, 0, 40, in_use=True),
        c("fetching", 500, 0, 40, fetching=True),
        c("last", 50, 1, 0),
    ]
    plan = plan_for_fetch(candidates, size=100, free=70)
    assert [v.name for v in plan.victims] == ["last"]
    assert plan_for_fetch(candidates[:2], size=100, free=70).victims == ()


# -- properties ----------------------------------------------------------------------------

candidate = st.builds(
    Candidate,
    name=st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "h"]),
    digest=st.sampled_from([D, "1" * 32, "2" * 32]),
    size_bytes=st.integers(0, 1000),
    last_used=st.integers(0, 50).map(float),
    in_use=st.booleans(),
    fetching=st.booleans(),
    copies=st.one_of(st.none(), st.integers(-1, 6)),
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    candidates=st.lists(candidate, max_size=10),
    size=st.integers(0, 2000),
    free=st.integers(-500, 2000),
    ratio=st.sampled_from([1.0, 1.2, 1.5]),
)
def test_plan_properties(candidates: list[Candidate], size: int, free: int, ratio: float) -> None:
    plan = plan_for_fetch(candidates, size=size, free=free, ratio=ratio)
    target = needed_bytes(size, ratio)
    victims = list(plan.victims)
    evictable = [x for x in candidates if x.evictable]
    # the 1.2x rule and the protection are unchanged
    assert plan.needed_bytes == target
    assert plan.evictable_bytes == sum(x.size_bytes for x in evictable)
    assert all(v.evictable for v in victims)
    if free >= target or free + plan.evictable_bytes < target:
        assert victims == []
        assert plan.sufficient is (free >= target)
        return
    assert plan.sufficient
    # stops as soon as the target is reached: without the last victim it was not
    assert free + plan.freed_bytes - victims[-1].size_bytes < target
    # victims are a prefix of the order: more copies elsewhere first, LRU within a count
    order = eviction_order(candidates)
    assert victims == order[: len(victims)]
    ranks = [(-v.other_copies, v.last_used) for v in victims]
    assert ranks == sorted(ranks)
    # a last copy goes only when every replicated candidate could not reach the target alone
    if any(v.other_copies == 0 for v in victims):
        replicated = sum(x.size_bytes for x in evictable if x.other_copies > 0)
        assert free + replicated < target
        assert all(x in victims for x in evictable if x.other_copies > 0)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(candidates=st.lists(candidate, max_size=10), size=st.integers(0, 2000), free=st.integers(-500, 2000))
def test_without_counts_the_plan_is_the_lru_plan(candidates: list[Candidate], size: int, free: int) -> None:
    blind = [Candidate(x.name, x.digest, x.size_bytes, x.last_used, x.in_use, x.fetching) for x in candidates]
    plan = plan_for_fetch(blind, size=size, free=free)
    lru = lru_order(blind)
    assert list(plan.victims) == lru[: len(plan.victims)]


def test_stripe_shares_go_after_replicated_copies_and_with_last_copies_least_recently_used_first() -> None:
    """docs/design-striping.md#eviction: a share is the only copy of its bundles, as a last
    copy is of its version; whichever was used least recently goes first."""
    from dsagent.policy.eviction import idle_victims, unused_victims

    share = Candidate("big", D, 30, 9.0, striped=True)
    busy_share = Candidate("busier", D, 30, 0.0, striped=True, fetching=True)  # being filled or read
    candidates = [c("last", 30, 0, 0), share, c("shared", 30, 5, 1), busy_share]
    assert [v.name for v in eviction_order(candidates)] == ["shared", "last", "big"]
    assert [v.name for v in plan_for_fetch(candidates, size=40, free=0).victims] == ["shared", "last"]
    assert [v.name for v in plan_for_fetch(candidates, size=20, free=0).victims] == ["shared"]
    # a share of a version other nodes hold whole is no only copy: it goes with those copies
    held = Candidate("big", D, 30, 9.0, striped=True, copies=1)
    assert [v.name for v in eviction_order([c("last", 30, 0, 0), held, c("shared", 30, 5, 2)])] == [
        "shared", "big", "last",
    ]  # fmt: skip
    # a share used longer ago than the last copy goes before it
    older = Candidate("big", D, 30, -1.0, striped=True)
    assert [v.name for v in eviction_order([c("last", 30, 0, 0), older, c("shared", 30, 5, 1)])] == [
        "shared", "big", "last",
    ]  # fmt: skip
    # shares have leases of their own: neither the idle sweep nor --all-unused takes them
    assert share not in idle_victims(candidates, now=1e9, idle_ttl=1)
    assert share not in unused_victims(candidates)
    # a whole copy kept with no lease after its group let it go is a copy like any
    kept = Candidate("kept", D, 30, 9.0, striped=True, kept=True)
    assert kept in idle_victims([*candidates, kept], now=1e9, idle_ttl=1)
    assert kept in unused_victims([*candidates, kept])
    assert kept not in idle_victims([*candidates, kept], now=10.0, idle_ttl=5)  # used 1 s ago


def test_a_share_holding_every_bundle_ranks_as_a_whole_copy() -> None:
    """A whole copy kept as a share goes with the replicated copies when the cluster holds
    another, with the last copies when it does not, and never while in use."""
    whole = Candidate("kept", D, 30, 1.0, striped=True, copies=1)
    share = Candidate("big", D, 30, 9.0, striped=True)
    assert [v.name for v in eviction_order([share, whole, c("last", 30, 0, 0)])] == ["kept", "last", "big"]
    alone = Candidate("kept", D, 30, 3.0, striped=True, copies=0)
    assert [v.name for v in eviction_order([share, alone, c("last", 30, 2, 0)])] == ["last", "kept", "big"]
    assert eviction_order([Candidate("kept", D, 30, 1.0, striped=True, copies=3, fetching=True)]) == []
