"""The simulator's opt-in next-job preparation hook (docs/design.md#next-job-preparation): the
product's policy predicts where a waiting job starts and its data is fetched there before the
running job ends."""

from __future__ import annotations

import pytest

from scheduling.timemodel import JobProfile
from tools.sim.engine import ClusterParams, Simulation
from tools.sim.workload import Dataset, Job

pytestmark = pytest.mark.slow

A100 = (("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 1.0),)
GB, TB = 10**9, 10**12


def job(ident: int, arrival: float, dataset: str, runtime: float) -> Job:
    steps = int(runtime) * 8
    return Job(ident, arrival, 1, 8, dataset, runtime, JobProfile(1.0, 1.0, steps, deadline=1e9, workers=1))


@pytest.mark.parametrize("prepare", [False, True], ids=["without", "with-preparation"])
def test_the_queued_jobs_data_is_ready_when_the_running_job_ends(prepare: bool) -> None:
    # one 8-GPU node: job 0 fetches 1 TB (1,000 s at 1 GB/s) and runs 2,000 s, ending at
    # t=3,000; job 1 (100 GB, another dataset) waits for the GPUs from t=10
    data = [Dataset("ds000", TB, (0.0,)), Dataset("ds001", 100 * GB, (0.0,))]
    params = ClusterParams(
        nodes=1, node_types=A100, cache_bytes=4 * TB, storage_bw=1e9, node_fetch_bw=1e9, prepare_next=prepare
    )
    sim = Simulation("ours", [job(0, 0.0, "ds000", 2000.0), job(1, 10.0, "ds001", 500.0)], data, params, 3).run()
    first, second = sim.outcomes[0], sim.outcomes[1]
    assert first.end == pytest.approx(3000.0)
    assert second.start == pytest.approx(3000.0)
    if prepare:  # fetched within the lead time before t=3,000: a hit, the first step at once
        assert second.workers[0].hit and second.first_step == pytest.approx(3000.0)
    else:
        assert not second.workers[0].hit and second.first_step == pytest.approx(3100.0)
    assert sim.storage_bytes == TB + 100 * GB  # read once either way


def test_a_preparation_the_plan_drops_becomes_evictable() -> None:
    data = [Dataset("ds000", TB, (0.0,)), Dataset("ds001", 100 * GB, (0.0,))]
    params = ClusterParams(
        nodes=1, node_types=A100, cache_bytes=4 * TB, storage_bw=1e9, node_fetch_bw=1e9, prepare_next=True
    )
    sim = Simulation("ours", [job(0, 0.0, "ds000", 2000.0), job(1, 10.0, "ds001", 500.0)], data, params, 3).run()
    # after both ran, nothing is held for a waiting job any more
    assert not any(e.prepared for n in sim.nodes for e in n.cache.values())


def test_the_comparison_runs_the_baselines_and_judges_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    from tools.sim import prepare

    assert prepare.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[2].strip() for line in out.splitlines() if line.startswith("| smoke |")]
    assert rows == list(prepare.POLICIES)
    assert "on by default: " in out


def test_a_loss_is_any_figure_worse_than_ours_past_the_tolerance() -> None:
    from tools.sim.prepare import losses

    ours = {"ttfs_mean_s": 100.0, "storage_bytes": 1e12, "deadline_misses": 0}
    assert losses(ours, dict(ours)) == []
    assert losses(ours, {**ours, "ttfs_mean_s": 100.4}) == []  # within 0.5%
    assert losses(ours, {**ours, "ttfs_mean_s": 90.0}) == []  # better
    assert losses(ours, {**ours, "storage_bytes": 1.1e12}) == ["storage TB 1 -> 1.1"]
    assert losses(ours, {**ours, "deadline_misses": 1}) == ["deadline misses 0 -> 1"]
