"""The time model and plan decision on scenarios whose outcome is computed by hand."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpu_topology.dumps import load_dump
from scheduling import timemodel as tm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
NET = tm.DEFAULT_BANDWIDTHS.network  # 12.5 GB/s


def job(**kw: object) -> tm.JobProfile:
    base: dict[str, object] = {"gradient_bytes": 1e6, "step_seconds": 1.0, "steps": 80, "deadline": 25.0}
    base.update(kw)
    return tm.JobProfile(**base)  # type: ignore[arg-type]


def test_ring_allreduce_and_run_time_by_hand() -> None:
    assert tm.t_comm(1e9, 1, 1e9) == 0.0
    assert tm.t_comm(1e9, 2, 1e9) == pytest.approx(1.0)  # 2 x 1/2 x 1 s
    assert tm.t_comm(1e9, 4, 1e9) == pytest.approx(1.5)  # 2 x 3/4 x 1 s
    j = tm.JobProfile(gradient_bytes=1e9, step_seconds=0.5, steps=100)
    assert tm.t_run(j, 4, math.inf) == pytest.approx(0.5 * 25)
    assert tm.t_run(j, 3, 1e9) == pytest.approx((0.5 + 2 * 2 / 3) * 34)  # ceil(100 / 3) = 34
    assert tm.steps_at(100, 3) == 34


def test_spreading_pays_off_only_when_communication_is_cheaper_than_saved_compute() -> None:
    # t_comm(2) = 1 x gradient / 12.5 GB/s: 1 GB -> 0.08 s < 0.1 s; 2 GB -> 0.16 s > 0.1 s
    assert tm.pays_off(tm.JobProfile(1e9, 0.1, 10), 2, NET)
    assert not tm.pays_off(tm.JobProfile(2e9, 0.1, 10), 2, NET)
    assert tm.pays_off(tm.JobProfile(2e9, 0.1, 10), 1, NET)


def test_bandwidth_from_real_topologies() -> None:
    a100 = load_dump(FIXTURES / "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt")
    v100 = load_dump(FIXTURES / "dgx1-v100-4ib-nvidia-smi-topo-m.txt")
    assert tm.intra_node_bandwidth(a100, [0, 1]) == 12 * 25e9  # NV12
    assert tm.intra_node_bandwidth(v100, [0, 1]) == 25e9  # NV1
    assert tm.intra_node_bandwidth(v100, [0, 1, 7]) == tm.DEFAULT_BANDWIDTHS.sys  # GPU0-GPU7 is SYS
    assert tm.intra_node_bandwidth(a100, [3]) == math.inf
    assert tm.plan_bandwidth([300e9]) == 300e9
    assert tm.plan_bandwidth([300e9, 300e9]) == NET
    assert tm.plan_bandwidth([8e9, 300e9]) == 8e9


def bw_of(allocation: tuple[tuple[str, int], ...]) -> float:
    return 300e9 if len(allocation) == 1 else NET


def test_best_fit_and_least_free_first() -> None:
    order = tm.best_fit_order({"a": 4, "b": 1, "c": 2, "d": 0})
    assert order == [("b", 1), ("c", 2), ("a", 4)]
    assert tm.allocate_single(order, 2) == (("c", 2),)
    assert tm.allocate_single(order, 5) is None
    assert tm.allocate_cross(order, 5) == (("b", 1), ("c", 2), ("a", 2))
    assert tm.allocate_cross(order, 8) is None
    assert tm.best_fit_order({"x": 2, "y": 2}, prefer={"y": 1.0})[0] == ("y", 2)


def test_cross_node_expected_plan_uses_the_fragment_first() -> None:
    # 80 one-second steps, deadline 25 s: 4 GPUs (20 s) meet it, 3 (27 s) do not. No node
    # has 4 free GPUs; node b's one GPU is a fragment: the cross-node expected plan takes it
    # first, least-free first (3.4 branch 1, 4.3).
    d = tm.decide(job(), {"a": 3, "b": 1}, bw_of, now=0.0, max_gpus=4)
    assert d.branch == "cross-expected"
    assert d.plan is not None and d.plan.allocation == (("b", 1), ("a", 3))
    assert d.plan.meets_deadline and "single-expected" not in d.candidates


def test_cross_node_plan_only_when_it_ends_no_later_than_one_node() -> None:
    # Node a could hold all 4 GPUs: the cross plan (b1 + a3, over the network) ends a
    # little later than 4 GPUs on a's NVLink, so the project rule keeps the job on one node.
    d = tm.decide(job(), {"a": 4, "b": 1}, bw_of, now=0.0, max_gpus=4)
    assert d.branch == "single-expected" and d.plan is not None and d.plan.allocation == (("a", 4),)
    assert d.candidates["cross-expected"].t_end > d.plan.t_end
    # a plan waiting for data starts late: a lacks the data (100 s to fetch), b holds it.
    # With a 200 s deadline one GPU on b (80 s, slack 120 s per GPU) beats four on a
    # (100 + 20 s, slack 20 s per GPU) by (12).
    slow = tm.decide(
        job(deadline=200.0),
        {"a": 4, "b": 1},
        bw_of,
        now=0.0,
        max_gpus=4,
        start_of=lambda alloc: 100.0 if any(n == "a" for n, _ in alloc) else 0.0,
    )
    assert slow.plan is not None and slow.plan.allocation == (("b", 1),) and slow.plan.t_end == pytest.approx(80.0)
    assert slow.candidates["single-expected"] is slow.plan


def test_single_node_expected_without_fragments_and_late_plans() -> None:
    d = tm.decide(job(), {"a": 4}, bw_of, now=0.0, max_gpus=4)
    assert (d.branch, d.plan.allocation if d.plan else None) == ("single-expected", (("a", 4),))
    late = tm.decide(job(deadline=5.0), {"a": 4}, bw_of, now=0.0, max_gpus=4)
    assert late.branch == "single-late"
    assert late.plan is not None and late.plan.n_gpu == 4 and late.plan.t_end == pytest.approx(20.0, rel=1e-3)
    assert tm.decide(job(), {}, bw_of, now=0.0, max_gpus=4).plan is None


def test_plans_that_do_not_pay_off_are_dropped() -> None:
    # 1 TB of gradients, 1 s steps: even NVLink (300 GB/s) costs 3.3 s per step on 2 GPUs,
    # more than the 1 s saved: only the one-GPU plan is left.
    heavy = job(gradient_bytes=1e12, deadline=1e9)
    d = tm.decide(heavy, {"a": 2, "b": 2}, bw_of, now=0.0, max_gpus=4)
    assert d.plan is not None and d.plan.n_gpu == 1 and d.branch == "single-expected"


def test_queue_order_closest_to_deadline_first_then_late_by_end() -> None:
    def decision(t_end: float, deadline: float) -> tm.Decision:
        return tm.Decision(tm.Plan((("a", 1),), t_end, t_end, deadline), "single-expected")

    order = tm.queue_order(
        [
            ("roomy", decision(10, 100)),
            ("tight", decision(10, 11)),
            ("late-far", decision(50, 10)),
            ("late-near", decision(20, 10)),
            ("none", tm.Decision(None, "none")),
        ]
    )
    assert order == ["tight", "roomy", "late-near", "late-far", "none"]


def test_node_score_tiers() -> None:
    j = job(deadline=25.0)
    # 4 GPUs on NVLink: 20 s, meets; exact fit (no leftover), full speed -> 6 + 2 + 2
    assert tm.node_score(j, 4, 300e9, 300e9, 4, now=0.0) == 10
    # same but 4 GPUs left over: fit 1/5 -> 6 + round(2 + 0.4) = 8
    assert tm.node_score(j, 4, 300e9, 300e9, 8, now=0.0) == 8
    # too late: lower tier
    assert tm.node_score(j, 4, 300e9, 300e9, 4, now=10.0) == 5
    assert tm.node_score(j, 4, 300e9, 300e9, 3, now=0.0) == 0


def test_annotations_parse_and_refuse_hostile_values() -> None:
    profile, error = tm.parse_profile(
        {
            "dsagent.io/params": "350M",
            "dsagent.io/step-seconds": "250ms",
            "dsagent.io/steps": "1e5",
            "dsagent.io/deadline": "6h",
            "dsagent.io/workers": "2",
        },
        created=1000.0,
    )
    assert error is None and profile is not None
    assert profile.gradient_bytes == 350e6 * 4 and profile.step_seconds == 0.25
    assert profile.steps == 100_000 and profile.deadline == 1000.0 + 6 * 3600 and profile.workers == 2
    profiled, _ = tm.parse_profile(
        {
            "dsagent.io/gradient-bytes": "1GB",
            "dsagent.io/profiled-steps": "30s/100",
            "dsagent.io/steps": "10",
            "dsagent.io/deadline": "2026-11-22T18:00:00Z",
        }
    )
    assert profiled is not None and profiled.step_seconds == pytest.approx(0.3) and profiled.gradient_bytes == 1e9
    assert profiled.deadline == datetime(2026, 11, 22, 18, tzinfo=timezone.utc).timestamp()
    assert tm.parse_profile({}) == (None, None)
    for bad in (
        {"dsagent.io/params": "x" * 100, "dsagent.io/step-seconds": "1", "dsagent.io/steps": "1"},
        {"dsagent.io/params": "-5", "dsagent.io/step-seconds": "1", "dsagent.io/steps": "1"},
        {"dsagent.io/params": "1e99", "dsagent.io/step-seconds": "1", "dsagent.io/steps": "1"},
        {"dsagent.io/params": "1M", "dsagent.io/step-seconds": "0", "dsagent.io/steps": "1"},
        {"dsagent.io/params": "1M", "dsagent.io/step-seconds": "1"},
        {
            "dsagent.io/params": "1M",
            "dsagent.io/step-seconds": "1",
            "dsagent.io/steps": "1",
            "dsagent.io/deadline": "6h",
        },
        {
            "dsagent.io/params": "1M",
            "dsagent.io/step-seconds": "1",
            "dsagent.io/steps": "1",
            "dsagent.io/deadline": "2026-13-01T00:00:00Z",
        },
        {"dsagent.io/steps": "1"},
    ):
        profile, error = tm.parse_profile(bad)
        assert profile is None and error and "dsagent.io/" in error, bad


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22T18:00:00Z", 0.0),
        ("2026-11-22T20:00:00+02:00", 0.0),
        ("2026-11-22T13:00:00-05:00", 0.0),
        ("2026-11-22T18:00:00.25Z", 0.25),
    ],
)
def test_a_deadline_is_an_rfc3339_time_in_any_zone(text: str, expected: float) -> None:
    at = datetime(2026, 11, 22, 18, tzinfo=timezone.utc).timestamp()
    assert tm.parse_deadline(text, created=None) == at + expected


@pytest.mark.parametrize("text", ["2026-11-22T18:00:00", "2026-11-22", "2026-11-22 18:00:00Z", "20261122T180000Z"])
def test_a_deadline_the_api_server_could_not_read_is_refused_with_the_form(text: str) -> None:
    with pytest.raises(tm.AnnotationError) as excinfo:
        tm.parse_deadline(text, created=0.0)
    message = str(excinfo.value)
    assert message.startswith("dsagent.io/deadline: ") and "not an RFC 3339 time" in message
    assert "2026-11-22T18:00:00Z" in message and "6h" in message


def test_wait_for_one_node_when_it_ends_no_later_than_spreading() -> None:
    cross = tm.Plan((("a", 2), ("b", 2)), 100.0, 100.0, 1e9)
    assert tm.wait_for_one_node(cross, single_run=60.0, t_free=30.0)  # 30 + 60 <= 100
    assert not tm.wait_for_one_node(cross, single_run=60.0, t_free=50.0)  # 110 > 100
    assert not tm.wait_for_one_node(cross, single_run=1.0, t_free=math.inf)
    assert not tm.wait_for_one_node(tm.Plan((("a", 4),), 1.0, 1.0, 1e9), single_run=0.0, t_free=0.0)


# --- (12) is pluggable (docs/design.md#deadline-formula) ------------------------------------


def test_formulas_rank_the_plans_that_meet_the_deadline_differently() -> None:
    # 80 one-second steps, deadline 100 s, one node with 8 free GPUs (NVLink, tiny gradients):
    # every plan of 1..8 GPUs meets it. Slack per GPU takes 2 GPUs (~30 s per GPU; one GPU
    # has 20, four 20), the earliest finish all 8 (10 s), parallel efficiency one GPU (1.0).
    choose = {
        name: tm.decide(job(deadline=100.0), {"a": 8}, bw_of, now=0.0, max_gpus=8, formula=name).plan
        for name in tm.FORMULAS
    }
    assert {k: p.n_gpu if p else None for k, p in choose.items()} == {
        "slack-per-gpu": 2,
        "earliest-finish": 8,
        "efficiency": 1,
    }
    # a late job is unaffected: the plan that ends first, whatever the formula
    late = {tm.decide(job(deadline=5.0), {"a": 8}, bw_of, now=0.0, max_gpus=8, formula=f).plan for f in tm.FORMULAS}
    assert len(late) == 1
    with pytest.raises(KeyError):
        tm.decide(job(), {"a": 8}, bw_of, now=0.0, max_gpus=8, formula="nope")


def test_parallel_efficiency_prefers_plans_that_scale() -> None:
    # gradients so large that communication eats most of the gain of a second GPU
    big = job(gradient_bytes=20e9, deadline=1e6)
    one = tm.Plan((("a", 1),), tm.t_run(big, 1, 25e9), tm.t_run(big, 1, 25e9), 1e6)
    four = tm.Plan((("a", 4),), tm.t_run(big, 4, 25e9), tm.t_run(big, 4, 25e9), 1e6)
    t1 = tm.single_gpu_time(big)
    assert tm.parallel_efficiency(one, t1) == pytest.approx(1.0)
    assert tm.parallel_efficiency(four, t1) < 0.5
    assert tm.earliest_finish(four, t1) > tm.earliest_finish(one, t1)  # 44 s beats 80 s


def test_design_as_written_takes_the_fragment_even_when_one_node_is_faster() -> None:
    # the project rule keeps this job on node a (see above); (3.4) as written takes the
    # cross-node plan because a partly free node exists
    d = tm.decide(job(), {"a": 4, "b": 1}, bw_of, now=0.0, max_gpus=4, as_written=True)
    assert d.branch == "cross-expected" and d.plan is not None and d.plan.cross_node


def test_equation_6_scales_the_single_gpu_time() -> None:
    j = job(step_seconds=0.5, steps=1000)
    assert tm.single_gpu_time(j) == pytest.approx(500.0)
    assert tm.expected_run_time(2.0, j) == pytest.approx(1000.0)
    with pytest.raises(ValueError):
        tm.expected_run_time(0.0, j)


# --- eq. (6) from a pod's factor, and (12)'s default ----------------------------------------

FACTOR_JOB = {"dsagent.io/params": "1M", "dsagent.io/step-seconds": "500ms", "dsagent.io/steps": "1000"}


@pytest.mark.parametrize(
    ("factor", "t_exp"),
    [("2", 1000.0), ("0.5", 250.0), ("high", 500.0), ("normal", 1000.0), ("LOW", 2000.0), ("1e1", 5000.0)],
)
def test_a_deadline_factor_gives_the_deadline_by_equations_6_and_7(factor: str, t_exp: float) -> None:
    # t_single = 1000 one-GPU steps x 0.5 s = 500 s; t_dl = t_arr + alpha x t_single
    profile, error = tm.parse_profile({**FACTOR_JOB, "dsagent.io/deadline-factor": factor}, created=7200.0)
    assert error is None and profile is not None
    assert profile.deadline == pytest.approx(7200.0 + t_exp)


@pytest.mark.parametrize("factor", ["0", "-1", "nan", "inf", "1001", "soon", "1e400"])
def test_a_factor_outside_its_range_is_refused_naming_the_key(factor: str) -> None:
    profile, error = tm.parse_profile({**FACTOR_JOB, "dsagent.io/deadline-factor": factor}, created=0.0)
    assert profile is None and error is not None and error.startswith("dsagent.io/deadline-factor")


def test_a_factor_and_a_deadline_together_or_a_factor_without_arrival_are_refused() -> None:
    both = {**FACTOR_JOB, "dsagent.io/deadline-factor": "2", "dsagent.io/deadline": "1h"}
    profile, error = tm.parse_profile(both, created=0.0)
    assert profile is None and error is not None and "not both" in error
    profile, error = tm.parse_profile({**FACTOR_JOB, "dsagent.io/deadline-factor": "2"}, created=None)
    assert profile is None and error is not None and "creationTimestamp" in error


def test_the_default_formula_is_the_highest_running_efficiency() -> None:
    # the scenario of test_formulas_rank_...: efficiency takes 1 GPU, slack per GPU 2
    assert tm.DEFAULT_FORMULA == "efficiency"
    default = tm.decide(job(deadline=100.0), {"a": 8}, bw_of, now=0.0, max_gpus=8).plan
    efficient = tm.decide(job(deadline=100.0), {"a": 8}, bw_of, now=0.0, max_gpus=8, formula="efficiency").plan
    slack = tm.decide(job(deadline=100.0), {"a": 8}, bw_of, now=0.0, max_gpus=8, formula="slack-per-gpu").plan
    assert default == efficient and default is not None and default.n_gpu == 1
    assert slack is not None and slack.n_gpu == 2
    assert tm.check_formula("earliest-finish") == "earliest-finish"
    with pytest.raises(ValueError, match="efficiency"):
        tm.check_formula("fastest")


def test_single_node_plans_only_when_a_job_cannot_span_nodes() -> None:
    # 8 GPUs are needed for the deadline and no node has 8 free: only a cross-node plan meets it
    tight = job(deadline=12.0)
    spread = tm.decide(tight, {"a": 4, "b": 4}, bw_of, now=0.0, max_gpus=8)
    assert spread.plan is not None and spread.plan.cross_node
    alone = tm.decide(tight, {"a": 4, "b": 4}, bw_of, now=0.0, max_gpus=8, cross_node=False)
    assert alone.plan is not None and not alone.plan.cross_node and alone.branch == "single-late"
    assert not any(p.cross_node for p in alone.candidates.values())
