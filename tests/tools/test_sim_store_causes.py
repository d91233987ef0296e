"""Store bytes by cause: every byte the simulator reads from the store is a first fill, a
fetch again of bytes the cluster had kept, a lost stripe member's, or a read nobody keeps;
and a job's ranks reading disjoint parts of a group member's bundles each read their own
misses from the store.

Small clusters of identical nodes (8 GPUs), fixed epochs, asserting bytes by cause.
"""

from __future__ import annotations

import pytest

from scheduling.timemodel import JobProfile
from tests.tools.test_sim_stripe import TB, run
from tests.tools.test_sim_stripe import cluster as stripe_cluster
from tools.sim import results
from tools.sim.engine import ClusterParams, Simulation
from tools.sim.state import STORE_CAUSES
from tools.sim.workload import Dataset, Job


def job(ident: int, arrival: float, dataset: str = "ds000", *, workers: int = 1, runtime: float = 1000.0) -> Job:
    return Job(ident, arrival, workers, 8, dataset, runtime, JobProfile(1.0, 1.0, int(runtime) * 8, deadline=1e9))


def cluster(nodes: int = 4, cache: int = TB, **kw: object) -> ClusterParams:
    """``test_sim_stripe``'s cluster, one epoch unless said otherwise."""
    return stripe_cluster(nodes, cache, **{"epochs": 1.0, **kw})


def test_two_ranks_reading_a_members_bundles_read_every_bundle_from_the_store_once() -> None:
    # 3 TB on four 1 TB nodes: a group of four, two of them outside the two-worker job; its
    # ranks read disjoint halves of those members' bundles, so one epoch reads all 3 TB
    sim = run("ours+stripe+early", [job(0, 0.0, workers=2)], [Dataset("ds000", 3 * TB, (0.0,))], cluster())
    group = sim.stripes[("ds000", 0)]
    outside = set(group.members) - {w.node.index for w in sim.outcomes[0].workers}
    assert len(outside) == 2
    assert sim.storage_bytes == pytest.approx(3 * TB)
    assert sim.storage_by_cause["first_fill"] == pytest.approx(3 * TB)
    assert group.fill == {m: pytest.approx(1.0) for m in group.members}


def test_a_copy_evicted_and_fetched_again_is_counted_apart_from_its_first_fill() -> None:
    # one 1 TB node: 0.5 TB versions of two datasets in turn; the third job's copy of ds000
    # was evicted for ds001's, so it is read from the store again
    data = [Dataset("ds000", TB // 2, (0.0,)), Dataset("ds001", TB // 2, (0.0,))]
    jobs = [job(0, 0.0, "ds000"), job(1, 10_000.0, "ds001"), job(2, 20_000.0, "ds000")]
    sim = run("ours", jobs, data, cluster(nodes=1))
    assert sim.storage_by_cause["first_fill"] == pytest.approx(TB)
    assert sim.storage_by_cause["refetch"] == pytest.approx(TB / 2)
    assert sum(sim.storage_by_cause.values()) == pytest.approx(sim.storage_bytes)


def test_reads_without_a_cache_are_counted_as_not_kept() -> None:
    sim = run("default", [job(0, 0.0), job(1, 10_000.0)], [Dataset("ds000", TB // 2, (0.0,))], cluster(nodes=1))
    assert sim.storage_by_cause["uncached"] == pytest.approx(TB)
    assert sim.storage_by_cause["first_fill"] == 0.0 and sim.storage_bytes == pytest.approx(TB)


def test_the_results_page_lists_store_bytes_by_cause() -> None:
    figures = {"ours+stripe": {"storage_bytes_by_cause": {c: float(i) * TB for i, c in enumerate(STORE_CAUSES)}}}
    lines = results.causes({"policies": figures})
    assert "| policy | first fill | fetched again | lost member | not kept |" in lines
    assert "| ours+stripe | 0.00 | 1.00 | 2.00 | 3.00 |" in lines
    assert results.causes({"policies": {"fluid": {"storage_bytes": 1.0}}}) == []


def test_a_ratio_that_rounds_to_its_target_shows_which_side_it_falls() -> None:
    def figures(store: float, local: float) -> dict[str, float]:
        return {"local_fraction": local, "storage_bytes": store, "ttfs_mean_s": 10.0, "gpu_hours_idle_for_data": 1.0,
                "jct_mean_s": 100.0, "jobs_across_subnets_avoidable": 0}  # fmt: skip

    doc = {"policies": {"fluid-r1": figures(10 * TB, 0.2), "ours+stripe+early": figures(10.008 * TB, 0.6)}}
    (row,) = [line for line in results.goals({"w": doc}) if line.startswith("| w |")]
    assert row.startswith("| w | 3.00x (fluid-r1) | **1.0008x (fluid-r1)** | 1.00x (fluid-r1) |")


def test_fluid_reads_its_cache_could_not_keep_are_counted_as_not_kept() -> None:
    # one replica with a 1 TB quota and a 1.5 TB dataset over three epochs: the first epoch
    # fills the quota, the later epochs read the rest from the store again, kept by nobody
    sim = run("fluid-r1", [job(0, 0.0)], [Dataset("ds000", 3 * TB // 2, (0.0,))], cluster(nodes=1, epochs=3.0))
    assert sim.storage_by_cause["first_fill"] == pytest.approx(1.5 * TB)
    assert sim.storage_by_cause["uncached"] == pytest.approx(sim.storage_bytes - 1.5 * TB)
    assert sim.storage_by_cause["uncached"] > 0.5 * TB and sim.storage_by_cause["refetch"] == 0.0


def test_a_start_before_whole_pod_reads_the_version_it_was_admitted_with() -> None:
    # a job arriving at 50 s that gets its GPUs at 200 s, after a new version at 100 s: a
    # pod that waits for its copy resolves the version when it starts; one that starts
    # before the copy is whole reads the digest the webhook wrote into it at admission
    data = [Dataset("ds000", TB // 2, (0.0, 100.0))]
    late = job(0, 50.0)
    assert Simulation("ours+stripe", [late], data, cluster(), seed=3).version_of(late, 200.0) == 1
    assert Simulation("ours+stripe+early", [late], data, cluster(), seed=3).version_of(late, 200.0) == 0
    assert Simulation("fluid", [late], data, cluster(), seed=3).version_of(late, 200.0) == 1


def test_a_version_another_node_is_still_fetching_is_read_from_it_not_again_from_the_store() -> None:
    # node A: job 0 holds 700 GB of its 1 TB cache; node B: job 1 fetches ds001 (700 s at
    # 1 GB/s); job 2 reads ds001 on node A at 100 s, where it has no room: through a group
    # in which A owns nothing and B, holding the copy, owns every bundle, so A reads B's copy
    # as its bundles land and ds001 comes from the store once
    data = [Dataset("ds000", 700 * 10**9, (0.0,)), Dataset("ds001", 700 * 10**9, (0.0,))]
    jobs = [
        Job(0, 0.0, 1, 4, "ds000", 100_000.0, JobProfile(1.0, 1.0, 400_000, deadline=1e9)),
        job(1, 0.0, "ds001", runtime=100_000.0),
        Job(2, 100.0, 1, 4, "ds001", 1000.0, JobProfile(1.0, 1.0, 4000, deadline=1e9)),
    ]
    sim = run("ours+stripe", jobs, data, cluster(nodes=2, epochs=3.0))
    assert sim.outcomes[2].workers[0].node.index == sim.outcomes[0].workers[0].node.index
    a, b = sim.outcomes[0].workers[0].node.index, sim.outcomes[1].workers[0].node.index
    assert sim.storage_bytes == pytest.approx(1400 * 10**9)
    group = sim.stripes[("ds001", 0)]
    assert group.shareless == {a} and {m for m, owned in group.owned.items() if owned > 0} == {b}
    assert sim.storage_by_cause["refetch"] == 0.0
    assert sim.read_peer[0] + sim.read_peer[1] == pytest.approx(3 * 700 * 10**9)
