"""The simulator's groups as the controller forms them: a job's nodes join the group of the
version it reads (``dsagent.policy.holding.choose_placement``), and the job's nodes that copy
a version whole fill it together, each reading its own part from the store, or from a node
holding the version ready, as the agents' swarm does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsagent.policy import holding
from scheduling.timemodel import JobProfile
from tests.tools.test_sim_on_demand import store_reads_by_node
from tools.sim import stripereads
from tools.sim.cluster import CacheEntry, Outcome, Worker
from tools.sim.engine import ClusterParams, Simulation
from tools.sim.stripe import Group
from tools.sim.workload import Dataset, Job

A100 = (("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 1.0),)
TB = 10**12


def _params(nodes: int) -> ClusterParams:
    return replace(
        ClusterParams(nodes=nodes, node_types=A100, cache_bytes=TB, storage_bw=1e10, node_fetch_bw=1e10),
        epochs=2.0,
    )


def _job(i: int, arrival: float, workers: int, dataset: str, runtime: float = 2000.0) -> Job:
    return Job(i, arrival, workers, 8, dataset, runtime, JobProfile(1.0, 1.0, 16_000, deadline=1e9))


def test_the_simulator_calls_the_controllers_group_choice() -> None:
    assert stripereads.choose_placement is holding.choose_placement


def _two_jobs(monkeypatch: pytest.MonkeyPatch, choose: object) -> tuple[Simulation, list[set[int]]]:
    """A 2 TB version (shares: 1.2 x 2 TB > one 1 TB cache; a group of five) read by a five-node
    job (its group: its own nodes), then by an eight-node job that starts while the first
    still runs: at least three of its nodes are outside the group it finds."""
    monkeypatch.setattr(stripereads, "choose_placement", choose)
    data = [Dataset("big", 2 * TB, (0.0,))]
    jobs = [_job(0, 0.0, 5, "big", 20_000.0), _job(1, 100.0, 8, "big")]
    sim = Simulation("ours+stripe", jobs, data, _params(16), seed=3)
    seen: list[set[int]] = []
    start = sim._start

    def recording(job: Job, workers: list) -> None:  # type: ignore[type-arg]
        group = sim.stripes.get(("big", 0))
        if group is not None:
            assert {w.node.index for w in workers} - set(group.members), "a node of the job is outside the group"
        start(job, workers)
        seen.append({w.node.index for w in workers})

    monkeypatch.setattr(sim, "_start", recording)
    return sim.run(), seen


def test_a_jobs_nodes_join_the_group_of_the_version_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[holding.Placement] = []

    def recording(nodes: object, **kw: object) -> holding.Placement:
        answer = holding.choose_placement(nodes, **kw)  # type: ignore[arg-type]
        answers.append(answer)
        return answer

    sim, started = _two_jobs(monkeypatch, recording)
    group = sim.stripes[("big", 0)]
    assert len(started) == 2 and answers, "the second job re-planned the group with the product's choice"
    second = started[1]
    assert second <= set(group.members), "every node of the second job is a member"
    owning = {m for m, owned in group.owned.items() if owned > 0}
    assert owning & second, "the job's nodes own shares: their ranks read them from local disk"
    assert abs(sum(group.owned.values()) - 2 * TB) < 1e6, "the shares still add up to the version"
    assert {int(n) for n in answers[-1].members} == set(group.members), "the members are the product's answer"


def test_a_different_group_choice_changes_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    def only_before(nodes: object, **kw: object) -> holding.Placement:  # a re-plan: the earlier members alone
        if "before" not in kw:  # the group formed for the first job
            return holding.choose_placement(nodes, **kw)  # type: ignore[arg-type]
        return holding.Placement(list(kw["before"]), [], [])  # type: ignore[call-overload]

    sim, started = _two_jobs(monkeypatch, only_before)
    group = sim.stripes[("big", 0)]
    assert not started[1] <= set(group.members)


def test_the_nodes_of_a_job_copy_a_fitting_version_together() -> None:
    # 0.25 TB fits every 1 TB cache: each of the four nodes copies it whole; together they
    # read it from the store once, each its own quarter, and the rest from one another
    data = [Dataset("small", TB // 4, (0.0,))]
    sim = Simulation("ours+stripe+early", [_job(0, 0.0, 4, "small")], data, _params(4), seed=3).run()
    assert sim.storage_bytes == pytest.approx(TB // 4, rel=1e-6)
    assert sim.peer_bytes == pytest.approx(4 * (TB // 4) * 3 / 4, rel=1e-6)  # each node: the three others' parts
    holders = [n for n in sim.nodes if ("small", 0) in n.cache]
    assert len(holders) == 4 and all(n.cache[("small", 0)].ready for n in holders)


def _uploads(sim: Simulation, *, since: float) -> dict[int, float]:
    """Bytes each node is asked to upload to peers from ``since`` on, filled in as ``sim``
    runs (a fetch from several sources counted evenly over them)."""
    uploads: dict[int, float] = {}
    created = sim._new_fetch

    def counted(node, key, size, **kw):  # type: ignore[no-untyped-def]
        fetch = created(node, key, size, **kw)
        if kw.get("source") == "peer" and sim.now >= since:
            for s in kw.get("sources", ()):
                uploads[s] = uploads.get(s, 0.0) + size / len(kw["sources"])
        return fetch

    sim._new_fetch = counted  # type: ignore[method-assign]
    return uploads


def test_the_nodes_of_a_job_copy_a_version_another_node_holds_together_as_the_agents_swarm() -> None:
    # a one-node job holds a whole copy on its node (and its GPUs); a four-node job on the
    # four others then copies it as the agents' swarm does: each its own quarter from the node
    # holding it, the rest from one another, so that node uploads the version once, not four times
    data = [Dataset("small", TB // 4, (0.0,))]
    jobs = [_job(0, 0.0, 1, "small"), _job(1, 1000.0, 4, "small")]  # job 0 runs until 2,000 s
    sim = Simulation("ours+stripe+early", jobs, data, _params(5), seed=3)
    uploads = _uploads(sim, since=1000.0)
    sim.run()
    first = next(w.node.index for w in sim.outcomes[0].workers)
    assert first not in {w.node.index for w in sim.outcomes[1].workers}
    assert sim.storage_bytes == pytest.approx(TB // 4, rel=1e-6)  # the store once, for the first copy
    assert uploads[first] == pytest.approx(TB // 4, rel=1e-6)  # the seed: the version once
    assert sim.peer_bytes == pytest.approx(4 * (TB // 4), rel=1e-6)
    holders = [n for n in sim.nodes if ("small", 0) in n.cache]
    assert len(holders) == 5 and all(n.cache[("small", 0)].ready for n in holders)


def _ready(sim: Simulation, node: int, key: tuple[str, int], size: int) -> None:
    """A whole ready copy of version ``key`` on ``node``."""
    sim.nodes[node].cache[key] = CacheEntry(key[0], key[1], size, 0.0, ready=True)
    sim.ready_copies.setdefault(key, set()).add(node)


def _join_on(sim: Simulation, key: tuple[str, int], size: int, nodes: tuple[int, ...]) -> Group:
    """Version ``key``'s group, owned by node 0 alone, as a job starting on ``nodes`` joins it."""
    sim.nodes[0].cache[key] = CacheEntry(key[0], key[1], size, 0.0, ready=True, replica=True, stripe=True)
    group = sim.stripes[key] = Group(key, (0,), {0: float(size)}, holding={0}, fill={0: 1.0})
    out = Outcome(_job(1, 0.0, len(nodes), key[0]), start=0.0)
    out.workers = [Worker(sim.nodes[i], (0,), frozenset()) for i in nodes]
    sim._join(out, group, key, size)
    return group


def test_a_whole_copy_fills_from_the_groups_owners_before_the_nodes_holding_it_whole() -> None:
    # a 0.5 TB version is held whole by node 2 and striped over a group of nodes 0 and 1,
    # which hold half their shares so far. Node 3 fetching it whole asks the members first,
    # then the whole copy, as the agent does: the owners serve the quarter of the version
    # they hold, node 2 only the rest, so its upload is not every new copy's only source
    size, key = TB // 2, ("fit", 0)
    sim = Simulation("ours+stripe+early", [], [Dataset("fit", size, (0.0,))], _params(4), seed=3)
    for m in (0, 1):
        sim.nodes[m].cache[key] = CacheEntry("fit", 0, size // 2, 0.0, ready=True, stripe=True)
    sim.stripes[key] = Group(key, (0, 1), {0: size / 2, 1: size / 2}, holding={0, 1}, fill={0: 0.5, 1: 0.5})
    _ready(sim, 2, key, size)
    sim.nodes[3].cache[key] = CacheEntry("fit", 0, size, 0.0)
    sim._fetch_version(sim.nodes[3], key, size, cached=True, waiter=None)
    reads = {f.sources: f.total for f in sim.fetches if f.node.index == 3}
    assert reads == {(0, 1): pytest.approx(size / 2), (2,): pytest.approx(size / 2)}
    assert sim.storage_bytes == 0


def test_a_jobs_full_nodes_join_without_a_share_and_nodes_with_room_own_in_their_place() -> None:
    # a 1.5 TB version is owned by node 0 alone; a two-node job starts on nodes 1 and 2,
    # whose 1 TB caches hold the last copies of other versions (no room for a share). As the
    # controller chooses over every agent's inventory, they join without a share and empty
    # nodes own in their place: node 0 and 15 more, not the size rule's four
    # (ceil(1.2 x 1.5 TB / (0.5 x 1 TB))): a node without a share reads every byte through
    # the window, so its reads are spread over WINDOW_MEMBERS uploads
    data = [Dataset("big", 3 * TB // 2, (0.0,)), Dataset("a", 9 * TB // 10, (0.0,)), Dataset("b", 9 * TB // 10, (0.0,))]
    sim = Simulation("ours+stripe+early", [], data, _params(24), seed=3)
    size = 3 * TB // 2
    for node, name in ((1, "a"), (2, "b")):  # the only copies of a and b
        _ready(sim, node, (name, 0), 9 * TB // 10)
    group = _join_on(sim, ("big", 0), size, (1, 2))
    owners = {m for m, owned in group.owned.items() if owned > 0}
    assert {1, 2} <= set(group.members) and not owners & {1, 2}, "the full nodes own nothing"
    assert 0 in owners and len(owners) == holding.WINDOW_MEMBERS, "nodes with room own in their place"
    assert sum(group.owned.values()) == pytest.approx(size, rel=1e-6)


def test_a_later_join_hands_no_bundles_to_members_that_joined_without_a_share() -> None:
    # as above, full nodes 1 and 2 join the group of a 1.5 TB version without a share, and
    # the 16 owners fill every bundle. A second job then starts on another node: the re-plan gives
    # slots to owners only, so nodes 1 and 2 still own nothing and no owner's bundles are
    # handed to a node that does not hold them (which would read them from the store again)
    data = [Dataset("big", 3 * TB // 2, (0.0,)), Dataset("a", 9 * TB // 10, (0.0,)), Dataset("b", 9 * TB // 10, (0.0,))]
    sim = Simulation("ours+stripe+early", [], data, _params(20), seed=3)
    size = 3 * TB // 2
    for node, name in ((1, "a"), (2, "b")):
        _ready(sim, node, (name, 0), 9 * TB // 10)
    group = _join_on(sim, ("big", 0), size, (1, 2))
    group.fill = dict.fromkeys(group.fill, 1.0)  # every owner holds its share whole
    held = sum(group.owned[m] * group.fill[m] for m in group.members if m in group.holding)
    out = Outcome(_job(2, 10.0, 1, "big"), start=10.0)
    outside = next(i for i in range(20) if i not in group.members)  # 18 members of 20 nodes
    out.workers = [Worker(sim.nodes[outside], (0,), frozenset())]
    sim._join(out, group, ("big", 0), size)
    assert not group.owned.get(1) and not group.owned.get(2), "a node without a share owns nothing after a re-plan"
    # the 16 owners still hold their shares and stay, the new node joins (17 owners); nodes 1
    # and 2 owned nothing for a job that ended: they leave, as the controller lets them go
    owners = {m for m, owned in group.owned.items() if owned > 0}
    assert outside in owners and len(owners) == holding.WINDOW_MEMBERS + 1
    assert not {1, 2} & set(group.members) and not group.shareless
    assert sum(group.owned.values()) == pytest.approx(size, rel=1e-6)
    kept = sum(group.owned[m] * group.fill.get(m, 0.0) for m in group.members if m in group.holding)
    assert kept == pytest.approx(held, rel=1e-6), "the bytes the owners held stay held"


def test_a_node_without_room_for_a_fitting_version_reads_it_over_every_whole_copy() -> None:
    # two one-node jobs leave whole copies of a 0.5 TB version on their nodes (and keep their
    # GPUs); a third node holds the last copy of another version, so it has no room for the
    # version whole (1.2 x 0.5 TB) without evicting it. A job there reads the version through
    # a group that takes in both copies (dsagent.policy.holding.members_wanted's ``copies``):
    # its node owns a third and reads the rest from two uploads, not one
    data = [Dataset("fit", TB // 2, (0.0,)), Dataset("other", TB // 2, (0.0,))]

    def job(i: int, arrival: float, dataset: str, seconds: float) -> Job:  # one node's 8 GPUs for that long
        return Job(i, arrival, 1, 8, dataset, seconds, JobProfile(1.0, 1.0, int(8 * seconds), deadline=1e9))

    jobs = [
        job(0, 0.0, "fit", 20_000.0), job(1, 0.0, "fit", 20_000.0),
        job(2, 0.0, "other", 500.0), job(3, 5_000.0, "fit", 2_000.0),
    ]  # fmt: skip
    sim = Simulation("ours+stripe+early", jobs, data, _params(3), seed=3).run()
    copies = {next(w.node.index for w in sim.outcomes[i].workers) for i in (0, 1)}
    reader = next(w.node.index for w in sim.outcomes[3].workers)
    assert reader not in copies and ("other", 0) in sim.nodes[reader].cache
    group = sim.stripes[("fit", 0)]
    assert set(group.members) == {reader, *copies}
    assert group.owned[reader] == pytest.approx(TB / 2 / 3, rel=0.5)  # rendezvous: about a third
    # every reader has ended: the controller's hold on each member ends, the whole copies'
    # too (let go, they keep the version until their cache evicts it)
    assert all(sim.nodes[m].cache[("fit", 0)].replica is False for m in copies)
    assert not [(n.index, k) for n in sim.nodes for k, e in n.cache.items() if e.in_use], "nothing stays held"


def test_whole_copies_join_the_group_a_full_node_joins_and_keep_the_version_whole() -> None:
    # a 0.5 TB version (it fits a 1 TB cache) is read through a group owned by node 0; nodes
    # 3 and 4 hold it whole. A job starts on node 1, full with another version's last copy:
    # it joins without a share, and both whole copies join as owners (members_wanted's
    # ``copies``), keeping the version whole (dsagent.policy.holding.choose_placement)
    data = [Dataset("fit", TB // 2, (0.0,)), Dataset("a", 9 * TB // 10, (0.0,))]
    sim = Simulation("ours+stripe+early", [], data, _params(6), seed=3)
    key, size = ("fit", 0), TB // 2
    for node in (3, 4):
        _ready(sim, node, key, size)
    _ready(sim, 1, ("a", 0), 9 * TB // 10)  # the only copy of a
    group = _join_on(sim, key, size, (1,))
    assert {0, 1, 3, 4} <= set(group.members) and group.owned[1] == 0
    for node in (3, 4):
        copy = sim.nodes[node].cache[key]
        assert group.owned[node] > 0 and group.fill[node] == 1.0 and node in group.holding
        assert not copy.stripe and copy.size == size and copy.replica, "the copy stays whole, held while read"


def test_a_group_reads_what_a_partial_copy_holds_from_it_not_the_store() -> None:
    # job 0 reads 0.3 of an epoch of a 0.5 TB version on one node (its copy holds that part)
    # and keeps the node; job 1 keeps a second node with another version; job 2 leaves the
    # last copy of a third on the last node, which then has no room for the version whole
    # (1.2 x 0.5 TB), so job 3 there reads it through a group. The group's first reads take
    # the part job 0's copy holds from it: the store is read for each byte once
    data = [Dataset("fit", TB // 2, (0.0,)), Dataset("x", TB // 2, (0.0,)), Dataset("other", TB // 2, (0.0,))]

    def job(i: int, arrival: float, dataset: str, seconds: float) -> Job:
        return Job(i, arrival, 1, 8, dataset, seconds, JobProfile(1.0, 1.0, int(8 * seconds), deadline=1e9))

    jobs = [
        job(0, 0.0, "fit", 20_000.0), job(1, 0.0, "x", 20_000.0),
        job(2, 0.0, "other", 500.0), job(3, 5_000.0, "fit", 2_000.0),
    ]  # fmt: skip
    sim = Simulation("ours+stripe+early", jobs, data, _params(3), seed=3)
    for i, epochs in ((0, 0.3), (1, 1.0), (2, 1.0), (3, 2.0)):
        sim.outcomes[i].epochs = epochs
    sim.run()
    first, reader = (next(w.node.index for w in sim.outcomes[i].workers) for i in (0, 3))
    assert sim.nodes[first].cache[("fit", 0)].part == pytest.approx(0.3)
    assert ("fit", 0) in sim.stripes and ("other", 0) in sim.nodes[reader].cache, "read through a group"
    assert sim.storage_kept[("fit", 0)] == pytest.approx(TB // 2, rel=1e-6), "each byte of fit from the store once"
    assert sim.storage_by_cause["refetch"] == pytest.approx(0.0, abs=1.0)


def test_a_copy_being_fetched_whole_joins_the_group_whole_and_is_not_replaced_by_a_share() -> None:
    # nodes 3 and 4 are fetching a 0.5 TB version whole (a job's ranks that had room) when
    # the job's last rank, on a full node 1, joins it to a group: the two stay whole copies
    # (their fetch goes on), as the controller keeps the job's nodes the version fits whole
    data = [Dataset("fit", TB // 2, (0.0,)), Dataset("a", 9 * TB // 10, (0.0,))]
    sim = Simulation("ours+stripe+early", [], data, _params(6), seed=3)
    key, size = ("fit", 0), TB // 2
    for node in (3, 4):
        sim.nodes[node].cache[key] = CacheEntry(key[0], key[1], size, 0.0, ready=False)
    _ready(sim, 1, ("a", 0), 9 * TB // 10)
    group = _join_on(sim, key, size, (3, 4, 1))
    for node in (3, 4):
        copy = sim.nodes[node].cache[key]
        assert not copy.stripe and copy.size == size, "still a whole copy, not a share"
        assert node in group.holding and group.owned[node] > 0


def test_a_group_is_formed_as_the_products_placement_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    # a 2 TB version on 1 TB caches, read by a one-node job: the controller's placement (the
    # size rule's five members, ceil(1.2 x 2 TB / (0.5 x 1 TB)), are more than the job's one
    # node, so the window's WINDOW_MEMBERS) is the group the simulator forms
    answers: list[tuple[dict[str, object], holding.Placement]] = []

    def recording(nodes: object, **kw: object) -> holding.Placement:
        answer = holding.choose_placement(nodes, **kw)  # type: ignore[arg-type]
        answers.append((kw, answer))
        return answer

    monkeypatch.setattr(stripereads, "choose_placement", recording)
    data = [Dataset("big", 2 * TB, (0.0,))]
    sim = Simulation("ours+stripe", [_job(0, 0.0, 1, "big")], data, _params(16), seed=3).run()
    asked, first = answers[0]
    job_node = sim.outcomes[0].workers[0].node.index
    assert asked["job_nodes"] == [str(job_node)] and len(first.members) == holding.WINDOW_MEMBERS
    assert first.members[0] == str(job_node)
    group = sim.stripes[("big", 0)]
    assert [str(m) for m in group.members] == first.members
    assert sum(group.owned.values()) == pytest.approx(2 * TB, rel=1e-6)

    # another answer, another group: the simulator has no choice of its own
    def elsewhere(nodes: object, **kw: object) -> holding.Placement:
        job = list(kw["job_nodes"])  # type: ignore[call-overload]
        others = [str(i) for i in range(16) if str(i) not in job][-5:]
        return holding.Placement([*job, *others], [], [])

    monkeypatch.setattr(stripereads, "choose_placement", elsewhere)
    sim = Simulation("ours+stripe", [_job(0, 0.0, 1, "big")], data, _params(16), seed=3).run()
    assert len(sim.stripes[("big", 0)].members) == 6 and 15 in sim.stripes[("big", 0)].members


def test_the_nodes_of_a_job_copy_a_version_another_node_is_still_fetching_together() -> None:
    # a one-node job's copy of a 0.25 TB version is still filling from a slow store when a
    # four-node job starts on the four other nodes: they copy it as the agents' swarm does,
    # each its own quarter from that node as its bundles land, the rest from one another,
    # so that node uploads the version once, not four times
    data = [Dataset("small", TB // 4, (0.0,))]
    jobs = [_job(0, 0.0, 1, "small"), _job(1, 100.0, 4, "small")]
    params = replace(_params(5), storage_bw=1e9)  # the first copy takes 250 s
    sim = Simulation("ours+stripe+early", jobs, data, params, seed=3)
    uploads = _uploads(sim, since=100.0)
    sim.run()
    first = next(w.node.index for w in sim.outcomes[0].workers)
    assert sim.outcomes[1].start < 250.0 and first not in {w.node.index for w in sim.outcomes[1].workers}
    assert sim.storage_bytes == pytest.approx(TB // 4, rel=1e-6)  # the store once, for the first copy
    assert uploads[first] == pytest.approx(TB // 4, rel=1e-6)  # the filling node: the version once
    holders = [n for n in sim.nodes if ("small", 0) in n.cache]
    assert len(holders) == 5 and all(n.cache[("small", 0)].ready for n in holders)


def test_a_node_starting_a_version_another_node_reads_from_the_store_reads_half_of_the_rest() -> None:
    # two one-node jobs 10 s apart on two nodes, a 0.25 TB version, the store serving each
    # node 1.4 GB/s: the second node's agent joins the first's fetch as the swarm does. Of the
    # bundles the first has not read yet it reads half from the store, and each node takes
    # the other's half from the other: the store serves the version once, and both copies are
    # whole well before one node's store stream alone could bring it (about 180 s)
    size, key = TB // 4, ("small", 0)
    jobs = [_job(0, 0.0, 1, "small", 20_000.0), _job(1, 10.0, 1, "small", 20_000.0)]
    sim = Simulation("ours+stripe+early", jobs, [Dataset("small", size, (0.0,))], _params(2), seed=3)
    stored = store_reads_by_node(sim)
    whole: dict[int, float] = {}
    finish = sim._finish_fetches

    def finishing() -> None:
        finish()
        for n in sim.nodes:
            if key in n.cache and n.cache[key].ready:
                whole.setdefault(n.index, sim.now)

    sim._finish_fetches = finishing  # type: ignore[method-assign]
    sim.run()
    assert [next(w.node.index for w in sim.outcomes[i].workers) for i in (0, 1)] == [0, 1]
    store_per_node = sim.params.store_node_bw
    assert sim.storage_bytes == pytest.approx(size, rel=1e-6), "the store serves the version once"
    left = size - 10.0 * store_per_node  # what the first node had not read when the second began
    assert stored[1] == pytest.approx(left / 2, rel=1e-3), "the second node read half of it from the store"
    assert sorted(whole) == [0, 1]
    assert whole[0] >= 10.0 + left / 2 / store_per_node - 1.0, "the first copy waits for the second node's half"
    assert max(whole.values()) < 0.6 * size / store_per_node


def test_a_slot_no_node_could_hold_is_given_to_a_node_with_room_at_the_controllers_next_pass() -> None:
    # a 1 TB version in two 0.5 TB slots: node 0 holds its share, the other slot's node had
    # no room when the group formed (a hole), so a rank on node 0 reads that slot from the
    # store every epoch (4 epochs: 2 TB, in a 3 TB store read) and keeps nothing. Half-way,
    # node 1 has room: the controller's pass gives it the slot, and the rank reads the rest
    # of it through node 1, one epoch's worth from the store (kept by node 1), the rest from
    # node 1's disk
    size, key, half = TB, ("big", 0), TB // 2
    sim = Simulation("ours+stripe+early", [], [Dataset("big", size, (0.0,))], _params(2), seed=3)
    sim.nodes[0].cache[key] = CacheEntry("big", 0, half, 0.0, ready=True, replica=True, stripe=True)
    sim.nodes[1].cache[("held", 0)] = CacheEntry("held", 0, TB, 0.0, ready=True, users=1)  # a pod's data
    group = sim.stripes[key] = Group(key, (0, 1), {0: float(half), 1: float(half)}, holding={0}, fill={0: 1.0})
    job = _job(7, 0.0, 1, "big")
    out = sim.outcomes[7] = Outcome(job, start=0.0)
    out.workers = [Worker(sim.nodes[0], (0,), frozenset())]
    sim.running[7] = out
    group.users, group.readers = 1, {7: 1}
    hole = sim._new_fetch(
        sim.nodes[0], key, 6 * half, cached=True, waiter=(job, 0), stream=True, holes={1: (4.0 * half, float(half))},
        pace=6.0 * half / 1000.0,
    )  # fmt: skip
    assert sim.storage_by_cause["lost_member"] == 4 * half

    sim._repair_holes()  # node 1's cache is its pod's: no node can take the slot
    assert 1 not in group.holding and hole in sim.fetches and sim.storage_bytes == 6 * half

    hole.remaining = 3.0 * half  # half read; the pod on node 1 ends
    del sim.nodes[1].cache[("held", 0)]
    sim.touch(sim.nodes[1])
    sim._repair_holes()
    assert 1 in group.holding and sim.nodes[1].cache[key].stripe and sim.nodes[1].cache[key].size == half
    # the read keeps the bytes that were not the hole's, at the pace those bytes take
    assert hole in sim.fetches and hole.remaining == pytest.approx(half) and hole.total == pytest.approx(2 * half)
    assert hole.pace == pytest.approx(6.0 * half / 1000.0 / 3)
    reads = {(f.source, f.sources): f.total for f in sim.fetches if f is not hole}
    assert reads == {("storage", ()): pytest.approx(half), ("peer", (1,)): pytest.approx(half)}
    assert out.streams == 3
    assert sim.storage_by_cause["lost_member"] == pytest.approx(2 * half), "only the half read before stays lost"
    assert sim.storage_bytes == pytest.approx(5 * half)  # 6, less the hole's 2 left, plus the 1 kept


def _superseded(second_arrival: float, first_runtime: float = 2000.0) -> tuple[Simulation, dict[int, bool]]:
    """A 2 TB version striped over a group for a one-node job; its Dataset moves to a new
    version at 3,000 s; a job on another dataset arrives at ``second_arrival`` (an event at
    which the controller's pass runs). Returns the simulation and, per member, whether it
    held its share of the first version when that job started."""
    data = [Dataset("big", 2 * TB, (0.0, 3000.0)), Dataset("small", TB // 10, (0.0,))]
    first = Job(0, 0.0, 1, 8, "big", first_runtime, JobProfile(1.0, 1.0, int(8 * first_runtime), deadline=1e9))
    jobs = [first, _job(1, second_arrival, 1, "small", 100.0)]
    sim = Simulation("ours+stripe", jobs, data, _params(8), seed=3)
    held: dict[int, bool] = {}
    start = sim._start

    def recording(job: Job, workers: list[Worker]) -> None:
        if job.id == 1:
            group = sim.stripes.get(("big", 0))
            for m in group.members if group is not None else ():
                entry = sim.nodes[m].cache.get(("big", 0))
                held[m] = entry is not None and entry.stripe
        start(job, workers)

    sim._start = recording  # type: ignore[method-assign]
    return sim.run(), held


def test_a_superseded_versions_shares_lapse_with_their_lease_when_nobody_reads_them() -> None:
    lapse = 3000.0 + stripereads.SHARE_LEASE_S
    sim, _ = _superseded(lapse + 100.0)
    assert ("big", 0) not in sim.stripes, "the controller no longer holds the old version's group"
    assert not any(("big", 0) in n.cache for n in sim.nodes), "every member dropped its share of it"
    assert sim.lapsed_shares == 1


def test_a_superseded_versions_shares_stay_within_their_lease_and_while_a_job_reads_them() -> None:
    lapse = 3000.0 + stripereads.SHARE_LEASE_S
    _, held = _superseded(lapse - 600.0)
    assert held and all(held.values()), "within the lease the members keep their shares"
    _, held = _superseded(lapse + 100.0, first_runtime=lapse + 5000.0)
    assert held and all(held.values()), "a job still reading the old version keeps its group"
    sim, held = _superseded(lapse + 2000.0, first_runtime=lapse)
    assert sim.outcomes[0].end > lapse, sim.outcomes[0]
    assert held and all(held.values()), "within a lease of its last reader's end it stays"
    assert ("big", 0) not in sim.stripes, "a lease after that it lapses"
