"""The stripe group's members: pure functions (how shares are ordered for eviction is
tested with the eviction rule, tests/dsagent/policy/test_eviction.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dsagent.policy.stripegroup import Candidate, choose_group

TB = 10**12


def _members(*args: Any, **kwargs: Any) -> list[str]:
    """The members :func:`choose_group` picks, in order (every node here owns a share)."""
    group = choose_group(*args, **kwargs)
    assert group.no_share == []
    return group.members


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
    chosen = _members(group, size_bytes=6 * TB, job_nodes=["e"], members=4)
    # e (the job's, even without room), b (holds bundles), then room in e's subnet s1: c, then a/f
    assert chosen[:3] == ["e", "b", "c"] and chosen[3] in ("a", "f") and len(chosen) == 4


def test_every_node_of_the_job_is_a_member_even_past_the_size_rule() -> None:
    # the size rule asks for 2 members; the job runs on 5 nodes: each needs a share to read
    # through (its agent serves it the rest), so the group has all 5, the job's first
    job = ["e", "a", "f", "d", "c"]
    chosen = _members(_nodes(), size_bytes=6 * TB, job_nodes=job, members=2)
    assert chosen == job
    assert _members(_nodes(), size_bytes=6 * TB, job_nodes=["a", "gone"], members=1) == ["a"]  # only nodes seen
    # the members it asks for still count when the job has fewer nodes
    assert len(_members(_nodes(), size_bytes=6 * TB, job_nodes=["e"], members=4)) == 4


def test_a_holder_is_taken_first_where_no_job_runs() -> None:
    assert _members(_nodes(), size_bytes=1 * TB, members=1) == ["b"]  # the holder moves nothing


def test_members_chosen_before_stay_and_nodes_without_room_are_left_out() -> None:
    chosen = _members(_nodes(), size_bytes=6 * TB, before=["d", "a"], members=3)
    assert chosen[:2] == ["a", "d"] or chosen[:2] == ["d", "a"]
    assert "e" not in _members(_nodes(), size_bytes=6 * TB, members=5)  # 10 bytes free, not the job's
    assert _members([], size_bytes=1, members=1) == []


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
    assert _members(filling, size_bytes=6 * TB, before=["a", "d", "c"], members=3) == ["a", "d", "c"]
    assert _members(filling, size_bytes=6 * TB, before=["a", "d", "c"], job_nodes=["f"], members=4) == [
        "a", "d", "c", "f",
    ]  # fmt: skip
    # shrinking keeps the members holding most, still in their earlier order
    assert _members(filling, size_bytes=6 * TB, before=["a", "d", "c"], members=2) == ["d", "c"]


def test_another_subnet_fills_in_only_when_the_first_has_too_few() -> None:
    nodes = [
        Candidate("a", 4 * TB, subnet="s1"),
        Candidate("b", 4 * TB, subnet="s2"),
        Candidate("c", 3 * TB, subnet="s1"),
    ]
    assert _members(nodes, size_bytes=TB, job_nodes=["a"], members=2) == ["a", "c"]
    assert _members(nodes, size_bytes=TB, job_nodes=["a"], members=3) == ["a", "c", "b"]


def _job_node_without_room() -> list[Candidate]:
    """e is the job's: 10 bytes free and all the rest last copies (spare 10); a, c, f have room."""
    return [
        Candidate("a", free_bytes=3 * TB, spare_bytes=3 * TB, subnet="s1", cache_bytes=4 * TB),
        Candidate("c", free_bytes=4 * TB, spare_bytes=4 * TB, subnet="s1", cache_bytes=4 * TB),
        Candidate("e", free_bytes=10, spare_bytes=10, subnet="s1", cache_bytes=4 * TB),
        Candidate("f", free_bytes=1 * TB, spare_bytes=3 * TB, subnet="s1", cache_bytes=4 * TB),
    ]


def test_a_job_node_that_would_evict_a_last_copy_joins_without_a_share() -> None:
    group = choose_group(_job_node_without_room(), size_bytes=6 * TB, job_nodes=["e"], members=3)
    # e is a member (its pods read through its window) but owns nothing; three others own
    assert group.no_share == ["e"] and group.members[0] == "e"
    assert len(group.members) == 4 and {"a", "c", "f"} <= set(group.members)
    # f counts its replicated copies as room (spare 3 TB against a 2.4 TB share): it owns
    # with room to make, a job node with spare room owns too
    roomy = [Candidate("e", free_bytes=10, spare_bytes=3 * TB, subnet="s1", cache_bytes=4 * TB),
             *_job_node_without_room()[:2]]  # fmt: skip
    assert choose_group(roomy, size_bytes=6 * TB, job_nodes=["e"], members=3).no_share == []
    # a node of the job that holds bytes of the version already keeps owning them
    holder = [replace(n, held_bytes=TB) if n.name == "e" else n for n in _job_node_without_room()]
    assert choose_group(holder, size_bytes=6 * TB, job_nodes=["e"], members=3).no_share == []
    # unknown room (an older agent's inventory): taken as enough, as before
    unknown = [replace(n, spare_bytes=None) for n in _job_node_without_room()]
    assert choose_group(unknown, size_bytes=6 * TB, job_nodes=["e"], members=3).no_share == []
    # a member whose agent would refuse shareless members (an earlier release): all own
    for earlier in group.members:
        mixed = [replace(n, takes_no_share=n.name != earlier) for n in _job_node_without_room()]
        again = choose_group(mixed, size_bytes=6 * TB, job_nodes=["e"], members=3)
        assert again.no_share == [] and again.members[0] == "e"
    # one outside the group (no room) may be of any release
    outside = [*_job_node_without_room(), Candidate("g", free_bytes=0, spare_bytes=0, takes_no_share=False)]
    assert choose_group(outside, size_bytes=6 * TB, job_nodes=["e"], members=3) == group


def test_a_member_keeps_its_part_while_it_stays_and_someone_always_owns() -> None:
    nodes = _job_node_without_room()
    first = choose_group(nodes, size_bytes=6 * TB, job_nodes=["e"], members=3)
    # room freed on e later: it stays without a share (a change would move bundles for nothing)
    freed = [replace(n, spare_bytes=4 * TB) if n.name == "e" else n for n in nodes]
    again = choose_group(freed, size_bytes=6 * TB, job_nodes=["e"], before=first.members,
                         no_share_before=first.no_share, members=3)  # fmt: skip
    assert again == first
    # and an owner stays an owner though its room is gone
    owner = first.members[1]
    full = [replace(n, spare_bytes=0) if n.name == owner else n for n in nodes]
    assert owner not in choose_group(full, size_bytes=6 * TB, job_nodes=["e"], before=first.members,
                                     no_share_before=first.no_share, members=3).no_share  # fmt: skip
    # only the job's node exists: it owns, whatever its room
    alone = choose_group(nodes[2:3], size_bytes=6 * TB, job_nodes=["e"], members=3)
    assert alone == (["e"], [])


def test_a_job_node_owns_after_all_when_too_few_others_have_room() -> None:
    # e is short of room; in its place two owners would hold 3.6 TB each, which only c has
    # room for: the group is chosen as before, e with a share, a third of the version each
    nodes = [n for n in _job_node_without_room() if n.name in ("a", "c", "e")]
    group = choose_group(nodes, size_bytes=6 * TB, job_nodes=["e"], members=3)
    assert group == (["e", "c", "a"], [])


def test_where_too_few_have_room_without_a_last_copy_nodes_whose_cache_can_hold_a_share_own() -> None:
    # a 6 TB version wants four owners (1.8 TB each with the headroom) on 4 TB caches full of
    # last copies: only a has 3 TB of room without evicting one. Without the others the
    # version would have one owner, whose agent refuses a 6 TB share (its bundles then read
    # from the store every epoch); the nodes whose caches can hold a share own too, the most
    # room first, and their agents evict for it
    nodes = [
        Candidate("a", free_bytes=3 * TB, spare_bytes=3 * TB, subnet="s1", cache_bytes=4 * TB),
        *(Candidate(n, free_bytes=free, spare_bytes=free, subnet="s1", cache_bytes=4 * TB)
          for n, free in (("b", 10), ("c", TB // 2), ("d", TB))),
        Candidate("small", free_bytes=TB, spare_bytes=TB, subnet="s1", cache_bytes=TB),  # 1 TB: no 1.8 TB share
    ]  # fmt: skip
    assert _members(nodes, size_bytes=6 * TB, job_nodes=["a"], members=4) == ["a", "d", "c", "b"]
    # one whose cache its pods' data holds (no eviction frees it) is not asked for a share it
    # would refuse
    busy = [replace(n, in_use_bytes=3 * TB) if n.name == "c" else n for n in nodes]
    assert _members(busy, size_bytes=6 * TB, job_nodes=["a"], members=4) == ["a", "d", "b"]
    # where enough have room, no last copy is evicted for the group
    roomy = [replace(n, free_bytes=2 * TB, spare_bytes=2 * TB) if n.name in ("b", "c", "d") else n for n in nodes]
    assert _members(roomy, size_bytes=6 * TB, job_nodes=["a"], members=3) == ["a", "b", "c"]
    # a job node with no room but by evicting a last copy is not spared its share where the
    # others would have to evict theirs in its place: it owns, beside them
    spared = [replace(n, spare_bytes=10, free_bytes=10) if n.name == "a" else n for n in nodes]
    group = choose_group(spared, size_bytes=6 * TB, job_nodes=["a"], members=4)
    assert group.no_share == [] and group.members[0] == "a" and len(group.members) == 4


def test_where_too_few_can_own_and_their_shares_would_not_fit_a_cache_more_own_smaller_shares() -> None:
    # an 8 TB version wants 39 owners on 500 GB caches (1.2 x 8 TB / (0.5 x 500 GB)), each
    # with 246 GB of room; the job's two nodes and most others hold their pods' data, and only
    # four others have that room. Six owners would each be asked for 1.6 TB, which no cache
    # can hold: refused for good, every epoch read from the store. More nodes own, as few as
    # have room beside their pods' data for a share each, the most room first
    gb = 10**9
    room = [50, 50, *([250] * 4), *([200] * 50), *([20] * 8)]
    busy = [
        Candidate(f"n{i:02}", free_bytes=0, spare_bytes=0, cache_bytes=500 * gb, in_use_bytes=(500 - r) * gb)
        for i, r in enumerate(room)
    ]
    group = choose_group(busy, size_bytes=8 * TB, job_nodes=["n00", "n01"], members=39)
    assert group.no_share == [] and group.members[:6] == ["n00", "n01", "n02", "n03", "n04", "n05"]
    # 9.6 TB over 48 owners is 200 GB each, what the 42 nodes added have beside their pods' data
    assert len(group.members) == 48 and all(room[int(n[1:])] == 200 for n in group.members[6:])
    # a Dataset's own count stands: no more owners than it asks for, whatever their shares
    fixed = choose_group(busy, size_bytes=8 * TB, job_nodes=["n00", "n01"], members=39, fixed=True)
    assert fixed.members == ["n00", "n01", "n02", "n03", "n04", "n05"]
    # where no number of nodes has the room now, the rule's count owns, the most room first:
    # shares that fit a cache, refused only while their nodes' pods fill it
    full = [replace(n, in_use_bytes=490 * gb) if n.name not in ("n00", "n01") else n for n in busy]
    group = choose_group(full, size_bytes=8 * TB, job_nodes=["n00", "n01"], members=39)
    assert len(group.members) == 39 and group.no_share == []
    # where shares would fit the caches but more nodes have room now for smaller ones, those
    # own too: 1.8 TB over 9 owners is 200 GB each (the rule's 8 would ask 225 GB)
    group = choose_group(busy, size_bytes=1500 * gb, job_nodes=["n00", "n01"], members=8)
    assert len(group.members) == 9 and all(room[int(n[1:])] == 200 for n in group.members[6:])
    # where no number of nodes has the room now and the shares fit a cache, the owners found
    # stay, however busy they are now
    few = [n for n in busy if room[int(n.name[1:])] in (50, 20)]
    assert choose_group(few, size_bytes=600 * gb, job_nodes=["n00", "n01"], members=4).members == ["n00", "n01"]
