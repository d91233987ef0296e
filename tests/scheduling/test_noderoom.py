"""A node's CPU and memory left for a job's workers, as kube-scheduler's resource fit reads
them (:mod:`scheduling.noderoom`)."""

from __future__ import annotations

from typing import Any

import pytest

from dsplatform.gpus import QuantityError, parse_milli
from scheduling.noderoom import Needs, Room, gpus_for, most, node_room, pod_needs, workers_fitting

GI = 1 << 30


def container(cpu: str | None = None, memory: str | None = None, **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "c", "resources": {"requests": requests}, **extra}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": list(containers), "initContainers": list(init), **spec}}


def node(cpu: str | None = "8", memory: str | None = "64Gi") -> dict[str, Any]:
    allocatable = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"metadata": {"name": "n"}, "status": {"allocatable": allocatable}}


def test_cpu_quantities_read_in_thousandths() -> None:
    assert [parse_milli(v) for v in ("500m", "2", 3, "0.1", "1.5", "100k")] == [500, 2000, 3000, 100, 1500, 100_000_000]
    for bad in ("lots", True, None, "1.5x"):
        with pytest.raises(QuantityError):
            parse_milli(bad)


def test_a_pods_needs_are_its_containers_its_sidecars_or_its_largest_init_moment_plus_overhead() -> None:
    assert pod_needs(pod(container("1", "2Gi"), container("500m", "1Gi"))) == Needs(1500, 3 * GI)
    sidecar = container("250m", "1Gi", restartPolicy="Always")
    # the sidecar runs beside the app containers; the init step before it ran alone
    assert pod_needs(pod(container("1", "2Gi"), init=(container("4", "1Gi"), sidecar))) == Needs(4000, 3 * GI)
    # an init step after the sidecar runs beside it
    assert pod_needs(pod(container("1", "2Gi"), init=(sidecar, container("4", "8Gi")))) == Needs(4250, 9 * GI)
    overhead = {"cpu": "100m", "memory": "128Mi"}
    assert pod_needs(pod(container("1", "1Gi"), overhead=overhead)) == Needs(1100, GI + (128 << 20))
    # hostile quantities count as nothing asked, never as a crash
    assert pod_needs(pod(container("lots", "2Gi"))) == Needs(0, 2 * GI)
    assert pod_needs({"spec": "not a spec"}) == Needs(0, 0)


def test_a_nodes_room_is_its_allocatable_less_what_its_pods_need() -> None:
    held = [pod(container("3", "20Gi")), pod(container("1", "4Gi"))]
    assert node_room(node(), held) == Room(4000, 40 * GI)
    assert node_room(node(cpu=None), held) == Room(None, 40 * GI)  # a node that does not say: unknown
    assert node_room(node(cpu="many"), held) == Room(None, 40 * GI)
    assert node_room({"metadata": {"name": "n"}}, held) == Room(None, None)


def test_the_gpus_a_job_may_plan_on_a_node_are_those_of_the_workers_its_cpu_and_memory_hold() -> None:
    worker = Needs(3000, 16 * GI)
    assert workers_fitting(Room(7000, 64 * GI), worker) == 2  # CPU for two, memory for four
    assert workers_fitting(Room(7000, 20 * GI), worker) == 1  # memory for one
    assert workers_fitting(Room(-500, 64 * GI), worker) == 0  # over-committed: none
    assert workers_fitting(Room(None, None), worker) is None
    assert workers_fitting(Room(1000, GI), Needs(0, 0)) is None  # a worker asking nothing
    assert gpus_for(8, Room(7000, 64 * GI), worker, gpus_each=2) == 4
    assert gpus_for(2, Room(7000, 64 * GI), worker, gpus_each=2) == 2  # the GPUs bind first
    assert gpus_for(8, Room(None, None), worker, gpus_each=2) == 8


def test_a_job_is_planned_for_the_most_any_of_its_workers_asks() -> None:
    assert most([Needs(1000, 4 * GI), Needs(3000, GI)]) == Needs(3000, 4 * GI)
    assert most([]) == Needs(0, 0)
