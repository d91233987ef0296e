"""Cross-node deadline plans for gated multi-worker jobs, end to end against the fakes.

The webhook admits each worker of a job that asks for an applied plan
(``dsagent.io/deadline-plan: apply``, ``dsagent.io/workers: "2"``) with the scheduling gate
``dsagent.io/deadline-plan`` (real AdmissionReview JSON over HTTP); the pods go to the fake API
server, which keeps the API server's pod update rules (gates only removed, a gated pod's node
affinity only narrowed, requests never changed); the Dataset controller's leader runs the plan
loop over real HTTP (docs/design.md#deadline-plans).

The nodes are DGX-1s (the recorded ``nvidia-smi topo -m`` of tests/fixtures/topology) that
publish their topology and free GPUs as the agent does. The jobs: 2 workers x 2 GPUs, 8,000
one-GPU steps of 1 s and gradients of 1 kB (communication is negligible), so 4 GPUs run
2,000 s wherever they are.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.plangates import PlanGates
from dsagent.controller.reconcile import DatasetController
from dsagent.kube.events import EventRecorder
from dsagent.nodeagent.publisher import desired_annotations
from dsagent.webhook.mutation import Injection
from dsagent.webhook.plangate import GatePolicy
from dsagent.webhook.server import create_app
from dsplatform import kubetime
from gpu_topology import Topology, to_json
from gpu_topology.dumps import load_dump
from tests.scheduler_plugin.server import serving
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_node, make_pod

DGX1 = "dgx1-v100-4ib-nvidia-smi-topo-m.txt"
NOW = float(int(time.time()))  # the fake API server stamps creationTimestamp with the real time
GATE = "dsagent.io/deadline-plan"
JOB = {
    "dsagent.io/deadline-plan": "apply",
    "dsagent.io/workers": "2",
    "dsagent.io/gradient-bytes": "1kB",
    "dsagent.io/step-seconds": "1s",
    "dsagent.io/steps": "8000",
}


@pytest.fixture(scope="module")
def published(fixtures_dir: Path) -> str:
    found: Topology = load_dump(fixtures_dir / "topology" / DGX1)
    found = dataclasses.replace(
        found,
        gpus=tuple(dataclasses.replace(g, uuid=f"GPU-{g.index:08x}-0000-4000-8000-{g.index:012x}") for g in found.gpus),
    )
    return to_json(found)


class Clock:
    """The loop's clock, starting at the real time it is made: the fake API server stamps each
    pod's creationTimestamp with the real time, and a long suite starts this test minutes
    after the module was imported."""

    def __init__(self, now: float | None = None) -> None:
        self.now = float(int(time.time())) if now is None else now

    def __call__(self) -> float:
        return self.now


def deadline(hours: float) -> str:
    return kubetime.format_time(NOW + hours * 3600)


def worker(job: str, index: int, *, gpus: int = 2, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A worker as a training operator submits it: its job label, the time-model annotations."""
    pod = make_pod(
        f"{job}-worker-{index}",
        namespace="ml",
        gpus=gpus,
        labels={"training.kubeflow.org/job-name": job},
        annotations={**JOB, "dsagent.io/deadline": deadline(6), **(extra or {})},
    )
    return pod


def gated(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    return pod


@pytest.fixture
def cluster(published: str) -> Iterator[FakeApiServer]:
    """Two DGX-1s with 2 free GPUs each: fragments no single node can give a 4-GPU job."""
    with FakeApiServer() as server:
        server.create(make_node("gpu-a", annotations=desired_annotations(None, published, [0, 1])))
        server.create(make_node("gpu-b", annotations=desired_annotations(None, published, [4, 5])))
        yield server


def loop(api_client: Any, clock: Clock | None = None, *, wait_s: float = 600.0) -> PlanGates:
    clock = clock or Clock()
    events = EventRecorder(api_client, controller="dsagent.io/dataset-controller", instance="c-1", clock=clock)
    return PlanGates(
        api_client, events=events, gpu_resource="nvidia.com/gpu", class_prefix="dsagent.io", wait_s=wait_s, clock=clock
    )


def nodes(apiserver: FakeApiServer) -> list[dict[str, Any]]:
    return apiserver.list("nodes")


def pod(apiserver: FakeApiServer, name: str) -> dict[str, Any]:
    found = apiserver.get("pods", name, "ml")
    assert found is not None
    return found


def pinned_to(p: dict[str, Any]) -> list[list[str]]:
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [[v for f in t.get("matchFields", []) for v in f["values"]] for t in terms["nodeSelectorTerms"]]


def events_about(apiserver: FakeApiServer, name: str) -> list[tuple[str, str]]:
    """The Events about pod ``name`` in the order they were written (a list is in name order,
    and an Event's name ends in a random suffix)."""
    events = sorted(apiserver.list("events"), key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["type"], e["reason"]) for e in events if e["regarding"]["name"] == name]


def review(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "namespace": "ml", "operation": "CREATE", "object": obj, "dryRun": False},
    }


def test_a_two_worker_job_is_gated_at_admission_and_planned_across_two_nodes(cluster: FakeApiServer) -> None:
    app = create_app(
        Injection(image="img:1"), lambda ns, n: pytest.fail("no datasets"), gates=GatePolicy(clock=lambda: NOW)
    )
    client = cluster.api_client()
    try:
        with serving(app) as url:
            for index in range(2):
                submitted = worker("resnet", index)
                answer = httpx.post(f"{url}/mutate", json=review(submitted), timeout=30).json()["response"]
                assert answer["allowed"] is True and "warnings" not in answer
                admitted = json_patch(copy.deepcopy(submitted), json.loads(base64.b64decode(answer["patch"])))
                # the gate and nothing else: the requests and the spec stay as asked
                assert admitted["spec"].pop("schedulingGates") == [{"name": GATE}]
                assert admitted == submitted
                cluster.create(gated(admitted))
                if index == 0:  # one worker of two: the job waits, told once
                    ctl = loop(client)
                    assert ctl.round(nodes(cluster), cluster_pods(cluster)) is None
                    assert ctl.round(nodes(cluster), cluster_pods(cluster)) is None
                    assert events_about(cluster, "resnet-worker-0") == [("Normal", "DeadlinePlanWaiting")]
                    assert pod(cluster, "resnet-worker-0")["spec"]["schedulingGates"] == [{"name": GATE}]
        placed = ctl.run(nodes(cluster), cluster_pods(cluster))
    finally:
        client.close()
    [job] = placed
    assert job.job == "ml/resnet" and job.branch == "cross-expected"
    assert sorted(job.allocation) == [("gpu-a", 2), ("gpu-b", 2)]
    where = {}
    for index in range(2):
        p = pod(cluster, f"resnet-worker-{index}")
        assert "schedulingGates" not in p["spec"] or p["spec"]["schedulingGates"] == []
        [[node]] = pinned_to(p)
        where[p["metadata"]["name"]] = node
        planned = json.loads(p["metadata"]["annotations"]["dsagent.io/planned"])
        assert planned == {
            "gpus": 4,
            "nodes": {"gpu-a": 2, "gpu-b": 2},
            "branch": "cross-expected",
            "formula": "efficiency",
            "deadline": deadline(6),
            "node": node,
        }
        assert p["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "2"}
        assert ("Normal", "DeadlinePlanned") in events_about(cluster, p["metadata"]["name"])
    assert sorted(where.values()) == ["gpu-a", "gpu-b"]


def cluster_pods(apiserver: FakeApiServer) -> Any:
    return lambda: apiserver.list("pods")


def one_pass(cluster: FakeApiServer) -> list[Any]:
    """The jobs a fresh loop places in one pass over ``cluster`` (its client closed after)."""
    client = cluster.api_client()
    try:
        return loop(client).run(nodes(cluster), cluster_pods(cluster))
    finally:
        client.close()


def test_the_controller_runs_the_loop_in_its_leaders_pass(cluster: FakeApiServer) -> None:
    for index in range(2):
        cluster.create(gated(worker("bert", index)))
    client = cluster.api_client()
    try:
        off = DatasetController(
            client, ControllerSettings(namespace="dsplatform", identity="c-1", plan_gates=False), clock=Clock()
        )
        assert off.plan_gates is None
        settings = ControllerSettings(namespace="dsplatform", identity="c-1", plan_formula="slack-per-gpu")
        ctl = DatasetController(client, settings, clock=Clock())
        assert ctl.plan_gates is not None and ctl.plan_gates.formula == "slack-per-gpu"
        assert ctl.elector.try_acquire()
        ctl.reconcile_all()
    finally:
        client.close()
    for index in range(2):
        p = pod(cluster, f"bert-worker-{index}")
        assert not p["spec"].get("schedulingGates")
        assert json.loads(p["metadata"]["annotations"]["dsagent.io/planned"])["formula"] == "slack-per-gpu"


def test_the_tighter_deadline_goes_first_one_job_per_round(cluster: FakeApiServer) -> None:
    """Two 4-GPU jobs, room for one: the job with less slack is placed in the first round; the
    GPUs it was given count as taken until its pods are bound, so the other waits."""
    for index in range(2):
        cluster.create(gated(worker("loose", index, extra={"dsagent.io/deadline": deadline(10)})))
        cluster.create(gated(worker("tight", index, extra={"dsagent.io/deadline": deadline(1)})))
    client = cluster.api_client()
    try:
        ctl = loop(client)
        first = ctl.round(nodes(cluster), cluster_pods(cluster))
        assert first is not None and first.job == "ml/tight"
        assert [bool(pod(cluster, f"loose-worker-{i}")["spec"].get("schedulingGates")) for i in range(2)] == [True] * 2
        assert [bool(pod(cluster, f"tight-worker-{i}")["spec"].get("schedulingGates")) for i in range(2)] == [False] * 2
        assert ctl.round(nodes(cluster), cluster_pods(cluster)) is None  # its GPUs are promised
        assert events_about(cluster, "loose-worker-0") == [("Normal", "DeadlinePlanWaiting")]
        # the tight job's pods are bound and done; the nodes publish their GPUs free again
        for index in range(2):
            cluster.delete("pods", f"tight-worker-{index}", "ml")
        second = ctl.round(nodes(cluster), cluster_pods(cluster))
    finally:
        client.close()
    assert second is not None and second.job == "ml/loose"


def test_a_job_that_cannot_fit_waits_and_is_told_once_per_change(cluster: FakeApiServer, published: str) -> None:
    """2 workers x 4 GPUs on nodes with 2 free each: no node holds a worker. The job waits
    (one Event, not one per round) until a node frees 4 GPUs of its own and another 4."""
    for index in range(2):
        cluster.create(gated(worker("big", index, gpus=4)))
    client = cluster.api_client()
    try:
        ctl = loop(client)
        for _ in range(3):
            assert ctl.run(nodes(cluster), cluster_pods(cluster)) == []
        assert events_about(cluster, "big-worker-0") == [("Normal", "DeadlinePlanWaiting")]
        assert pod(cluster, "big-worker-1")["spec"]["schedulingGates"] == [{"name": GATE}]
        for name, free in (("gpu-a", [0, 1, 2, 3]), ("gpu-b", [4, 5, 6, 7])):
            cluster.patch("nodes", name, {"metadata": {"annotations": desired_annotations(None, published, free)}})
        [placed] = ctl.run(nodes(cluster), cluster_pods(cluster))
    finally:
        client.close()
    assert sorted(placed.allocation) == [("gpu-a", 4), ("gpu-b", 4)]


def test_a_node_the_workers_rules_exclude_is_not_planned_on(cluster: FakeApiServer, published: str) -> None:
    """A third node with 4 free GPUs would hold the job alone, but it is tainted and the
    workers do not tolerate it: the plan uses the two nodes they may run on."""
    tainted = make_node("gpu-c", annotations=desired_annotations(None, published, [0, 1, 2, 3]))
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]
    cluster.create(tainted)
    for index in range(2):
        cluster.create(gated(worker("ranked", index)))
    [placed] = one_pass(cluster)
    assert sorted(placed.allocation) == [("gpu-a", 2), ("gpu-b", 2)]


def hostile(change: str) -> dict[str, Any]:
    p = gated(worker("odd", 0))
    meta, spec = p["metadata"], p["spec"]
    if change == "steps":
        meta["annotations"]["dsagent.io/steps"] = "-5"
    elif change == "advise":
        meta["annotations"]["dsagent.io/deadline-plan"] = "advise"
    elif change == "garbage-mode":
        meta["annotations"]["dsagent.io/deadline-plan"] = "x" * 10_000
    elif change == "no-job":
        meta["labels"] = {}
    elif change == "one-worker":
        meta["annotations"]["dsagent.io/workers"] = "1"
    elif change == "no-gpus":
        spec["containers"][0]["resources"] = {}
    elif change == "gpu-quantity":
        spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "two"}}
    elif change == "anti-affinity":
        term = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    elif change == "bad-affinity":
        term = {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}
        required = {"nodeSelectorTerms": [term]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    elif change == "too-big":
        meta["annotations"]["dsagent.io/workers"] = "64"
    return p


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("steps", "dsagent.io/steps"),
        ("advise", "no longer asks for an applied plan"),
        ("garbage-mode", "must be 'apply' or 'advise'"),
        ("no-job", "names no job"),
        ("one-worker", "one worker"),
        ("no-gpus", "asks for no GPUs"),
        ("gpu-quantity", "GPU request cannot be read"),
        ("anti-affinity", "podAntiAffinity"),
        ("bad-affinity", "not one Kubernetes knows"),
        ("too-big", "hold at most"),
    ],
)
def test_a_pod_the_loop_cannot_plan_is_released_as_it_asked(cluster: FakeApiServer, change: str, reason: str) -> None:
    submitted = hostile(change)
    if change == "too-big":  # 64 workers: a complete job, more than the two nodes could ever hold
        for index in range(1, 64):
            cluster.create(gated(worker("odd", index, extra={"dsagent.io/workers": "64"})))
    cluster.create(submitted)
    assert one_pass(cluster) == []
    released = pod(cluster, "odd-worker-0")
    assert not released["spec"].get("schedulingGates")
    assert "dsagent.io/planned" not in released["metadata"]["annotations"]
    assert released["spec"].get("affinity") == submitted["spec"].get("affinity")
    [event] = [e for e in cluster.list("events") if e["regarding"]["name"] == "odd-worker-0"]
    assert event["type"] == "Warning" and event["reason"] == "DeadlinePlanRefused"
    assert reason in event["note"] and event["note"].startswith("deadline plan not applied")


def test_workers_that_disagree_are_released_together(cluster: FakeApiServer) -> None:
    cluster.create(gated(worker("mixed", 0, gpus=2)))
    cluster.create(gated(worker("mixed", 1, gpus=1)))
    one_pass(cluster)
    for index in range(2):
        assert not pod(cluster, f"mixed-worker-{index}")["spec"].get("schedulingGates")
        assert events_about(cluster, f"mixed-worker-{index}") == [("Warning", "DeadlinePlanRefused")]


def test_a_job_missing_workers_is_released_after_the_wait(cluster: FakeApiServer) -> None:
    cluster.create(gated(worker("lonely", 0)))
    clock = Clock()
    client = cluster.api_client()
    try:
        ctl = loop(client, clock, wait_s=300.0)
        ctl.run(nodes(cluster), cluster_pods(cluster))
        assert pod(cluster, "lonely-worker-0")["spec"]["schedulingGates"] == [{"name": GATE}]
        clock.now += 400.0  # created within seconds of the clock's start: more than 300 s waited
        ctl.run(nodes(cluster), cluster_pods(cluster))
    finally:
        client.close()
    assert not pod(cluster, "lonely-worker-0")["spec"].get("schedulingGates")
    assert events_about(cluster, "lonely-worker-0") == [
        ("Normal", "DeadlinePlanWaiting"),
        ("Warning", "DeadlinePlanRefused"),
    ]


def test_a_job_pinned_in_part_is_finished_from_its_recorded_plan(cluster: FakeApiServer) -> None:
    """The controller stopped after pinning one worker: the next round gives the other the
    recorded plan's remaining slot, not a new plan, and lifts both gates."""
    first = gated(worker("resumed", 0))
    record = {"gpus": 4, "nodes": {"gpu-a": 2, "gpu-b": 2}, "branch": "cross-expected", "formula": "efficiency"}
    first["metadata"]["annotations"]["dsagent.io/planned"] = json.dumps({**record, "node": "gpu-b"})
    pin = {"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}
    required = {"nodeSelectorTerms": [{"matchFields": [pin]}]}
    first["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    cluster.create(first)
    cluster.create(gated(worker("resumed", 1)))
    assert one_pass(cluster) == []  # nothing new placed
    assert pinned_to(pod(cluster, "resumed-worker-0")) == [["gpu-b"]]
    assert pinned_to(pod(cluster, "resumed-worker-1")) == [["gpu-a"]]
    for index in range(2):
        assert not pod(cluster, f"resumed-worker-{index}")["spec"].get("schedulingGates")


def pinned_worker(job: str, index: int, node: str, *, owned: bool) -> dict[str, Any]:
    """A worker the loop pinned to ``node`` and released (its gate lifted), still unbound."""
    p = worker(job, index)
    record = {"gpus": 4, "nodes": {node: 2, "gpu-b": 2}, "branch": "cross-expected", "formula": "efficiency"}
    p["metadata"]["annotations"]["dsagent.io/planned"] = json.dumps({**record, "node": node})
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    required = {"nodeSelectorTerms": [{"matchFields": [pin]}]}
    p["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    if owned:
        p["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": job,
                "uid": f"uid-{job}",
                "controller": True,
            }
        ]
    return p


def test_a_worker_pinned_to_a_node_that_is_gone_is_evicted_for_its_controller_to_remake(
    cluster: FakeApiServer,
) -> None:
    """A pinned worker's node was removed before the scheduler bound it: no scheduler can place
    it. One a controller owns is evicted (the job's controller makes it anew, gated again);
    one nobody owns is told once and left; one pinned to a node that exists is left alone."""
    cluster.create(pinned_worker("gone", 0, "gpu-removed", owned=True))
    cluster.create(pinned_worker("orphan", 0, "gpu-removed", owned=False))
    cluster.create(pinned_worker("fine", 0, "gpu-a", owned=True))
    client = cluster.api_client()
    try:
        ctl = loop(client)
        assert ctl.run(nodes(cluster), cluster_pods(cluster)) == []
        assert ctl.run(nodes(cluster), cluster_pods(cluster)) == []  # a second pass: nothing again
    finally:
        client.close()
    assert cluster.evictions == ["ml/gone-worker-0"]
    # a pass that listed no Node at all judges nothing gone
    client = cluster.api_client()
    try:
        loop(client).run([], cluster_pods(cluster))
    finally:
        client.close()
    assert cluster.evictions == ["ml/gone-worker-0"]
    assert cluster.get("pods", "gone-worker-0", "ml") is None
    assert events_about(cluster, "gone-worker-0") == [("Warning", "DeadlinePlanNodeGone")]
    assert events_about(cluster, "orphan-worker-0") == [("Warning", "DeadlinePlanNodeGone")]  # once
    assert pinned_to(pod(cluster, "orphan-worker-0")) == [["gpu-removed"]]
    assert pinned_to(pod(cluster, "fine-worker-0")) == [["gpu-a"]] and events_about(cluster, "fine-worker-0") == []


def test_an_eviction_a_disruption_budget_refuses_is_tried_again_at_the_next_round(cluster: FakeApiServer) -> None:
    cluster.create(pinned_worker("guarded", 0, "gpu-removed", owned=True))
    cluster.blocked_evictions.add("ml/guarded-worker-0")
    client = cluster.api_client()
    try:
        ctl = loop(client)
        ctl.run(nodes(cluster), cluster_pods(cluster))
        assert pod(cluster, "guarded-worker-0") and events_about(cluster, "guarded-worker-0") == []
        cluster.blocked_evictions.clear()
        ctl.run(nodes(cluster), cluster_pods(cluster))
    finally:
        client.close()
    assert cluster.get("pods", "guarded-worker-0", "ml") is None
    assert events_about(cluster, "guarded-worker-0") == [("Warning", "DeadlinePlanNodeGone")]


@pytest.mark.parametrize(("cpu", "allocation"), [("10", [("gpu-a", 2), ("gpu-b", 2)]), (None, [("gpu-a", 4)])])
def test_a_node_whose_cpu_holds_one_worker_gets_one_worker_of_the_plan(
    published: str, cpu: str | None, allocation: list[tuple[str, int]]
) -> None:
    """gpu-a has 4 free GPUs, enough for the whole job, but CPU for one of its workers (16 of
    its cores, 10 a worker): the plan puts one worker there and the other on gpu-b, where a
    plan by GPUs alone would have put both on gpu-a and left one pending. The control: the
    same job asking no CPU runs on gpu-a alone."""
    with FakeApiServer() as cluster:
        cpu16 = {"cpu": "16"}
        cluster.create(
            make_node("gpu-a", annotations=desired_annotations(None, published, [0, 1, 2, 3]), extra_allocatable=cpu16)
        )
        cluster.create(make_node("gpu-b", annotations=desired_annotations(None, published, [4, 5])))
        for index in range(2):
            p = gated(worker("job", index))
            if cpu is not None:
                p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
            cluster.create(p)
        [job] = one_pass(cluster)
        assert sorted(job.allocation) == allocation
        pinned = sorted(pinned_to(pod(cluster, f"job-worker-{i}"))[0][0] for i in range(2))
        assert pinned == sorted(node for node, count in allocation for _ in range(count // 2))


def test_a_job_whose_workers_no_node_could_hold_by_cpu_is_released_as_it_asked(published: str) -> None:
    """Each worker asks for more CPU than any node has even empty: no plan can ever place the
    job, so its gates are lifted with a Warning saying why, not left waiting."""
    with FakeApiServer() as cluster:
        cluster.create(make_node("gpu-a", annotations=desired_annotations(None, published, [0, 1, 2, 3])))
        for index in range(2):
            p = gated(worker("cpu-hog", index))
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "200"  # the node has 96
            cluster.create(p)
        assert one_pass(cluster) == []
        for index in range(2):
            assert not pod(cluster, f"cpu-hog-worker-{index}")["spec"].get("schedulingGates")
            assert events_about(cluster, f"cpu-hog-worker-{index}") == [("Warning", "DeadlinePlanRefused")]
