"""How a version is held: whole where it fits a node, shares over the job's nodes where not."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from dsagent.policy.holding import (
    SHARE,
    WHOLE,
    WINDOW_MEMBERS,
    choose_placement,
    holding,
    members_wanted,
    worth_whole,
)
from dsagent.policy.stripegroup import Candidate, Candidates, choose_group

TB = 10**12


def test_a_version_that_fits_a_node_with_room_is_held_whole() -> None:
    assert holding(3 * TB, cache_bytes=4 * TB) is WHOLE  # 1.2 x 3 = 3.6 <= 4
    assert holding(4 * TB, cache_bytes=4 * TB) is SHARE  # 4.8 > 4: the headroom counts
    assert holding(3 * TB, cache_bytes=4 * TB, room_bytes=3 * TB) is SHARE  # no room without a last copy
    assert holding(3 * TB, cache_bytes=4 * TB, room_bytes=int(3.6 * TB)) is WHOLE
    assert holding(1, cache_bytes=0) is SHARE  # a cache of unknown size is not taken as fitting


@pytest.mark.parametrize(
    ("size", "cache", "job", "want"),
    [
        (3 * TB, 4 * TB, 4, 4),  # the job's nodes: each rank reads its own node's share
        (6 * TB, 4 * TB, 2, 4),  # ceil(1.2 x 6 / (0.5 x 4)) = 4: the job's 2 are too few
        (6 * TB, 4 * TB, 8, 8),
        (1, 4 * TB, 0, 1),
        (1, 0, 0, 1),
    ],
)
def test_the_group_is_the_jobs_nodes_unless_they_are_too_few(size: int, cache: int, job: int, want: int) -> None:
    assert members_wanted(size, cache, job) == want


def _subnet(n: int, *, free: int = 4 * TB, cache: int = 4 * TB) -> list[Candidate]:
    return [Candidate(f"n{i}", free_bytes=free, subnet="s1", cache_bytes=cache) for i in range(n)]


def test_a_fitting_version_is_whole_on_each_job_node_and_the_group_is_the_job() -> None:
    placement = choose_placement(_subnet(16), size_bytes=TB, job_nodes=["n3", "n7"])
    assert placement.members == ["n3", "n7"]  # not spread over the subnet's 16 nodes
    assert placement.whole == ["n3", "n7"] and placement.no_share == []


def test_a_larger_version_is_shares_over_the_jobs_nodes_first() -> None:
    nodes = _subnet(24)
    job = ["n1", "n2", "n5", "n9"]
    placement = choose_placement(nodes, size_bytes=6 * TB, job_nodes=job)  # 4 members wanted: the job's 4
    assert placement.members == job and placement.whole == []
    # ceil(14.4 / 2) = 8 wanted: the job's 4 are too few, so the group reaches past them to
    # WINDOW_MEMBERS, and what the job's nodes read through the window comes from 16 uploads
    more = choose_placement(nodes, size_bytes=12 * TB, job_nodes=job)
    assert more.members[:4] == job and len(more.members) == WINDOW_MEMBERS and more.whole == []
    fixed = choose_placement(nodes, size_bytes=12 * TB, job_nodes=job, members=8)
    assert fixed.members[:4] == job and len(fixed.members) == 8  # a Dataset's own count stands


def test_a_one_node_jobs_larger_version_is_spread_over_window_members() -> None:
    """One node cannot hold a version larger than its cache: its group reaches past it
    whatever the budget asks (here 3), to WINDOW_MEMBERS, the job's node first, so that the
    15 parts of every epoch it reads through the window come from 15 uploads, not 2."""
    placement = choose_placement(_subnet(24), size_bytes=5 * TB, job_nodes=["n7"])
    assert members_wanted(5 * TB, 4 * TB, 1) == 3
    assert placement.members[0] == "n7" and len(placement.members) == WINDOW_MEMBERS
    assert placement.no_share == [] and placement.whole == []
    few = choose_placement(_subnet(5), size_bytes=5 * TB, job_nodes=["n0"])
    assert len(few.members) == 5  # as many as there are


def test_a_job_node_without_room_holds_a_share_not_a_whole_copy() -> None:
    nodes = [*_subnet(3), Candidate("busy", free_bytes=10, spare_bytes=10, subnet="s1", cache_bytes=4 * TB)]
    placement = choose_placement(nodes, size_bytes=TB, job_nodes=["n0", "busy"])
    assert placement.whole == ["n0"]
    assert "busy" in placement.members


def test_a_job_node_reading_through_the_window_spreads_its_reads_over_every_whole_copy() -> None:
    # the job runs on one node with 500 GB of room: too little for the 1 TB version whole (1.2 TB).
    # h1 and h2 hold it whole: they join, own their parts without moving a byte and keep the
    # rest, and the roomiest other nodes join too (WINDOW_MEMBERS, here the 7 there are), so
    # its node owns a seventh and reads the rest from six uploads
    version = TB
    copies = [
        Candidate(
            h, free_bytes=TB, held_bytes=version, subnet="s1", cache_bytes=4 * TB, spare_bytes=TB, holds_whole=True
        )
        for h in ("h1", "h2")
    ]
    short = Candidate("job", free_bytes=500 * 10**9, spare_bytes=500 * 10**9, subnet="s1", cache_bytes=4 * TB)
    placement = choose_placement([short, *copies, *_subnet(4)], size_bytes=version, job_nodes=["job"])
    assert placement.members[0] == "job" and set(placement.members[1:3]) == {"h1", "h2"}
    assert sorted(placement.members[3:]) == ["n0", "n1", "n2", "n3"]
    assert placement.no_share == [] and sorted(placement.whole) == ["h1", "h2"]  # they keep it whole
    assert members_wanted(version, 4 * TB, 1, copies=2) == 3
    assert members_wanted(version, 4 * TB, 1, copies=2, through=True) == WINDOW_MEMBERS
    # with room for the whole version the job's node holds it whole: no copy is asked to join
    roomy = Candidate("job", free_bytes=2 * TB, spare_bytes=2 * TB, subnet="s1", cache_bytes=4 * TB)
    alone = choose_placement([roomy, *copies, *_subnet(4)], size_bytes=version, job_nodes=["job"])
    assert alone.members == ["job"] and alone.whole == ["job"]
    # an unpacked ready copy counts as held bytes but holds no bundle: it neither joins as a
    # copy nor is asked to hold the version whole (that would fetch every bundle again)
    unpacked = [replace(c, holds_whole=False) for c in copies]
    plain = choose_placement([short, *unpacked, *_subnet(4)], size_bytes=version, job_nodes=["job"])
    assert plain.whole == [] and len(plain.members) == 7


def test_a_fitting_version_a_job_node_has_no_room_for_is_spread_over_window_members() -> None:
    """A version that fits a node, read through the window because the job's node lacks the
    room: WINDOW_MEMBERS members, the job's node first and then the roomiest, so its reads
    are spread over that many uploads; a version larger than a node keeps the job's nodes."""
    nodes = [
        Candidate("job", free_bytes=200 * 10**9, spare_bytes=200 * 10**9, subnet="s1", cache_bytes=4 * TB),
        *_subnet(24),
    ]
    placement = choose_placement(nodes, size_bytes=TB, job_nodes=["job"])
    assert len(placement.members) == WINDOW_MEMBERS == 16 and placement.members[0] == "job"
    assert placement.whole == [] and placement.no_share == []  # 1.2 TB / 16 fits beside its data
    larger = choose_placement(_subnet(24), size_bytes=6 * TB, job_nodes=["n1", "n2", "n5", "n9"])
    assert larger.members == ["n1", "n2", "n5", "n9"]


def test_a_larger_version_a_job_node_joins_without_a_share_of_is_spread_over_window_members() -> None:
    """A version larger than a node, whose job nodes have no room for their shares (their
    caches hold other versions' last copies): they join without one and read every byte
    through the window, so the group has WINDOW_MEMBERS members, as for a version that fits
    a node read through the window; with room, the job's nodes are the group."""
    full = [Candidate(f"job{i}", free_bytes=0, spare_bytes=0, subnet="s1", cache_bytes=4 * TB) for i in range(2)]
    job = ["job0", "job1"]
    placement = choose_placement([*full, *_subnet(24)], size_bytes=5 * TB, job_nodes=job)
    assert placement.no_share == job and placement.members[:2] == job and placement.whole == []
    assert len(placement.members) == 2 + WINDOW_MEMBERS  # the job's nodes, and 16 owners
    roomy = [replace(c, free_bytes=4 * TB, spare_bytes=4 * TB) for c in full]
    owned = choose_placement([*roomy, *_subnet(24)], size_bytes=5 * TB, job_nodes=job)
    # ceil(1.2 x 5 / (0.5 x 4)) = 3: the job's 2 are too few, so WINDOW_MEMBERS, the job's first
    assert owned.no_share == [] and owned.members[:2] == job and len(owned.members) == WINDOW_MEMBERS
    four = [Candidate(f"job{i}", free_bytes=4 * TB, subnet="s1", cache_bytes=4 * TB) for i in range(4)]
    enough = choose_placement([*four, *_subnet(24)], size_bytes=5 * TB, job_nodes=[f"job{i}" for i in range(4)])
    assert enough.members == [f"job{i}" for i in range(4)]  # with room, enough job nodes are the group
    fixed = choose_placement([*full, *_subnet(24)], size_bytes=5 * TB, job_nodes=job, members=3)
    assert fixed.no_share == job and len(fixed.members) == 2 + 3  # a Dataset's own count stands


def test_a_member_on_a_share_goes_whole_when_room_appears_only_once_its_window_reads_paid_for_it() -> None:
    """Room appeared on "busy", which started on a share of 1 TB holding 250 GB: it lacks
    750 GB and goes whole once its readers took 750 GB through the window, not before."""

    def placed(window: int) -> list[str]:
        busy = Candidate("busy", free_bytes=3 * TB, held_bytes=TB // 4, subnet="s1", cache_bytes=4 * TB,
                         spare_bytes=3 * TB, window_bytes=window)  # fmt: skip
        return choose_placement(
            [*_subnet(3), busy], size_bytes=TB, job_nodes=["n0", "busy"], before=["n0", "busy"],
            share_before=["busy"],
        ).whole  # fmt: skip

    assert placed(0) == ["n0"]
    assert placed(3 * TB // 4 - 1) == ["n0"]
    assert placed(3 * TB // 4) == ["n0", "busy"]


def test_a_new_job_node_and_a_whole_one_need_no_window_reads() -> None:
    """The rule is for members that were on a share: a node joining with the job, and one
    that held the version whole before (or did not answer), are whole wherever it fits and
    room allows."""
    placement = choose_placement(_subnet(4), size_bytes=TB, job_nodes=["n0", "n1"], before=["n0"])
    assert placement.whole == ["n0", "n1"]


@pytest.mark.parametrize(
    ("window", "lacking", "whole"), [(0, 0, True), (10, 11, False), (11, 11, True), (-5, -1, True)]
)
def test_worth_whole_is_the_ski_rental_rule(window: int, lacking: int, whole: bool) -> None:
    assert worth_whole(window, lacking) is whole


def test_a_fixed_member_count_is_kept() -> None:
    placement = choose_placement(_subnet(8), size_bytes=TB, job_nodes=["n0"], members=3)
    assert len(placement.members) == 3 and placement.members[0] == "n0" and placement.whole == ["n0"]


def test_the_group_is_sized_by_the_job_nodes_caches_not_the_smallest_in_the_cluster() -> None:
    # a node with a 100 GB cache elsewhere in the cluster: the 1 TB version fits the job's
    # two 4 TB nodes whole, and no third node is given a share the job would never read
    tiny = Candidate("tiny", free_bytes=100 * 10**9, spare_bytes=100 * 10**9, subnet="s1", cache_bytes=100 * 10**9)
    placement = choose_placement([*_subnet(4), tiny], size_bytes=TB, job_nodes=["n0", "n1"])
    assert placement.members == placement.whole == ["n0", "n1"]
    # with no job, the group is sized over every node's cache: 24 wanted, the four with room
    assert choose_placement([*_subnet(4), tiny], size_bytes=TB).members == ["n0", "n1", "n2", "n3"]


def test_earlier_members_still_holding_their_share_stay_when_the_next_job_reads_elsewhere() -> None:
    # a 6 TB version over four 4 TB caches: a first job on n0-n3 held it as shares and ended;
    # the next job runs on n4-n7 (as many nodes as the version needs, so the group does not
    # reach past them for the window's sake). The four earlier members hold 1.8 TB each of
    # it: they stay (their bytes are not read from the store again), and the job's nodes join
    nodes = _subnet(12)
    held = {f"n{i}": Candidate(f"n{i}", free_bytes=2 * TB, held_bytes=int(1.8 * TB), subnet="s1", cache_bytes=4 * TB)
            for i in range(4)}  # fmt: skip
    nodes = [held.get(n.name, n) for n in nodes]
    before, job = ["n0", "n1", "n2", "n3"], ["n4", "n5", "n6", "n7"]
    placement = choose_placement(nodes, size_bytes=6 * TB, job_nodes=job, before=before)
    assert placement.members == [*before, *job] and placement.whole == []
    # one whose share the cache evicted holds nothing of it: it leaves
    nodes = [replace(n, held_bytes=0) if n.name == "n2" else n for n in nodes]
    placement = choose_placement(nodes, size_bytes=6 * TB, job_nodes=job, before=before)
    assert sorted(placement.members) == sorted(["n0", "n1", "n3", *job])
    # so does one that owned no share (it read through its window for a job that ended)
    placement = choose_placement(nodes, size_bytes=6 * TB, job_nodes=job, before=before, no_share_before=["n3"])
    assert sorted(placement.members) == sorted(["n0", "n1", *job])
    assert members_wanted(6 * TB, 4 * TB, 2, kept=3) == 5 and members_wanted(6 * TB, 4 * TB, 2, kept=1) == 4


def test_a_choice_over_the_passs_blank_candidates_changed_per_version_is_the_choice_over_the_plain_list() -> None:
    """The controller makes the nodes as a version they hold nothing of sees them once a pass
    and changes them per version (:meth:`Candidates.but`): every choice must be the one the
    plain list gives, whatever holds what, whoever is left out, and where a changed node's
    room differs from its blank one."""
    rng = random.Random(7)
    for case in range(400):
        n = rng.choice([1, 2, 5, 12, 40])
        blank = [
            Candidate(
                f"n{i}", free_bytes=rng.choice([0, 1, 2, 3, 4]) * TB, subnet=rng.choice(["s1", "s2", None]),
                cache_bytes=rng.choice([0, 4 * TB, 8 * TB]), spare_bytes=rng.choice([None, 0, 2 * TB, 5 * TB]),
                takes_no_share=rng.random() < 0.9, in_use_bytes=rng.choice([0, TB, 3 * TB]),
            )
            for i in range(n)
        ]  # fmt: skip
        base = Candidates(blank)
        names = [c.name for c in blank]
        changed = [
            replace(
                c, held_bytes=rng.choice([0, TB, 2 * TB]), holds_whole=rng.random() < 0.3,
                window_bytes=rng.choice([None, 0, 3 * TB]),
            )
            if rng.random() < 0.8
            else replace(c, free_bytes=rng.choice([0, 5 * TB]), spare_bytes=None, window_bytes=TB)  # its room moved
            for c in rng.sample(blank, rng.randint(0, n))
        ]  # fmt: skip
        if rng.random() < 0.2:  # a node the blank ones do not have
            changed.append(Candidate("extra", free_bytes=3 * TB, held_bytes=TB, cache_bytes=4 * TB))
        without = set(rng.sample(names, rng.randint(0, min(2, n))))
        by_name = {c.name: c for c in blank} | {c.name: c for c in changed}
        plain = [by_name[name] for name in [*names, *(["extra"] if "extra" in by_name else [])] if name not in without]
        job = rng.sample(names, rng.randint(0, min(3, n)))
        before = rng.sample(names, rng.randint(0, min(3, n)))
        asked: dict[str, Any] = {
            "size_bytes": rng.choice([TB, 3 * TB, 6 * TB, 20 * TB]), "job_nodes": job, "before": before,
            "no_share_before": [b for b in before if rng.random() < 0.3],
            "share_before": [b for b in before if rng.random() < 0.5],
            "members": rng.choice([None, None, 1, 3]),
        }  # fmt: skip
        base.holders, base.smallest_cache, list(base.ranked())  # worked out before the change, as a pass does
        view = base.but(changed, without=without)
        assert list(view) == plain, case
        assert choose_placement(view, **asked) == choose_placement(plain, **asked), case
        group = {k: v for k, v in asked.items() if k != "share_before"} | {"members": asked["members"] or 2}
        assert choose_group(view, **group) == choose_group(plain, **group), case


def test_a_datasets_own_member_count_stands_where_the_rule_would_spread_a_busy_cluster_wider() -> None:
    # an 8 TB version on 500 GB caches that their pods mostly fill: the size rule's group
    # grows until each owner has room for its share beside its pods' data (200 GB each over
    # 48), where a Dataset that asks for 40 members gets the job's two and the four with room
    # for a fortieth (240 GB), no more than it asked for
    gb = 10**9
    room = [50, 50, *([250] * 4), *([200] * 50)]
    busy = [
        Candidate(f"n{i:02}", free_bytes=0, spare_bytes=0, cache_bytes=500 * gb, in_use_bytes=(500 - r) * gb)
        for i, r in enumerate(room)
    ]
    assert len(choose_placement(busy, size_bytes=8 * TB, job_nodes=["n00", "n01"]).members) == 48
    assert len(choose_placement(busy, size_bytes=8 * TB, job_nodes=["n00", "n01"], members=40).members) == 6
