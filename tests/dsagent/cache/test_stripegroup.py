"""The stripe group's members and the eviction order of striped shares: pure functions."""

from __future__ import annotations

from dsagent.cache.stripegroup import (
    LAST_COPY,
    REPLICATED,
    STRIPE_SHARE,
    Candidate,
    choose_group,
    eviction_class,
    eviction_order,
)

TB = 10**12


def _nodes() -> list[Candidate]:
    return [
        Candidate("a", free_bytes=3 * TB, subnet="s1", cache_bytes=4 * TB),
        Candidate("b", free_bytes=1 * TB, held_bytes=2 * TB, subnet="s2", cache_bytes=4 * TB),
        Candidate("c", free_bytes=4 * TB, subnet="s1", cache_bytes=4 * TB),
        Candidate("d", free_bytes=4 * TB, subnet="s2", cache_bytes=4 * TB),
        Candidate("e", free_bytes=10, subnet="s1", cache_bytes=4 * TB),
        Candidate("f", free_bytes=3 * TB, subnet="s1", cache_bytes=4 * TB),
    ]


def test_the_jobs_nodes_then_holders_then_room_in_the_same_subnet() -> None:
    group = _nodes()
    chosen = choose_group(group, size_bytes=6 * TB, job_nodes=["e"], members=4)
    # e (the job's, even without room), b (holds bundles), then room in e's subnet s1: c, then a/f
    assert chosen[:3] == ["e", "b", "c"] and chosen[3] in ("a", "f") and len(chosen) == 4


def test_every_node_of_the_job_is_a_member_even_past_the_size_rule() -> None:
    # the size rule asks for 2 members; the job runs on 5 nodes: each needs a share to read
    # through (its agent serves it the rest), so the group has all 5, the job's first
    job = ["e", "a", "f", "d", "c"]
    chosen = choose_group(_nodes(), size_bytes=6 * TB, job_nodes=job, members=2)
    assert chosen == job
    assert choose_group(_nodes(), size_bytes=6 * TB, job_nodes=["a", "gone"], members=1) == ["a"]  # only nodes seen
    # the members it asks for still count when the job has fewer nodes
    assert len(choose_group(_nodes(), size_bytes=6 * TB, job_nodes=["e"], members=4)) == 4


def test_the_size_comes_from_the_budget_and_the_smallest_cache() -> None:
    chosen = choose_group(_nodes(), size_bytes=6 * TB)  # ceil(1.2 * 6 / (0.5 * 4)) = 4
    assert len(chosen) == 4
    assert choose_group(_nodes(), size_bytes=1 * TB, members=1) == ["b"]  # the holder moves nothing


def test_members_chosen_before_stay_and_nodes_without_room_are_left_out() -> None:
    chosen = choose_group(_nodes(), size_bytes=6 * TB, before=["d", "a"], members=3)
    assert chosen[:2] == ["a", "d"] or chosen[:2] == ["d", "a"]
    assert "e" not in choose_group(_nodes(), size_bytes=6 * TB, members=6)  # 10 bytes free, not the job's
    assert choose_group([], size_bytes=1) == []


def test_members_keep_their_order_while_their_shares_fill() -> None:
    # a pass saw the group [a, d, c] with nothing held; now d and c hold more than a: the list
    # stays as it was (a reordered list is a new group to the agents, and moves the readers'
    # buckets), and a new member comes after the earlier ones
    filling = [
        Candidate("a", free_bytes=3 * TB, held_bytes=1, subnet="s1", cache_bytes=4 * TB),
        Candidate("c", free_bytes=2 * TB, held_bytes=2 * TB, subnet="s1", cache_bytes=4 * TB),
        Candidate("d", free_bytes=2 * TB, held_bytes=2 * TB, subnet="s1", cache_bytes=4 * TB),
        Candidate("f", free_bytes=3 * TB, subnet="s1", cache_bytes=4 * TB),
    ]
    assert choose_group(filling, size_bytes=6 * TB, before=["a", "d", "c"], members=3) == ["a", "d", "c"]
    assert choose_group(filling, size_bytes=6 * TB, before=["a", "d", "c"], job_nodes=["f"], members=4) == [
        "a", "d", "c", "f",
    ]  # fmt: skip
    # shrinking keeps the members holding most, still in their earlier order
    assert choose_group(filling, size_bytes=6 * TB, before=["a", "d", "c"], members=2) == ["d", "c"]


def test_another_subnet_fills_in_only_when_the_first_has_too_few() -> None:
    nodes = [
        Candidate("a", 4 * TB, subnet="s1"),
        Candidate("b", 4 * TB, subnet="s2"),
        Candidate("c", 3 * TB, subnet="s1"),
    ]
    assert choose_group(nodes, size_bytes=TB, job_nodes=["a"], members=2) == ["a", "c"]
    assert choose_group(nodes, size_bytes=TB, job_nodes=["a"], members=3) == ["a", "c", "b"]


def test_eviction_gives_back_replicated_copies_then_stripe_shares_then_last_copies() -> None:
    assert eviction_class(striped=False, other_copies=2) == REPLICATED
    assert eviction_class(striped=True, other_copies=None) == STRIPE_SHARE
    assert eviction_class(striped=False, other_copies=0) == LAST_COPY
    assert eviction_class(striped=False, other_copies=None) == LAST_COPY  # unknown: the safe side
    order = eviction_order(
        [("last", False, 0, 1.0), ("share-c", True, None, 5.0), ("rep", False, 3, 9.0), ("share-b", True, 1, 2.0)]
    )
    assert order == ["rep", "share-b", "share-c", "last"]
