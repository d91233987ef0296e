"""The next-job preparation policy (docs/design.md#next-job-preparation): prediction from the
running jobs' expected ends, phase 1 under the first threshold, phase 2 within the lead time
and under the second threshold, never for data a node already holds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsagent.policy.preparation import Known, NodeState, Running, Thresholds, Waiting, Want, plan, predict

GB = 10**9
D = "d" * 32
T = Thresholds(window_s=1800, fetch_lead_s=600, reserve_fraction=0.3, fill_fraction=0.9)


def want(name: str, size: int = 10 * GB) -> Want:
    return Want(name, D, size)


def node(name: str, *, free: int = 0, ends: tuple[tuple[int, float | None], ...] = (), **kw: object) -> NodeState:
    base: dict[str, object] = {"capacity_bytes": 100 * GB, "in_use_bytes": 0, "held": frozenset()}
    base.update(kw)
    return NodeState(name, free_gpus=free, running=tuple(Running(g, e) for g, e in ends), **base)  # type: ignore[arg-type]


def test_a_waiting_job_is_predicted_where_gpus_free_first_and_prepared_in_two_phases() -> None:
    nodes = [node("a", ends=((8, 1500.0),)), node("b", ends=((8, 500.0),))]
    job = Waiting("j1", 8, (want("imagenet"),))
    assert predict(nodes, [job], now=0, window_s=1800) == {"j1": ("b", 500.0)}
    [prep] = plan(nodes, [job], now=0, thresholds=T)
    assert (prep.node, prep.phase, prep.datasets) == ("b", 2, (want("imagenet"),))  # 500 s <= 600 s lead
    # 900 s before: reserved (phase 1), not fetched yet
    [early] = plan(nodes, [job], now=-400, thresholds=T)
    assert (early.node, early.phase) == ("b", 1)
    # outside the window: nothing
    assert plan(nodes, [job], now=-2000, thresholds=T) == ()


def test_phase_2_starts_early_enough_for_the_bytes_to_arrive_before_the_start() -> None:
    # 40 GB missing on a 200 GB node; at 500 MB/s that is 80 s of fetch on top of the 600 s
    # lead: phase 2 begins 680 s before the predicted start, not 600 s
    nodes = [node("a", ends=((8, 650.0),), capacity_bytes=200 * GB)]
    job = Waiting("j", 8, (want("large", 40 * GB),))
    [prep] = plan(nodes, [job], now=0, thresholds=T)
    assert prep.phase == 2  # 650 s away: within 680 s
    assert plan(nodes, [job], now=-40, thresholds=T)[0].phase == 1  # 690 s away
    # without the rate term the old rule: 600 s
    assert plan(nodes, [job], now=0, thresholds=replace(T, fetch_bytes_per_s=0))[0].phase == 1


def test_a_job_whose_fetch_outlasts_the_window_is_predicted_within_its_lead() -> None:
    # 2 TB at 500 MB/s: 4,000 s of fetch; the running job ends in 3,000 s, past the 1,800 s
    # window, yet the bulk fetch must start now to be done when the GPUs free
    nodes = [node("a", ends=((8, 3000.0),), capacity_bytes=10_000 * GB)]
    job = Waiting("j", 8, (want("huge", 2000 * GB),))
    [prep] = plan(nodes, [job], now=0, thresholds=T)
    assert (prep.node, prep.phase, prep.start) == ("a", 2, 3000.0)
    small = Waiting("s", 8, (want("small", 10 * GB),))  # its own lead is 620 s: not yet
    assert plan(nodes, [small], now=0, thresholds=T) == ()


def test_a_job_that_fits_now_is_left_to_the_scheduler_but_takes_its_gpus() -> None:
    nodes = [node("a", free=8, ends=((8, 300.0),))]
    first, second = Waiting("fits", 8, (want("x"),)), Waiting("next", 8, (want("y"),))
    assert predict(nodes, [first, second], now=0, window_s=1800) == {"fits": ("a", 0), "next": ("a", 300.0)}
    assert [(p.job, p.phase) for p in plan(nodes, [first, second], now=0, thresholds=T)] == [("next", 2)]


def test_data_the_node_holds_is_not_prepared_and_ties_go_to_the_holder() -> None:
    held = frozenset({("imagenet", D)})
    nodes = [node("a", ends=((8, 100.0),)), node("b", ends=((8, 100.0),), held=held)]
    job = Waiting("j", 8, (want("imagenet"), want("labels", GB)))
    [prep] = plan(nodes, [job], now=0, thresholds=T)
    assert prep.node == "b" and prep.datasets == (want("labels", GB),)


def test_the_first_threshold_bounds_what_is_reserved_per_node() -> None:
    # four jobs starting in 1,000-1,300 s: within the window, not yet within their 624 s lead
    nodes = [node("a", ends=((1, 1000.0), (1, 1100.0), (1, 1200.0), (1, 1300.0)))]
    jobs = [Waiting(f"j{i}", 1, (want(f"ds{i}", 12 * GB),)) for i in range(4)]
    # 30 GB of 100 GB: new set-ups start while the total is below it (0, 12, 24 GB); once it
    # reaches 36 GB the fourth waits for a later round (the design's "stop starting")
    assert [(p.job, p.phase) for p in plan(nodes, jobs, now=0, thresholds=T)] == [("j0", 1), ("j1", 1), ("j2", 1)]


def test_the_first_threshold_counts_phase_1_only_as_the_agent_does() -> None:
    # the design stops new environment set-ups while those *in set-up* reach the first
    # threshold; a preparation fetching its data (phase 2) counts against the second one:
    # all four start within their lead, their 48 GB within the 90 GB second threshold
    nodes = [node("a", ends=((1, 100.0), (1, 200.0), (1, 300.0), (1, 400.0)))]
    jobs = [Waiting(f"j{i}", 1, (want(f"ds{i}", 12 * GB),)) for i in range(4)]
    assert [(p.job, p.phase) for p in plan(nodes, jobs, now=0, thresholds=T)] == [(f"j{i}", 2) for i in range(4)]


def test_phase_2_starts_when_either_trigger_holds() -> None:
    # a next job needing 500 GB whose GPUs free in 300 s: within its lead (600 s + 1,000 s
    # of fetch), so phase 2 starts now, however many steps the current job reports left
    big = Thresholds(subtasks_remaining=2)
    for remaining in (None, 5000, 1):
        nodes = [NodeState("a", 10_000 * GB, 0, 0, (Running(8, 300.0, remaining),))]
        job = Waiting("next", 8, (want("corpus", 500 * GB),))
        assert plan(nodes, [job], now=0, thresholds=big)[0].phase == 2, remaining
    # far from the start (5 h): the progress report alone starts it
    far = [NodeState("a", 10_000 * GB, 0, 0, (Running(8, 5 * 3600.0, 1),))]
    known = {"next": Known("a", 5 * 3600.0, far[0].running[0])}
    job = Waiting("next", 8, (want("corpus", 500 * GB),))
    assert plan(far, [job], now=0, thresholds=big, known=known)[0].phase == 2
    slow = [NodeState("a", 10_000 * GB, 0, 0, (Running(8, 5 * 3600.0, 5000),))]
    known = {"next": Known("a", 5 * 3600.0, slow[0].running[0])}
    assert plan(slow, [job], now=0, thresholds=big, known=known)[0].phase == 1


def test_a_dataset_larger_than_the_first_threshold_is_still_prepared() -> None:
    # 50 GB on a 100 GB node: over the 30 GB first threshold on its own; the old rule
    # (reserved + size <= threshold) could never prepare it; the second threshold (90 GB
    # in use + prepared) still bounds its fetch
    nodes = [node("a", ends=((8, 100.0),))]
    job = Waiting("j", 8, (want("big", 50 * GB),))
    [prep] = plan(nodes, [job], now=0, thresholds=T)
    assert prep.phase == 2
    busy = [node("a", ends=((8, 100.0),), in_use_bytes=45 * GB)]
    assert plan(busy, [job], now=0, thresholds=T)[0].phase == 1  # 45 + 50 > 90


def test_the_second_threshold_and_data_in_use_keep_phase_2_back() -> None:
    nodes = [node("a", ends=((8, 100.0),), in_use_bytes=85 * GB)]
    job = Waiting("j", 8, (want("big", 10 * GB),))
    [prep] = plan(nodes, [job], now=0, thresholds=T)
    assert prep.phase == 1  # 85 + 10 > 90: reserved, not fetched (it would crowd out data in use)


def test_a_started_fetch_keeps_phase_2_and_its_budget_first() -> None:
    nodes = [node("a", ends=((1, 100.0), (1, 1000.0)))]
    later = Waiting("later", 1, (want("x", 35 * GB),))
    sooner = Waiting("sooner", 1, (want("y", 35 * GB),))
    # "later" ends up behind "sooner" in time, but its fetch already started: it keeps it
    preps = plan(nodes, [sooner, later], now=0, thresholds=T, fetching=[("later", "a")])
    assert [(p.job, p.phase) for p in preps][0] == ("later", 2)
    # with less room under the second threshold, only the started one fetches
    tight = [node("a", ends=((1, 100.0), (1, 1000.0)), in_use_bytes=30 * GB)]
    preps = plan(tight, [sooner, later], now=0, thresholds=T, fetching=[("later", "a")])
    assert [(p.job, p.phase) for p in preps] == [("later", 2), ("sooner", 1)]


def test_no_expected_end_means_no_prediction() -> None:
    assert predict([node("a", ends=((8, None),))], [Waiting("j", 8, (want("x"),))], now=0, window_s=1e9) == {}


def test_thresholds_are_checked() -> None:
    with pytest.raises(ValueError, match="within"):
        Thresholds(reserve_fraction=1.5)
    with pytest.raises(ValueError):
        Thresholds(fetch_bytes_per_s=float("nan"))


# -- properties ----------------------------------------------------------------------------

names = st.sampled_from(["a", "b", "c", "d", "e"])
nodes_st = st.lists(
    st.builds(
        NodeState,
        name=st.sampled_from(["n1", "n2", "n3", "n4"]),
        capacity_bytes=st.integers(0, 100),
        in_use_bytes=st.integers(0, 100),
        free_gpus=st.integers(0, 8),
        running=st.lists(
            st.builds(Running, gpus=st.integers(0, 8), expected_end=st.one_of(st.none(), st.floats(-100, 5000))),
            max_size=4,
        ).map(tuple),
        held=st.frozensets(st.tuples(names, st.just(D)), max_size=3),
    ),
    max_size=4,
    unique_by=lambda n: n.name,
)
waiting_st = st.lists(
    st.builds(
        Waiting,
        key=st.text("xyz", min_size=1, max_size=3),
        gpus=st.integers(0, 8),
        datasets=st.lists(
            st.builds(Want, name=names, digest=st.just(D), size_bytes=st.integers(0, 60)), max_size=3
        ).map(tuple),
    ),
    max_size=6,
    unique_by=lambda w: w.key,
)
thresholds_st = st.builds(
    Thresholds,
    window_s=st.floats(0, 3000),
    fetch_lead_s=st.floats(0, 3000),
    reserve_fraction=st.floats(0, 1),
    fill_fraction=st.floats(0, 1),
    fetch_bytes_per_s=st.sampled_from([0.0, 0.01, 1.0, 500e6]),
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(nodes=nodes_st, waiting=waiting_st, thresholds=thresholds_st, now=st.floats(0, 1000))
def test_plan_properties(nodes: list[NodeState], waiting: list[Waiting], thresholds: Thresholds, now: float) -> None:
    preps = plan(nodes, waiting, now=now, thresholds=thresholds)
    largest = max((sum(w.size_bytes for w in job.datasets) for job in waiting), default=0)
    horizon = max(thresholds.window_s, thresholds.lead_s(largest))
    predicted = predict(nodes, waiting, now=now, window_s=horizon)
    by_name = {n.name: n for n in nodes}
    assert len({p.job for p in preps}) == len(preps)
    for p in preps:
        n = by_name[p.node]
        assert predicted[p.job] == (p.node, p.start)
        assert now < p.start <= now + max(thresholds.window_s, thresholds.lead_s(p.bytes))
        assert p.datasets and not any(w.key in n.held for w in p.datasets)
        if p.phase == 2:
            assert p.start - now <= thresholds.lead_s(p.bytes)
    for name, n in by_name.items():
        mine = [p for p in preps if p.node == name]
        before = 0  # each phase-1 reservation starts while the node's phase-1 total is below the first
        for p in mine:  # threshold; phase 2 answers to the second threshold alone (first_budget)
            if p.phase == 1:
                assert before < thresholds.reserve_fraction * n.capacity_bytes
                before += p.bytes
        fetched = sum(p.bytes for p in mine if p.phase == 2)
        if fetched:
            assert n.in_use_bytes + fetched <= thresholds.fill_fraction * n.capacity_bytes
        keys = [w.key for p in mine for w in p.datasets]
        assert len(keys) == len(set(keys))  # a version is prepared once per node


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(nodes=nodes_st, waiting=waiting_st, now=st.floats(0, 1000), window=st.floats(0, 3000))
def test_predictions_never_promise_more_gpus_than_a_node_frees(
    nodes: list[NodeState], waiting: list[Waiting], now: float, window: float
) -> None:
    predicted = predict(nodes, waiting, now=now, window_s=window)
    gpus = {w.key: w.gpus for w in waiting}
    for n in nodes:
        freed = n.free_gpus + sum(
            r.gpus for r in n.running if r.expected_end is not None and r.expected_end <= now + window and r.gpus > 0
        )
        assert sum(gpus[j] for j, (name, _) in predicted.items() if name == n.name) <= freed
