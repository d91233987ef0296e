"""``ours+stripe`` as a policy: versions a node cannot hold read from the cluster's cache,
groups filled by what is read, slots re-homed, eviction in tiers; and the JuiceFS group's
serving members limited as every other node is.

Small clusters of identical nodes (8 GPUs, one worker per job unless said), fixed epochs,
asserting bytes by where they were read from.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.timemodel import JobProfile
from tools.sim.engine import CacheEntry, ClusterParams, Simulation
from tools.sim.workload import Dataset, Job

A100 = (("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 1.0),)
TB = 10**12
GB = 10**9


def job(ident: int, arrival: float, dataset: str = "ds000", *, gpus: int = 8, runtime: float = 1000.0) -> Job:
    return Job(ident, arrival, 1, gpus, dataset, runtime, JobProfile(1.0, 1.0, int(runtime) * gpus, deadline=1e9))


def cluster(nodes: int = 4, cache: int = TB, **kw: object) -> ClusterParams:
    base = ClusterParams(
        nodes=nodes, node_types=A100, cache_bytes=cache, storage_bw=1e10, node_fetch_bw=1e9, epochs=3.0
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def run(policy: str, jobs: list[Job], data: list[Dataset], params: ClusterParams) -> Simulation:
    return Simulation(policy, jobs, data, params, seed=3).run()


def test_a_version_bigger_than_a_node_is_read_from_the_store_once_over_many_epochs_and_jobs() -> None:
    # 3 TB on nodes of 1 TB (a group of 4): three epochs of two jobs read every bundle from
    # the store once; the first step comes at once (bundles fill as they are read)
    data = [Dataset("ds000", 3 * TB, (0.0,))]
    for policy in ("ours+stripe", "ours+stripe+early"):
        sim = run(policy, [job(0, 0.0), job(1, 50_000.0)], data, cluster())
        group = sim.stripes[("ds000", 0)]
        assert len(group.members) == 4 and group.fill == {m: pytest.approx(1.0) for m in group.members}
        assert sim.storage_bytes == pytest.approx(3 * TB)
        assert sum(sim.read_store) == pytest.approx(3 * TB)  # job 0's first epoch, through the owners
        node = sim.outcomes[0].workers[0].node.index
        assert sim.read_local[1] == pytest.approx(2 * 2 * group.owned[node])  # rank-affine: its own share
        assert sim.outcomes[0].first_step == 0.0 and sim.uncached_reads == 0


def test_a_job_reading_part_of_an_epoch_fills_only_what_it_reads() -> None:
    # half an epoch of a 3 TB version: 1.5 TB from the store, not the whole version; the
    # next job reads that half from the group and fills the rest
    data = [Dataset("ds000", 3 * TB, (0.0,))]
    params = cluster(epochs=0.5)
    sim = run("ours+stripe", [job(0, 0.0), job(1, 50_000.0)], data, params)
    assert sim.storage_bytes == pytest.approx(1.5 * TB + 0.5 * 1.5 * TB)
    ours = run("ours", [job(0, 0.0)], [Dataset("ds000", 0.5 * TB, (0.0,))], params)
    fits = run("ours+stripe", [job(0, 0.0)], [Dataset("ds000", 0.5 * TB, (0.0,))], params)
    assert ours.storage_bytes == pytest.approx(0.5 * TB)  # ours fetches the whole copy first
    # a version that fits a node is copied whole (dsagent.policy.holding): the product cannot
    # know that a job will read only part of it
    assert fits.storage_bytes == pytest.approx(0.5 * TB) and not fits.stripes


def _held_node_jobs(dataset: str) -> list[Job]:
    # node A: job 0 (4 GPUs, ds000, long) holds most of its cache; node B: job 1 (8 GPUs,
    # a tiny dataset); job 2 (4 GPUs) can only go next to job 0, where its version has no room
    return [
        job(0, 0.0, "ds000", gpus=4, runtime=100_000.0),
        job(1, 0.0, "tiny", gpus=8, runtime=100_000.0),
        job(2, 100.0, dataset, gpus=4, runtime=1000.0),
    ]


def test_a_version_that_fits_a_node_but_not_this_one_now_is_read_from_a_group_not_the_store() -> None:
    data = [Dataset("ds000", 700 * GB, (0.0,)), Dataset("ds001", 700 * GB, (0.0,)), Dataset("tiny", GB, (0.0,))]
    params = cluster(nodes=2)
    ours = run("ours", _held_node_jobs("ds001"), data, params)
    striped = run("ours+stripe", _held_node_jobs("ds001"), data, params)
    held = ours.outcomes[0].workers[0].node.index
    assert ours.outcomes[2].workers[0].node.index == held == striped.outcomes[2].workers[0].node.index
    assert ours.uncached_reads == 1 and striped.uncached_reads == 0
    # ours reads ds001 from the store every epoch; the group (the other node) fills it once
    assert ours.storage_bytes - striped.storage_bytes == pytest.approx(2 * 700 * GB, rel=1e-6)
    group = striped.stripes[("ds001", 0)]
    # the job's node is a member without a share (its pods read through its window); the
    # other node owns every bundle and holds it
    assert group.shareless == {held} and group.owned[held] == 0
    assert {m: group.fill[m] for m in group.members if m != held} == {
        m: pytest.approx(1.0) for m in group.members if m != held
    }
    assert striped.read_peer[1] == pytest.approx(2 * 700 * GB)  # the later epochs from the group


def test_a_version_another_node_holds_ready_is_read_from_it_when_this_node_has_no_room() -> None:
    data = [Dataset("ds000", 700 * GB, (0.0,)), Dataset("tiny", GB, (0.0,))]
    jobs = [
        job(0, 0.0, "ds000", gpus=4, runtime=100_000.0),
        job(1, 0.0, "tiny", gpus=8, runtime=100_000.0),
        job(2, 100.0, "ds000", gpus=4, runtime=1000.0),
    ]
    sim = run("ours+stripe", jobs, data, cluster(nodes=2))
    # job 2 shares job 0's node and its copy: no store read, no group
    assert sim.storage_bytes == pytest.approx(700 * GB + GB) and not sim.stripes


def test_a_version_held_whole_elsewhere_is_read_through_a_group_when_this_node_has_no_room() -> None:
    # four nodes: job 0 holds ds000 whole on node A (all its GPUs, long); job 1 holds ds001
    # on node B (4 GPUs, long), which leaves B no room for a copy of ds000; job 2 (4 GPUs,
    # ds000) is packed next to job 1 on B. It reads ds000 through a group (the product's
    # count for a version that fits a node read through the window: WINDOW_MEMBERS, here every
    # node), B owning the quarter it has room for beside ds001 and A, which holds it whole,
    # owning its part without moving a byte, not every epoch from A's copy alone (pods never
    # read a peer's copy, and A alone would serve every such reader); A's copy feeds what
    # the group lacks, so the store reads each version once
    data = [Dataset("ds000", 700 * GB, (0.0,)), Dataset("ds001", 700 * GB, (0.0,))]
    jobs = [
        job(0, 0.0, "ds000", gpus=8, runtime=100_000.0),
        job(1, 0.0, "ds001", gpus=4, runtime=100_000.0),
        job(2, 5_000.0, "ds000", gpus=4, runtime=1000.0),
    ]
    for policy in ("ours+stripe", "ours+stripe+early"):
        sim = run(policy, jobs, data, cluster())
        a, b, c = (sim.outcomes[i].workers[0].node.index for i in range(3))
        assert c == b != a and sim.ready_copies[("ds000", 0)] == {a}
        group = sim.stripes[("ds000", 0)]
        owners = [m for m in group.members if m not in group.shareless]
        assert group.shareless == set() and set(owners) == {n.index for n in sim.nodes}
        ours = group.owned[b] / (700 * GB)  # the part of every epoch job 2 reads from B's own disk
        assert sim.storage_bytes == pytest.approx(2 * 700 * GB)  # each version once: A's copy fed the group
        assert sum(sim.read_store) == pytest.approx(0.0)
        # later epochs: jobs 0 and 1 from their whole copies, job 2 its own share from B's
        # disk and the rest from the group's other members
        assert sim.read_local[1] == pytest.approx((2 * 2 + 2 * ours) * 700 * GB)
        assert sim.read_peer[1] == pytest.approx(2 * (1 - ours) * 700 * GB)
        assert sim.outcomes[2].end - sim.outcomes[2].compute_end < 1.0  # its reads kept up with its GPUs


def test_a_share_takes_its_room_as_it_fills_and_keeps_idle_copies_it_does_not_need() -> None:
    # every node holds an idle 0.6 TB copy of another version (the last copy: nobody else
    # holds it); a 3 TB version read for a tenth of an epoch fills a tenth of its shares: the
    # shares hold their part on disk, and room for the rest is never made, so the idle
    # copies stay (room for whole shares of 0.75 TB would have evicted every one of them)
    data = [Dataset("ds000", 3 * TB, (0.0,))]
    sim = Simulation("ours+stripe+early", [job(0, 0.0)], data, cluster(epochs=0.1), seed=3)
    for n in sim.nodes:
        n.cache[("idle", 0)] = CacheEntry("idle", 0, int(0.6 * TB), 0.0, ready=True)
    sim.run()
    group = sim.stripes[("ds000", 0)]
    assert len(group.members) == 4 and sim.storage_bytes == pytest.approx(0.3 * TB)
    for m in group.members:
        share = sim.nodes[m].cache[("ds000", 0)]
        assert share.stripe and share.on_disk == pytest.approx(0.1 * share.size, rel=1e-6)
    assert all(("idle", 0) in n.cache for n in sim.nodes)


def test_a_member_that_cannot_hold_its_share_again_hands_its_slot_to_a_node_that_can() -> None:
    # six nodes; two are full of a running job's data when the group forms, so it forms on
    # the other four. Later one member loses its share and its cache is taken; the two
    # nodes' data is idle by then: one makes room and takes over the slot, and only the
    # slot's bundles come from the store again
    data = [Dataset("ds000", 3 * TB, (0.0,))]
    sim = Simulation("ours+stripe", [job(0, 0.0)], data, cluster(nodes=6), seed=3)
    busy = [sim.nodes[4], sim.nodes[5]]
    for n in busy:
        n.cache[("other", 0)] = CacheEntry("other", 0, int(0.9 * TB), 0.0, users=1, ready=True)
    sim.run()
    key = ("ds000", 0)
    group = sim.stripes[key]
    original = set(group.members)
    assert original == {0, 1, 2, 3}
    for n in busy:
        n.cache[("other", 0)].users = 0  # that job is gone: evictable
    lost = next(m for m in group.members if m != sim.outcomes[0].workers[0].node.index)
    share = group.owned[lost]
    node = sim.nodes[lost]
    sim._forget(node, key)  # evicted while idle, then its cache taken by a running job's copy
    node.cache[("held", 0)] = CacheEntry("held", 0, int(0.9 * TB), sim.now, users=1, ready=True)
    before = sim.storage_bytes
    sim.jobs = [job(1, sim.now + 10.0)]
    sim.outcomes[1] = type(sim.outcomes[0])(sim.jobs[0], epochs=3.0)
    sim.run()
    assert lost not in group.members
    (taker,) = {m for m in set(group.members) - original if group.owned[m] > 0}
    assert group.owned[taker] == share and taker in group.holding and taker in {4, 5}
    assert sim.nodes[taker].used_bytes <= TB  # the taker made room for the share it took
    # then placed again as the controller places it, for a one-node job reading a version
    # larger than its node: more members, here the other node, which has no room for a share
    assert set(group.members) == original - {lost} | {4, 5}
    # only the slot's bundles come from the store again, once over three epochs
    assert sim.storage_bytes - before == pytest.approx(share)


def test_eviction_takes_idle_shares_and_last_copies_least_recently_used_first() -> None:
    sim = Simulation("ours+stripe", [], [], cluster(nodes=2), seed=3)
    node, other = sim.nodes
    for first in ("last", "share"):
        node.cache.clear()
        for name, when in ((first, 10.0), ("share" if first == "last" else "last", 11.0)):
            node.cache[(name, 0)] = CacheEntry(name, 0, 400 * GB, when, ready=True, stripe=name == "share")
        assert sim._make_room(node, 300 * GB)
        assert first not in {k[0] for k in node.cache} and len(node.cache) == 1  # the older one went
    plain = Simulation("ours", [], [], cluster(nodes=2), seed=3)
    n = plain.nodes[0]
    for name, when in (("last", 10.0), ("share", 11.0)):
        n.cache[(name, 0)] = CacheEntry(name, 0, 400 * GB, when, ready=True, stripe=name == "share")
    assert plain._make_room(n, 300 * GB) and set(n.cache) == {("share", 0)}  # ours: plain LRU among last copies
    del other


def test_juicefs_remote_reads_are_limited_by_the_serving_members_uploads() -> None:
    data = [Dataset("ds000", TB, (0.0,))]
    jobs = [job(0, 0.0), job(1, 20_000.0)]
    fast = run("juicefs", jobs, data, cluster(node_serve_bw=1e11))
    slow = run("juicefs", jobs, data, cluster(node_serve_bw=1e8))
    assert slow.storage_bytes == fast.storage_bytes == pytest.approx(TB)
    # job 1 reads three quarters of every epoch from the three other members
    assert slow.outcomes[1].end - slow.outcomes[1].first_step > 2 * (fast.outcomes[1].end - fast.outcomes[1].first_step)


def test_the_results_page_sets_the_product_policy_against_the_rivals_best_setting() -> None:
    from tools.sim.results import goals

    def figures(local: float, store: float, ttfs: float) -> dict[str, float]:
        return {"local_fraction": local, "storage_bytes": store, "ttfs_mean_s": ttfs, "gpu_hours_idle_for_data": 1.0,
                "jct_mean_s": 100.0, "jobs_across_subnets_avoidable": 0}  # fmt: skip

    doc = {
        "policies": {
            "fluid-r1": figures(0.2, 3 * TB, 50.0),
            "fluid-r4": figures(0.1, 2 * TB, 100.0),
            "juicefs": figures(0.9, 1 * TB, 10.0),  # not Fluid: not the local-byte reference
            "ours+stripe+early": figures(0.4, 2 * TB, 60.0),
        }
    }
    (row,) = [line for line in goals({"w": doc}) if line.startswith("| w |")]
    assert row.startswith("| w | 2.00x (fluid-r1) | **2.00x (juicefs)** | **6.00x (juicefs)** |")


def test_a_transfer_too_small_to_move_the_clock_finishes_instead_of_stalling_the_run() -> None:
    # late in a run a few bytes at a disk's rate take less time than the clock can count
    sim = Simulation("default", [], [], cluster(nodes=1), seed=3)
    sim.now = 2.0**40
    fetch = sim._new_fetch(sim.nodes[0], ("ds000", 0), 2.0, cached=False, waiter=None, source="local")
    sim.run()
    assert not sim.fetches and not fetch.open and sim.now == 2.0**40


def test_a_second_whole_copy_comes_from_one_still_arriving_not_the_store() -> None:
    # job 0 fills node A and fetches ds000 whole (700 s at 1 GB/s); job 1 on node B reads
    # half an epoch of it meanwhile: the version fits B, so B copies it whole too, from A's
    # copy as its bundles land, and the store is read once, by the first copy
    data = [Dataset("ds000", 700 * GB, (0.0,))]
    jobs = [job(0, 0.0, runtime=100_000.0), job(1, 10.0)]
    for policy in ("ours+stripe", "ours+stripe+early"):
        sim = Simulation(policy, jobs, data, cluster(nodes=2), seed=3)
        sim.outcomes[1].epochs = 0.5
        sim.run()
        a, b = (sim.outcomes[i].workers[0].node.index for i in (0, 1))
        assert a != b and not sim.stripes
        assert sim.storage_bytes == pytest.approx(700 * GB)
        assert sum(sim.read_store) == pytest.approx(0.0) and sum(sim.read_peer) == pytest.approx(0.0)
        assert sum(sim.read_local) == pytest.approx(3 * 700 * GB + 350 * GB)


def test_a_share_is_published_as_the_agents_inventory_shows_it_not_as_a_whole_copy() -> None:
    # the extender scores a share as part of a version (held bytes, the group's members on
    # the subnet), as it reads the agent's inventory: the simulator's node facts say the same
    data = [Dataset("ds000", 3 * TB, (0.0,))]
    sim = run("ours+stripe", [job(0, 0.0)], data, cluster())
    group = sim.stripes[("ds000", 0)]
    names = tuple(sim.nodes[m].name for m in group.members)
    for m in group.members:
        node = sim.nodes[m]
        sim.touch(node)
        inventory = sim.facts(node).inventory
        assert "ds000" not in inventory.datasets  # no whole copy is claimed
        share = inventory.stripes["ds000"]
        assert share.group == names and share.members == 4 and share.size_bytes == 3 * TB
        assert share.held_bytes == pytest.approx(node.cache[("ds000", 0)].size, rel=1e-9)
        assert "ds000" in inventory.partial


def test_a_group_does_not_take_both_holders_of_a_versions_two_copies_as_room() -> None:
    # nodes 1 and 2 (the job's) each hold an idle copy of "v", the cluster's only two, with
    # too little free room for a share; nodes 0 and 3 are empty. Each copy alone is room
    # (another node holds v), but not both: node 2 is v's keeper (to it the copy is the
    # last), so it joins without a share; node 1 and the empty nodes own, and v keeps the
    # keeper's copy
    from tools.sim.cluster import Outcome, Worker

    data = [Dataset("big", int(2.4 * GB), (0.0,)), Dataset("v", int(1.5 * GB), (0.0,))]
    sim = Simulation("ours+stripe", [job(0, 0.0, "big", gpus=16)], data, cluster(nodes=4, cache=2 * GB), seed=3)
    for n in (sim.nodes[1], sim.nodes[2]):
        n.cache[("v", 0)] = CacheEntry("v", 0, int(1.5 * GB), 0.0, ready=True)
        sim.ready_copies.setdefault(("v", 0), set()).add(n.index)
    out = Outcome(sim.jobs[0], start=0.0)
    out.workers = [Worker(n, (0, 1, 2, 3, 4, 5, 6, 7), frozenset()) for n in (sim.nodes[1], sim.nodes[2])]
    group = sim._stripe_group(out, ("big", 0), data[0].size)
    assert group is not None and sorted(group.members) == [0, 1, 2, 3] and group.shareless == {2}
    assert 2 in sim.ready_copies[("v", 0)]
    assert all(n.used_bytes <= 2 * GB for n in sim.nodes)
    assert sim.group_evicted is None  # the pass is over: later evictions count as published
