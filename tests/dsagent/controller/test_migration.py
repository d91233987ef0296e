"""Step 5 (migration): the pure policy, and the migrator against the fake API server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from dsagent.controller.migration import Migrator, MigratorSettings
from scheduler_plugin.testing import two_class_topology
from scheduling import migration as mig
from scheduling.nodeinfo import Holding, Inventory, NodeFacts
from scheduling.timemodel import JobProfile
from tests.dsagent.controller.test_controller_migration import worker
from tools.support.fake_apiserver import FakeApiServer

STARTED = datetime.fromisoformat("2026-11-23T08:00:00+00:00").timestamp()
PROFILE = JobProfile(gradient_bytes=1e9, step_seconds=1.0, steps=36_000)  # 10 GPU-hours


def running(
    name: str, allocation: tuple[tuple[str, int], ...], *, end: float = 20_000.0, migratable: bool = True
) -> mig.RunningJob:
    return mig.RunningJob(name, PROFILE, allocation, end, 1.0, migratable)


def fast(job: mig.RunningJob, allocation: tuple[tuple[str, int], ...]) -> float:
    return 300e9  # NVLink on one node


def cheap(job: mig.RunningJob, allocation: tuple[tuple[str, int], ...]) -> float:
    return 300.0


def test_opt_in_by_label_or_annotation() -> None:
    assert mig.is_migratable({"dsagent.io/migratable": "true"}, None)
    assert mig.is_migratable(None, {"dsagent.io/migratable": " True "})
    assert not mig.is_migratable({"dsagent.io/migratable": "yes"}, {})
    assert not mig.is_migratable({}, {"other": "true"})


def test_a_cross_node_job_moves_to_one_node_when_it_pays() -> None:
    jobs = [running("ns/a", (("n1", 2), ("n2", 2)))]
    moves = mig.plan_migrations(jobs, {"n3": 8, "n4": 4}, fast, cheap, now=0.0)
    # best fit: the node with the fewest free GPUs that holds all four
    assert [(m.job, m.target) for m in moves] == [("ns/a", (("n4", 4),))]
    assert moves[0].cost == 300.0 and moves[0].end < 20_000.0


def test_no_move_without_opt_in_room_or_gain() -> None:
    free = {"n3": 8}
    assert (
        mig.plan_migrations([running("x", (("n1", 2), ("n2", 2)), migratable=False)], free, fast, cheap, now=0.0) == []
    )
    assert mig.plan_migrations([running("x", (("n1", 2), ("n2", 2)))], {"n3": 3}, fast, cheap, now=0.0) == []
    # the move costs more than it saves: the job stays
    assert mig.plan_migrations([running("x", (("n1", 2), ("n2", 2)))], free, fast, lambda j, a: 9_500.0, now=0.0) == []
    # the job ends soon anyway (it would finish 10 s from now)
    assert mig.plan_migrations([running("x", (("n1", 2), ("n2", 2)), end=10.0)], free, fast, cheap, now=0.0) == []


def test_design_order_single_node_first_then_larger_first_and_gpus_are_consumed() -> None:
    jobs = [
        running("small-cross", (("n1", 1), ("n2", 1))),
        running("big-cross", (("n1", 3), ("n2", 3))),
        running("single", (("n5", 4),)),
    ]
    order: list[str] = []

    def bw(job: mig.RunningJob, allocation: tuple[tuple[str, int], ...]) -> float:
        order.append(job.name)
        return 300e9

    moves = mig.plan_migrations(jobs, {"n3": 10}, bw, cheap, now=0.0)
    # the single-node job takes 4 of n3's 10 GPUs, the big cross-node job the other 6; the
    # small one finds no room left
    assert order == ["single", "big-cross"]
    assert [m.job for m in moves] == ["single", "big-cross"]


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def facts(name: str, free: frozenset[int], *, holds: bool) -> NodeFacts:
    held = {"imagenet": Holding("ab" * 16, 10**11, True, False)} if holds else {}
    topo = two_class_topology()
    return NodeFacts(
        name=name,
        inventory=Inventory(4 * 10**12, 10**12, held),
        topology=topo,
        classes=(),
        allocatable_gpus=8,
        published_free=free,
        gpu_facts_known=True,
    )


@pytest.mark.slow
def test_migrator_evicts_the_pods_of_a_job_that_moves_and_only_those(apiserver: FakeApiServer) -> None:
    for pod in (
        worker("mover-0", "n1", job="mover"),
        worker("mover-1", "n2", job="mover"),
        worker("stay-0", "n1", job="stay", migratable=False),
        worker("stay-1", "n2", job="stay", migratable=False),
    ):
        apiserver.create(pod)
    nodes = [
        facts("n1", frozenset(), holds=True),
        facts("n2", frozenset(), holds=True),
        facts("n3", frozenset({0, 1, 2, 3}), holds=True),  # one NVLinked quad, data held
    ]
    started = STARTED + 3600  # an hour after the pods' startTime
    migrator = Migrator(apiserver.api_client(), lambda: nodes, clock=lambda: started)
    moves = migrator.run_once()
    assert [(m.job, m.target) for m in moves] == [("ml/mover", (("n3", 4),))]
    assert sorted(apiserver.evictions) == ["ml/mover-0", "ml/mover-1"]
    left = sorted(p["metadata"]["name"] for p in apiserver.list("pods"))
    assert left == ["stay-0", "stay-1"]
    # a second round finds nothing to move: the job's pods are gone until its controller
    # re-creates them, and the others did not opt in
    assert migrator.run_once() == []


def test_migrator_stops_at_a_disruption_budget_and_pays_for_missing_data(apiserver: FakeApiServer) -> None:
    apiserver.create(worker("mover-0", "n1", job="mover"))
    apiserver.create(worker("mover-1", "n2", job="mover"))
    apiserver.blocked_evictions.add("ml/mover-0")
    nodes = [facts("n1", frozenset(), holds=True), facts("n2", frozenset(), holds=True)]
    target = facts("n3", frozenset({0, 1, 2, 3}), holds=True)
    clock = lambda: STARTED + 3600  # noqa: E731
    assert Migrator(apiserver.api_client(), lambda: [*nodes, target], clock=clock).run_once() == []
    assert apiserver.evictions == []
    # the target lacks the data: re-fetching an unknown size (1 TB at the measured rate) costs
    # more than the move saves
    far = facts("n3", frozenset({0, 1, 2, 3}), holds=False)
    apiserver.blocked_evictions.clear()
    settings = MigratorSettings(fetch_bps=1e6)
    assert Migrator(apiserver.api_client(), lambda: [*nodes, far], clock=clock, settings=settings).run_once() == []
    assert apiserver.evictions == []
