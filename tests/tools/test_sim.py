"""The cluster simulator: small scenarios whose outcome is known by hand, and the smoke run."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scheduling.timemodel import JobProfile
from tools.sim.engine import ClusterParams, Simulation
from tools.sim.report import FIELDS, metrics, table
from tools.sim.run import DEFAULT_POLICIES
from tools.sim.workload import Dataset, Job, WorkloadParams, make_jobs

REPO = Path(__file__).resolve().parents[2]
A100 = (("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 1.0),)
TB = 10**12


def job(
    ident: int,
    arrival: float,
    dataset: str = "ds000",
    *,
    workers: int = 1,
    gpus: int = 2,
    runtime: float = 1000.0,
    deadline: float = 1e9,
) -> Job:
    # no communication cost (tiny gradients), 1 s steps: runtime = steps / GPUs exactly
    steps = int(runtime) * workers * gpus
    return Job(
        ident, arrival, workers, gpus, dataset, runtime, JobProfile(1.0, 1.0, steps, deadline=deadline, workers=workers)
    )


def cluster(nodes: int = 2, cache: int = 4 * TB) -> ClusterParams:
    # one epoch per job: the bytes below are each job's dataset, read once
    return ClusterParams(nodes=nodes, node_types=A100, cache_bytes=cache, storage_bw=1e9, node_fetch_bw=1e9, epochs=1.0)


def run(policy: str, jobs: list[Job], datasets: list[Dataset], params: ClusterParams) -> Simulation:
    return Simulation(policy, jobs, datasets, params, seed=3).run()


def test_second_job_on_a_dataset_hits_the_cache_only_where_the_data_is() -> None:
    # 1 TB at 1 GB/s: the first job waits 1,000 s for its data, runs 1,000 s; the second
    # arrives later. Ours sends it to the node holding the data: a hit, no second read.
    # The no-cache baseline reads it again, streaming as a direct-mode pod does: its first
    # step at once, its 1,000 s of reading overlapped with its 1,000 s of compute.
    data = [Dataset("ds000", TB, (0.0,))]
    jobs = [job(0, 0.0), job(1, 5000.0)]
    ours = run("ours", jobs, data, cluster())
    assert (ours.requests, ours.hits, ours.storage_bytes) == (2, 1, TB)
    first, second = ours.outcomes[0], ours.outcomes[1]
    assert first.first_step == pytest.approx(1000.0) and first.end == pytest.approx(2000.0)
    assert second.first_step == pytest.approx(5000.0) and second.workers[0].node is first.workers[0].node
    default = run("default", jobs, data, cluster())
    assert (default.hits, default.storage_bytes) == (0, 2 * TB)
    assert default.outcomes[1].first_step == pytest.approx(5000.0)
    assert default.outcomes[1].end == pytest.approx(6000.0)
    m = metrics(ours)
    assert m["hit_ratio"] == 0.5 and m["idle_gpu_h"] == pytest.approx(2 * 1000 / 3600)


def test_fluid_follows_its_label_to_an_old_version() -> None:
    # The dataset gets a new version at t=3000. Fluid's label (name only) still sends the
    # second job to its cache worker's node, which holds the old version's blocks: its first
    # epoch reads the new version from storage, filling the runtime's quota with it.
    data = [Dataset("ds000", TB, (0.0, 3000.0))]
    jobs = [job(0, 0.0), job(1, 5000.0)]
    fluid = run("fluid", jobs, data, cluster())
    assert fluid.outcomes[1].workers[0].node is fluid.outcomes[0].workers[0].node
    assert fluid.hits == 0 and fluid.storage_bytes == 2 * TB
    node = fluid.outcomes[0].workers[0].node
    runtime = fluid.fluid.runtimes["ds000"]
    assert runtime.workers == (node.index,) and runtime.version == 1 and node.labels == {"ds000"}
    assert runtime.held == {node.index: TB}


def test_eviction_makes_room_least_recently_used_first() -> None:
    # One node, a 2.5 TB cache, three 1 TB datasets used one after the other: the third
    # fetch needs 1.2 TB free (the agent's ratio), so the least recently used goes.
    data = [Dataset(f"ds00{i}", TB, (0.0,)) for i in range(3)]
    jobs = [job(i, 10_000.0 * i, f"ds00{i}") for i in range(3)]
    sim = run("ours", jobs, data, cluster(nodes=1, cache=int(2.5 * TB)))
    node = sim.nodes[0]
    assert sorted(k[0] for k in node.cache) == ["ds001", "ds002"]


def test_multi_worker_jobs_stay_in_one_subnet_under_ours() -> None:
    # Two workers of 2 GPUs on two DGX-A100-class nodes (classes of 2 GPUs): the job's
    # class is voted once and both workers take their GPUs from it.
    data = [Dataset("ds000", 10**9, (0.0,))]
    sim = run("ours", [job(0, 0.0, workers=2, gpus=2)], data, cluster())
    out = sim.outcomes[0]
    assert len(out.workers) == 2 and not out.spans_subnets
    assert out.workers[0].classes == out.workers[1].classes and len(out.workers[0].classes) == 1
    assert out.numa_split == 0


def test_time_model_packs_a_job_whose_communication_does_not_pay_off() -> None:
    # 2 workers x 2 GPUs with 100 GB of gradients: across the network (12.5 GB/s) a step
    # would cost 12 s of communication for 1 s of compute; on one NVLinked node 0.5 s.
    # ours+time runs it on one node; ours keeps the two workers the job asked for.
    heavy = Job(0, 0.0, 2, 2, "ds000", 1000.0, JobProfile(100e9, 1.0, 4000, deadline=1e9, workers=2))
    data = [Dataset("ds000", 10**9, (0.0,))]
    timed = run("ours+time", [heavy], data, cluster()).outcomes[0]
    assert len(timed.workers) == 1 and timed.plan_gpus in (1, 2, 4)
    plain = run("ours", [heavy], data, cluster()).outcomes[0]
    assert len(plain.workers) == 2
    assert timed.end < plain.end


def test_workload_is_deterministic_for_a_seed_and_uses_the_philly_run_times() -> None:
    params = WorkloadParams(jobs=50, datasets=10)
    a, _ = make_jobs(params, 160, seed=5)
    b, _ = make_jobs(params, 160, seed=5)
    c, _ = make_jobs(params, 160, seed=6)
    assert [(j.arrival, j.dataset, j.profile) for j in a] == [(j.arrival, j.dataset, j.profile) for j in b]
    assert [j.arrival for j in a] != [j.arrival for j in c]
    assert all(j.profile.deadline is not None and j.profile.deadline > j.arrival for j in a)


@pytest.mark.slow
def test_smoke_run_completes_and_prints_its_table(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    policies = ("default", "fluid", "fluid-r4", "juicefs", "ours", "ours+time", "ours+stripe")
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "sim" / "run.py"),
            "--smoke",
            "--procs",
            "1",
            "--json",
            str(out),
            "--policies",
            ",".join(policies),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("| policy | local bytes") for line in lines)
    for policy in policies:
        assert any(line.startswith(f"| {policy} |") for line in lines), policy
    assert "ours: store bytes <= 1.0x the best Fluid setting" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["workload"]["jobs"]["count"] == 150 and set(doc["policies"]) == set(policies)
    assert {r["key"] for r in doc["rates"]} >= {"store_read_bytes_per_s_per_node", "fuse_throughput_factor"}
    assert all(r["source"] for r in doc["rates"]) and all(n["source"] for n in doc["nic_bytes_per_s"])
    assert any("min_runtime_s" in line for line in doc["input_changes"])  # Philly has jobs under 60 s
    for policy, figures in doc["policies"].items():
        assert set(FIELDS) == set(figures), policy
        assert figures["finished"] == 150 and figures["deadline_jobs"] == 150
        assert figures["jobs_across_subnets_avoidable"] <= figures["jobs_across_subnets"]
        assert figures["jobs_across_subnets"] <= figures["jobs_multi_worker"]
    assert doc["policies"]["default"]["hit_ratio"] == 0 and doc["policies"]["ours"]["hit_ratio"] > 0
    assert doc["policies"]["default"]["local_fraction"] == 0 and doc["policies"]["ours"]["local_fraction"] > 0.9
    assert set(DEFAULT_POLICIES) >= set(policies) - {"fluid"} and "fluid-r1" in DEFAULT_POLICIES


def test_table_formats_one_row_per_policy() -> None:
    data = [Dataset("ds000", 10**9, (0.0,))]
    text = table([metrics(run("ours", [job(0, 0.0)], data, cluster()))])
    assert text.count("\n") == 2 and "| ours | 100.0% |" in text


def test_peers_serve_a_ready_copy_instead_of_storage() -> None:
    # Job 0 holds node A's 8 GPUs for a long time; job 1 (same dataset, 8 GPUs) must go to
    # node B. With peers its agent reads A's ready copy: storage is read once. Without
    # peers, twice.
    data = [Dataset("ds000", TB, (0.0,))]
    jobs = [job(0, 0.0, gpus=8, runtime=50_000.0), job(1, 5000.0, gpus=8)]
    with_peers = run("ours", jobs, data, cluster())
    assert with_peers.outcomes[0].workers[0].node is not with_peers.outcomes[1].workers[0].node
    assert (with_peers.storage_bytes, with_peers.peer_bytes, with_peers.hits) == (TB, TB, 0)
    alone = run("ours", jobs, data, replace(cluster(), peers=False))
    assert (alone.storage_bytes, alone.peer_bytes) == (2 * TB, 0)
    # both nodes now hold it: each sees one copy elsewhere
    a, b = (with_peers.outcomes[i].workers[0].node for i in (0, 1))
    assert with_peers.copies_elsewhere(a, ("ds000", 0)) == 1 == with_peers.copies_elsewhere(b, ("ds000", 0))


def test_a_node_serving_two_peers_splits_its_upload() -> None:
    # Node A holds the copy; jobs 1 and 2 start together on B and C and read from A, whose
    # 1 GB/s of upload they share: 2,000 s each. With uploads unbounded, 1,000 s.
    data = [Dataset("ds000", TB, (0.0,))]
    jobs = [job(0, 0.0, gpus=8, runtime=50_000.0), job(1, 5000.0, gpus=8), job(2, 5000.0, gpus=8)]
    shared = run("ours", jobs, data, replace(cluster(nodes=3), node_serve_bw=1e9))
    assert (shared.storage_bytes, shared.peer_bytes) == (TB, 2 * TB)
    assert [shared.outcomes[i].first_step for i in (1, 2)] == [pytest.approx(7000.0)] * 2
    wide = run("ours", jobs, data, replace(cluster(nodes=3), node_serve_bw=1e12))
    assert [wide.outcomes[i].first_step for i in (1, 2)] == [pytest.approx(6000.0)] * 2


def test_agents_starting_together_read_storage_once() -> None:
    # Two 8-GPU jobs at once on two nodes: the second agent reads from the first as its
    # bundles arrive, never faster than they come.
    data = [Dataset("ds000", TB, (0.0,))]
    sim = run("ours", [job(0, 0.0, gpus=8), job(1, 0.0, gpus=8)], data, cluster())
    assert (sim.storage_bytes, sim.peer_bytes) == (TB, TB)
    assert sim.outcomes[1].first_step >= sim.outcomes[0].first_step == pytest.approx(1000.0)


def test_fluid_pods_off_the_cache_node_read_the_runtime_not_storage() -> None:
    # Fluid's runtime for ds000 sits on job 0's node. Job 1 must go elsewhere (8 GPUs busy):
    # it streams from the cache worker (no storage bytes, not a hit) and starts at once.
    data = [Dataset("ds000", TB, (0.0,))]
    jobs = [job(0, 0.0, gpus=8, runtime=50_000.0), job(1, 5000.0, gpus=8)]
    sim = run("fluid", jobs, data, cluster())
    assert (sim.storage_bytes, sim.peer_bytes, sim.hits) == (TB, TB, 0)
    assert sim.outcomes[1].first_step == pytest.approx(5000.0)
    assert sim.outcomes[0].first_step == pytest.approx(0.0)  # FUSE: trains while reading


def test_a_direct_mode_job_ends_when_its_reading_ends() -> None:
    # 100 s of compute, 1 TB to stream at 1 GB/s: the job ends at 1,000 s and its GPUs
    # idled 900 s for data; with two epochs it reads 2 TB.
    data = [Dataset("ds000", TB, (0.0,))]
    sim = run("default", [job(0, 0.0, gpus=2, runtime=100.0)], data, cluster())
    out = sim.outcomes[0]
    assert out.first_step == pytest.approx(0.0) and out.end == pytest.approx(1000.0)
    assert metrics(sim)["idle_gpu_h"] == pytest.approx(2 * 900 / 3600)
    twice = run("default", [job(0, 0.0, gpus=2, runtime=100.0)], data, replace(cluster(), epochs=2.0))
    assert twice.storage_bytes == 2 * TB and twice.outcomes[0].end == pytest.approx(2000.0)


def test_a_training_read_goes_no_faster_than_the_jobs_steps_take_its_bytes() -> None:
    # 100 GB read from the store at 1 GB/s could be done in 100 s, but a pod's loader reads
    # only ahead of its 1,000 s of steps: the read ends with the compute, not before, so a
    # second job's read sharing the store later finds it still taking its pace
    data = [Dataset("ds000", 100 * 10**9, (0.0,))]
    sim = Simulation("default", [job(0, 0.0)], data, cluster(), seed=3)
    done: list[float] = []
    stream_done = sim._stream_done

    def recording(out):  # type: ignore[no-untyped-def]
        done.append(sim.now)
        stream_done(out)

    sim._stream_done = recording  # type: ignore[method-assign]
    out = sim.run().outcomes[0]
    assert done and done[-1] == pytest.approx(out.compute_end, rel=1e-9)
    assert out.end == pytest.approx(out.compute_end) and out.compute_end - out.first_step == pytest.approx(1000.0)
