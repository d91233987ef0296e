"""The simulator's hooks for issue 25's cluster-side policies beyond eviction: replication
(``ours+replicas``, docs/design.md#replication) and where a controller task's copy comes from
(peers first, as the agent fetches every task's data)."""

from __future__ import annotations

import pytest

from scheduling.timemodel import JobProfile
from tools.sim.engine import CacheEntry, ClusterParams, Simulation
from tools.sim.workload import Dataset, Job

A100 = (("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 1.0),)
GB, TB = 10**9, 10**12


def job(ident: int, arrival: float, dataset: str, runtime: float, gpus: int = 8) -> Job:
    steps = int(runtime) * gpus
    return Job(ident, arrival, 1, gpus, dataset, runtime, JobProfile(1.0, 1.0, steps, deadline=1e9, workers=1))


def params(nodes: int, **kw: object) -> ClusterParams:
    return ClusterParams(
        nodes=nodes,
        node_types=A100,
        cache_bytes=4 * TB,
        storage_bw=1e9,
        node_fetch_bw=1e9,
        **kw,  # type: ignore[arg-type]
    )


def test_replicas_follow_the_demand_from_peers_and_are_released_when_it_falls() -> None:
    # three 2-GPU jobs on one dataset want three copies (pods started within the hour); ours
    # packs them on one node, replication warms the other two from that node, not the store;
    # a job on another dataset hours later finds no demand left: the copies are released
    data = [Dataset("ds000", 100 * GB, (0.0,)), Dataset("ds001", 10 * GB, (0.0,))]
    jobs = [job(i, 0.0, "ds000", 3000.0, gpus=2) for i in range(3)] + [job(3, 20_000.0, "ds001", 100.0)]
    sim = Simulation("ours+replicas", jobs, data, params(3), 5).run()
    assert sim.ready_copies[("ds000", 0)] == {0, 1, 2}  # every node holds it
    assert sim.storage_bytes == 110 * GB  # each version read from storage once
    assert sim.task_fetch_bytes.get("replica", 0) > 0 and sim.peer_bytes >= sim.task_fetch_bytes["replica"]
    assert not any(e.replica for n in sim.nodes for (name, _), e in n.cache.items() if name == "ds000")
    plain = Simulation("ours", jobs, data, params(3), 5).run()
    assert len(plain.ready_copies[("ds000", 0)]) < 3  # without replication fewer copies


def test_a_replica_is_in_use_for_eviction() -> None:
    assert CacheEntry("d", 0, 1, 0.0, replica=True).in_use
    assert CacheEntry("d", 0, 1, 0.0, prepared=True).in_use
    assert not CacheEntry("d", 0, 1, 0.0).in_use


@pytest.mark.parametrize("policy", ["ours+prepare", "ours+replicas"])
def test_the_variants_keep_ours_cluster_aware_eviction(policy: str) -> None:
    data = [Dataset("ds000", 10 * GB, (0.0,))]
    sim = Simulation(policy, [job(0, 0.0, "ds000", 100.0)], data, params(1), 1).run()
    assert sim.policy == policy and sim.outcomes[0].end > 0


def test_a_prepared_copy_comes_from_the_peer_that_holds_it() -> None:
    # two nodes: job 0 (ds000) ends at ~2,200 s, job 1 (ds001) runs long on the other node;
    # job 2 wants ds001 and waits for job 0's node: its copy is prepared there from job 1's
    # node (P2P), so each dataset is read from storage once (the prepare fetch read the store
    # before, 300 GB)
    data = [Dataset("ds000", 100 * GB, (0.0,)), Dataset("ds001", 100 * GB, (0.0,))]
    jobs = [job(0, 0.0, "ds000", 2000.0), job(1, 0.0, "ds001", 9000.0), job(2, 10.0, "ds001", 100.0)]
    sim = Simulation("ours+prepare", jobs, data, params(2), 3).run()
    third = sim.outcomes[2]
    assert third.workers[0].hit and third.first_step == pytest.approx(third.start)
    assert sim.storage_bytes == 200 * GB
    assert sim.task_fetch_bytes["prepare"] == 100 * GB == sim.task_used_bytes["prepare"]
