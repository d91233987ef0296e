"""The product policy's store reads on demand in the simulator: a whole copy whose version no
other node holds reads from the store what its job reads, and the next job on that node reads
what the copy lacks (the agent's ``storeOnDemand``, docs/design-striping.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.timemodel import JobProfile
from tools.sim.cluster import CacheEntry
from tools.sim.engine import ClusterParams, Simulation
from tools.sim.stripereads import parts_held
from tools.sim.workload import Dataset, Job

A100 = (("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 1.0),)
TB = 10**12
SIZE = TB // 4  # fits every 1 TB cache: held whole


def _run(policy: str, epochs: float, jobs: list[Job], nodes: int = 1) -> Simulation:
    params = replace(
        ClusterParams(nodes=nodes, node_types=A100, cache_bytes=TB, storage_bw=1e10, node_fetch_bw=1e10),
        epochs=epochs,
    )
    return Simulation(policy, jobs, [Dataset("d", SIZE, (0.0,))], params, seed=3).run()


def _job(i: int, arrival: float) -> Job:
    return Job(i, arrival, 1, 8, "d", 2000.0, JobProfile(1.0, 1.0, 16_000, deadline=1e9))


def test_a_job_reading_part_of_an_epoch_reads_only_that_part_from_the_store() -> None:
    sim = _run("ours+stripe+early", 0.3, [_job(0, 0.0)])
    assert sim.storage_bytes == pytest.approx(0.3 * SIZE, rel=1e-6)
    (entry,) = (n.cache[("d", 0)] for n in sim.nodes if ("d", 0) in n.cache)
    assert entry.part == pytest.approx(0.3)


def test_a_jobs_nodes_copying_together_read_only_its_part_from_the_store() -> None:
    # two workers on two nodes copy the version together, each owning half of its bundles:
    # between them they read from the store what the job reads, once
    job = Job(0, 0.0, 2, 8, "d", 2000.0, JobProfile(1.0, 1.0, 16_000, deadline=1e9))
    sim = _run("ours+stripe+early", 0.3, [job], nodes=2)
    assert len({w.node.index for w in sim.outcomes[0].workers}) == 2
    assert sim.storage_bytes == pytest.approx(0.3 * SIZE, rel=1e-3)
    assert sim.storage_by_cause["refetch"] == pytest.approx(0.0, abs=1.0)


def test_the_next_job_reads_what_the_copy_lacks() -> None:
    # two jobs one after the other on the one node, each reading 0.3 of an epoch: the second
    # finds 0.3 of the version and reads 0.3 x 0.7 more from the store
    sim = _run("ours+stripe+early", 0.3, [_job(0, 0.0), _job(1, 50_000.0)])
    assert sim.storage_bytes == pytest.approx((0.3 + 0.3 * 0.7) * SIZE, rel=1e-6)
    assert sim.storage_by_cause["refetch"] == pytest.approx(0.0, abs=1.0)


def test_without_start_before_whole_the_copy_is_read_whole() -> None:
    sim = _run("ours+stripe", 0.3, [_job(0, 0.0)])
    assert sim.storage_bytes == pytest.approx(SIZE, rel=1e-6)


def test_only_a_whole_copy_serves_peers_whole_copies() -> None:
    whole = _run("ours+stripe+early", 2.0, [_job(0, 0.0)])
    assert whole.ready_copies.get(("d", 0)), "a copy read to the end is whole: a peer source"
    part = _run("ours+stripe+early", 0.3, [_job(0, 0.0)])
    assert not part.ready_copies.get(("d", 0)), "a partial copy is no peer's whole copy"


@pytest.mark.parametrize("arrival", [20.0, 70.0], ids=["while-it-fills", "once-it-holds-its-part"])
def test_a_whole_copy_reads_what_another_nodes_partial_copy_holds_from_it_not_the_store(arrival: float) -> None:
    # at 100 MB/s a GPU, job 0 reads 0.3 of an epoch on one node (its copy's 75 GB take
    # 54 s from the store) and still runs when job 1 comes, to read two epochs on the other
    # node. Its copy takes the part the first node holds or is filling from that node (the
    # agent asks its peers before the store) and only the rest from the store
    jobs = [
        Job(0, 0.0, 1, 8, "d", 0.3 * SIZE / 8e8, JobProfile(1.0, 1.0, 750, deadline=1e9)),
        Job(1, arrival, 1, 8, "d", 2.0 * SIZE / 8e8, JobProfile(1.0, 1.0, 5000, deadline=1e9)),
    ]
    params = replace(
        ClusterParams(nodes=2, node_types=A100, cache_bytes=TB, storage_bw=1e10, node_fetch_bw=1e10),
        epochs=None, gpu_read_bw=1e8, gpu_read_mix=(),
    )  # fmt: skip
    sim = Simulation("ours+stripe+early", jobs, [Dataset("d", SIZE, (0.0,))], params, seed=3).run()
    assert [sim.outcomes[i].epochs for i in (0, 1)] == pytest.approx([0.3, 2.0])
    nodes = [next(w.node.index for w in sim.outcomes[i].workers) for i in (0, 1)]
    assert nodes[0] != nodes[1]
    assert sim.storage_bytes == pytest.approx(SIZE, rel=1e-6), "each byte from the store once"
    assert sim.storage_by_cause["refetch"] == pytest.approx(0.0, abs=1.0)
    assert sim.peer_bytes == pytest.approx(0.3 * SIZE, rel=1e-6)
    assert sim.nodes[nodes[1]].cache[("d", 0)].part == 1.0, "job 1's copy holds the whole version"


def test_partial_copies_hold_between_them_what_none_of_them_lacks() -> None:
    assert parts_held([0.3]) == pytest.approx(0.3)
    assert parts_held([0.3, 0.3]) == pytest.approx(1 - 0.7 * 0.7)
    assert parts_held([1.0, 0.2]) == 1.0 and parts_held([]) == 0.0


def test_a_whole_copy_takes_what_several_partial_copies_hold_between_them() -> None:
    # jobs 0 and 1 read 0.3 of an epoch each on two nodes (the second copy takes what the
    # first holds of its part and reads the rest from the store: 0.51 of the version in
    # all); job 2 then reads two epochs on a third node: 0.51 from the two copies, 0.49 from
    # the store. Each byte comes from the store once
    jobs = [Job(i, 100.0 * i, 1, 8, "d", 20_000.0, JobProfile(1.0, 1.0, 160_000, deadline=1e9)) for i in range(3)]
    params = replace(
        ClusterParams(nodes=3, node_types=A100, cache_bytes=TB, storage_bw=1e10, node_fetch_bw=1e10), epochs=1.0
    )
    sim = Simulation("ours+stripe+early", jobs, [Dataset("d", SIZE, (0.0,))], params, seed=3)
    for i, epochs in ((0, 0.3), (1, 0.3), (2, 2.0)):
        sim.outcomes[i].epochs = epochs
    sim.run()
    assert len({next(w.node.index for w in sim.outcomes[i].workers) for i in range(3)}) == 3
    assert sim.storage_bytes == pytest.approx(SIZE, rel=1e-6)
    assert sim.storage_by_cause["refetch"] == pytest.approx(0.0, abs=1.0)
    assert sim.peer_bytes == pytest.approx((0.3 * 0.3 + 0.51) * SIZE, rel=1e-6)


def store_reads_by_node(sim: Simulation) -> dict[int, float]:
    """Bytes each node is asked to read from the store, filled in as ``sim`` runs."""
    stored: dict[int, float] = {}
    created = sim._new_fetch

    def counted(node, key, size, **kw):  # type: ignore[no-untyped-def]
        if kw.get("source", "storage") == "storage":
            stored[node.index] = stored.get(node.index, 0.0) + size
        return created(node, key, size, **kw)

    sim._new_fetch = counted  # type: ignore[method-assign]
    return stored


def test_a_jobs_nodes_holding_part_of_the_version_copy_the_rest_together_with_the_others() -> None:
    # two of a four-node job's nodes hold 0.25 of the version each (earlier jobs read part of
    # an epoch there); the job reads two epochs. As the agents' swarm fetches it, every node
    # fetching the version takes its own share of the bundles none holds: the two partial
    # copies top up beside the two empty nodes, each of the four reads a quarter of what is
    # missing from the store, and the bytes the partial copies hold come from them (not all
    # of it read by one node, the other three taking it from that node as it comes in)
    key = ("d", 0)
    params = replace(
        ClusterParams(nodes=4, node_types=A100, cache_bytes=TB, storage_bw=1e10, node_fetch_bw=1e10), epochs=2.0
    )
    job = Job(0, 0.0, 4, 8, "d", 2000.0, JobProfile(1.0, 1.0, 16_000, deadline=1e9))
    sim = Simulation("ours+stripe+early", [job], [Dataset("d", SIZE, (0.0,))], params, seed=3)
    for i in (0, 1):
        sim.nodes[i].cache[key] = CacheEntry("d", 0, SIZE, 0.0, ready=True, part=0.25)
    stored = store_reads_by_node(sim)
    sim.run()
    assert {w.node.index for w in sim.outcomes[0].workers} == {0, 1, 2, 3}
    missing = (1 - parts_held([0.25, 0.25])) * SIZE
    assert sim.storage_bytes == pytest.approx(missing, rel=1e-6), "each missing byte from the store once"
    assert sorted(stored) == [0, 1, 2, 3], "every node fetching the version reads its share from the store"
    assert max(stored.values()) == pytest.approx(missing / 4, rel=1e-6)
    assert all(sim.nodes[i].cache[key].ready and sim.nodes[i].cache[key].part == 1.0 for i in range(4))
