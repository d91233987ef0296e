"""Where the next job comes from (docs/design.md#next-job-preparation): a running pod's
``dsagent.io/next-job``, Kueue Workloads and Volcano Jobs read through the official
client's ``CustomObjectsApi`` from the fake API server (their real shapes), and the replay
as the labelled fallback; and the phase-2 trigger from the running job's sub-tasks."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi

from dsagent.controller.controllermetrics import ControllerMetrics
from dsagent.controller.nextjob import pods_to_prepare, preparation_report, prepare_pass
from dsagent.controller.podfacts import running_pods, waiting_pods
from dsagent.controller.queues import Queues, follow_up_namespaces, followers, list_queues, queue_places
from dsagent.policy.preparation import Known, NodeState, Running, Thresholds, Waiting, Want, plan
from dsplatform.kubetime import format_time
from dsplatform.published import FOLLOW_UPS, FOLLOW_UPS_MAX
from dsplatform.wire.podannotations import next_job_of, progress_of
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node, make_pod

GB = 10**9
DIGEST = "b" * 32
NOW = 1_900_000_000.0
TEMPLATE = {"spec": {"containers": [{"name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3"}]}}


def owned(pod: dict[str, Any], kind: str, name: str, uid: str, api_version: str = "batch/v1") -> dict[str, Any]:
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}
    ]
    return pod


def workload(name: str, job: str, job_uid: str, *, priority: int, admitted: bool, created: str) -> dict[str, Any]:
    """A Kueue Workload as Kueue's job integration writes it for a batch/v1 Job."""
    status: dict[str, Any] = {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "True" if admitted else "False",
                "reason": "QuotaReserved" if admitted else "Pending",
                "message": "",
                "lastTransitionTime": created,
            }
        ]
    }
    if admitted:
        status["admission"] = {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [
                {
                    "name": "main",
                    "flavors": {"nvidia.com/gpu": "a100"},
                    "resourceUsage": {"nvidia.com/gpu": "4"},
                    "count": 1,
                }
            ],
        }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "creationTimestamp": created,
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid, "controller": True,
                 "blockOwnerDeletion": True}
            ],
        },
        "spec": {
            "queueName": "user-queue",
            "priority": priority,
            "priorityClassName": "p" + str(priority),
            "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
            "podSets": [{"name": "main", "count": 1, "template": TEMPLATE}],
        },
        "status": status,
    }  # fmt: skip


def volcano_job(name: str, phase: str, created: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": 1,
            "queue": "default",
            "tasks": [{"name": "worker", "replicas": 1, "template": TEMPLATE}],
        },
        "status": {"state": {"phase": phase}, "minAvailable": 1},
    }  # fmt: skip


def test_the_annotations_are_read_strictly() -> None:
    assert next_job_of({"dsagent.io/next-job": "train-b"}) == "train-b"
    for hostile in ("", "Train", "a/b", "x" * 300, "-a"):
        assert next_job_of({"dsagent.io/next-job": hostile}) is None
    assert progress_of({"dsagent.io/progress": " 7 / 10 "}) == (7, 10)
    for hostile in ("11/10", "1/0", "a/b", "5", "-1/3", "1/" + "9" * 20):
        assert progress_of({"dsagent.io/progress": hostile}) is None


def test_kueue_and_volcano_order_come_through_the_custom_objects_api(apiserver: FakeApiServer, api_client: Any) -> None:
    custom = CustomObjectsApi(api_client)
    assert list_queues(custom) == Queues([], [])  # installed, empty
    # pods of three Kueue jobs and one Volcano job, created in the opposite order of the queue
    jobs = {"low-old": ("u-low", 10, False, "2027-01-01T00:00:00Z"),
            "high-new": ("u-high", 100, False, "2027-01-01T00:00:05Z"),
            "admitted": ("u-adm", 0, True, "2027-01-01T00:00:09Z")}  # fmt: skip
    pods = []
    for job, (uid, priority, admitted, created) in jobs.items():
        apiserver.create(workload(f"job-{job}-x1", job, uid, priority=priority, admitted=admitted, created=created))
        pod = owned(make_pod(f"{job}-pod", namespace="ml", gpus=1), "Job", job, uid)
        pod["metadata"].update(uid=f"pod-{job}", creationTimestamp="2027-01-01T00:00:00Z")
        pods.append(pod)
    vc = apiserver.create(volcano_job("vc", "Inqueue", "2027-01-01T00:00:07Z"))
    pod = owned(make_pod("vc-worker-0", namespace="ml", gpus=1), "Job", "vc", vc["metadata"]["uid"],
                "batch.volcano.sh/v1alpha1")  # fmt: skip
    pod["metadata"].update(uid="pod-vc", creationTimestamp="2027-01-01T00:00:00Z")
    pods.append(pod)
    plain = make_pod("plain", namespace="ml", gpus=1)
    plain["metadata"].update(uid="pod-plain", creationTimestamp="2026-12-31T00:00:00Z")
    pods.append(plain)
    queues = list_queues(custom)
    assert queues.workloads is not None and len(queues.workloads) == 3
    assert queues.volcano_jobs is not None and [j["metadata"]["name"] for j in queues.volcano_jobs] == ["vc"]
    datasets = {("ml", "d"): make_dataset("d", namespace="ml", status={"digest": DIGEST, "bytes": GB})}
    for p in pods:
        p["metadata"]["annotations"] = {"dsagent.io/datasets": "d"}
    found = waiting_pods(pods, datasets, queue_places(pods, queues))
    # admitted first (Kueue's admission, Volcano's Inqueue), then priority, then age; the
    # pod no queue system owns keeps its creation order behind the admitted ones
    assert [(w.key, w.source) for w, _ in found] == [
        ("pod-admitted", "kueue"),
        ("pod-vc", "volcano"),
        ("pod-high-new", "kueue"),
        ("pod-low-old", "kueue"),
        ("pod-plain", "prediction"),
    ]


def test_without_the_crds_the_queue_is_the_creation_order(api_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.support import fake_apiserver

    monkeypatch.delitem(fake_apiserver.RESOURCES, "workloads")
    monkeypatch.delitem(fake_apiserver.RESOURCES, "vcjobs")
    assert list_queues(CustomObjectsApi(api_client)) == Queues(None, None)  # 404: not installed


def test_a_running_pod_names_the_job_that_follows_it_on_its_node() -> None:
    current = make_pod("train-a-0", namespace="ml", node_name="gpu-3", gpus=8, phase="Running")
    current["metadata"]["annotations"] = {
        "dsagent.io/next-job": "train-b",
        "dsagent.io/duration": "1h",
        "dsagent.io/progress": "9/10",
    }
    current["status"]["startTime"] = format_time(NOW - 1800)
    follower = owned(make_pod("train-b-0", namespace="ml", gpus=8), "Job", "train-b", "u-b")
    follower["metadata"]["uid"] = "pod-b"
    other_ns = owned(make_pod("train-b-0", namespace="other", gpus=8), "Job", "train-b", "u-b2")
    other_ns["metadata"]["uid"] = "pod-b-other"
    known = followers(running_pods([current]), [follower, other_ns])
    assert set(known) == {"pod-b"}
    assert known["pod-b"].node == "gpu-3" and known["pod-b"].after == pytest.approx(NOW + 1800)
    assert known["pod-b"].current.remaining == 1


def node(name: str, running: tuple[Running, ...], free: int = 0) -> NodeState:
    return NodeState(name, 10_000 * GB, 0, free, running)


def test_a_known_follower_is_prepared_on_its_node_with_no_window_and_labelled() -> None:
    # the replay would put the job on gpu-2 (it frees first); the annotation says gpu-1
    nodes = [node("gpu-1", (Running(8, NOW + 20 * 3600, 5),)), node("gpu-2", (Running(8, NOW + 60, None),))]
    job = Waiting("pod-b", 8, (Want("d", DIGEST, 100 * GB),))
    known = {"pod-b": Known("gpu-1", NOW + 20 * 3600, nodes[0].running[0])}
    (prep,) = plan(nodes, [job], now=NOW, thresholds=Thresholds(), known=known)
    assert (prep.node, prep.phase, prep.source) == ("gpu-1", 1, "annotation")  # 20 h ahead: phase 1 all the same
    (prep,) = plan(nodes, [job], now=NOW, thresholds=Thresholds())
    assert (prep.node, prep.source) == ("gpu-2", "prediction")


@pytest.mark.parametrize(
    ("remaining", "phase"),
    [(5, 1), (2, 1), (1, 2), (None, 1)],
    ids=["many-left", "at-the-count", "fewer-than-the-count", "not-reported-lead-decides"],
)
def test_phase_2_starts_when_fewer_sub_tasks_than_the_preset_count_remain(remaining: int | None, phase: int) -> None:
    # the current job ends in 5 h: far beyond the 100 GB lead (10 min + 200 s) and the window;
    # with its sub-tasks reported, the count decides instead
    current = Running(8, NOW + 5 * 3600, remaining)
    nodes = [node("gpu-1", (current,))]
    job = Waiting("pod-b", 8, (Want("d", DIGEST, 100 * GB),))
    known = {"pod-b": Known("gpu-1", current.expected_end, current)}
    (prep,) = plan(nodes, [job], now=NOW, thresholds=Thresholds(subtasks_remaining=2), known=known)
    assert prep.phase == phase


def test_the_controller_puts_both_phases_on_the_agent_and_deletes_what_the_plan_drops() -> None:
    calls: list[tuple[str, str, str, Any]] = []

    def agent_call(node_name: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any]:
        calls.append((node_name, method, path, body))
        phase = body["phase"] if body else 1
        return 200, {"task": path.rsplit("/", 1)[1], "phase": phase, "state": "reserved" if phase == 1 else "fetching"}

    gpu = make_node("gpu-1", annotations={"dsagent.io/free-gpus": ""})
    inventories = {"gpu-1": {"capacityBytes": 10_000 * GB, "datasets": {}}}
    current = make_pod("train-a-0", namespace="ml", node_name="gpu-1", gpus=8, phase="Running")
    current["metadata"]["annotations"] = {"dsagent.io/next-job": "train-b", "dsagent.io/progress": "3/4"}
    follower = owned(make_pod("train-b-0", namespace="ml", gpus=8), "Job", "train-b", "u-b")
    follower["metadata"].update(uid="pod-b", annotations={"dsagent.io/datasets": "d"})
    ds = make_dataset(
        "d", namespace="ml", source="s3://b/d", bundles="s3://b/store", status={"digest": DIGEST, "bytes": GB}
    )
    presets = Thresholds(subtasks_remaining=2)
    out = prepare_pass([gpu], inventories, [ds], presets, pods=[current, follower], now=lambda: NOW,
                       agent_call=agent_call, metrics=ControllerMetrics())  # fmt: skip
    (put,) = calls
    assert put[:3] == ("gpu-1", "PUT", "/v1/preparations/pod-b")
    assert put[3]["phase"] == 2 and put[3]["firstThreshold"] == 0.3 and put[3]["secondThreshold"] == 0.9
    assert put[3]["datasets"][0]["bundles"] == "s3://b/store"
    (entry,) = out[("ml", "d")]["pods"]
    assert (entry["phase"], entry["state"], entry["source"]) == (2, "fetching", "annotation")
    # the follower is bound: the plan drops it and the agent's preparation is deleted
    ds["status"]["preparation"] = out[("ml", "d")]
    follower["spec"]["nodeName"] = "gpu-1"
    calls.clear()
    prepare_pass([gpu], inventories, [ds], presets, pods=[current, follower], now=lambda: NOW,
                 agent_call=agent_call, metrics=ControllerMetrics())  # fmt: skip
    assert calls == [("gpu-1", "DELETE", "/v1/preparations/pod-b", None)]


def test_an_agents_answer_about_a_preparation_is_hostile_input() -> None:
    assert preparation_report(None) == ("unreachable", 1)
    assert preparation_report((500, {"state": "prepared"})) == ("failed", 1)
    assert preparation_report((200, {"state": "<script>", "phase": 7})) == ("unknown", 1)
    assert preparation_report((200, {"state": "fetching", "phase": 2})) == ("fetching", 2)


def test_the_follow_up_namespaces_on_the_nodes_are_hostile_input() -> None:
    nodes = [
        make_node("a", annotations={FOLLOW_UPS: "ml,team-b"}),
        make_node("b", annotations={FOLLOW_UPS: "../etc,Upper,ok,x" + "y" * 63}),
        make_node("c", annotations={FOLLOW_UPS: ",".join(f"n{i}" for i in range(10))}),
        make_node("d", annotations={FOLLOW_UPS: "z" * 10_000}),
        make_node("e"),
        {"metadata": "not an object"},
    ]
    found = follow_up_namespaces(nodes)
    assert {"ml", "team-b", "ok"} <= set(found) and not {"../etc", "Upper", ""} & set(found)
    assert {n for n in found if n.startswith("n")} == {
        f"n{i}" for i in range(FOLLOW_UPS_MAX)
    }  # the first 4 a node names
    assert found == sorted(found)


def test_a_pass_preparing_named_follow_ups_reads_the_pods_of_their_namespaces_only() -> None:
    listed_ns: list[str] = []

    def namespace_pods(ns: str) -> list[dict[str, Any]]:
        listed_ns.append(ns)
        return [make_pod(f"p-{ns}", namespace=ns)]

    def every_pod() -> list[dict[str, Any]]:
        raise AssertionError("every pod listed")

    named = [make_node("a", annotations={FOLLOW_UPS: "ml"})]
    ds = make_dataset("d", namespace="ml")
    kw: dict[str, Any] = {"named_only": True, "every_pod": every_pod, "namespace_pods": namespace_pods}
    assert pods_to_prepare([make_node("a")], [ds], listed=None, **kw) is None  # nothing named, nothing to release
    pods = pods_to_prepare(named, [ds], listed=None, **kw)
    assert [p["metadata"]["name"] for p in pods or []] == ["p-ml"] and listed_ns == ["ml"]
    already = [make_pod("x", namespace="ml"), make_pod("y", namespace="other")]
    pods = pods_to_prepare(named, [ds], listed=already, **kw)  # listed this pass anyway: no request
    assert [p["metadata"]["name"] for p in pods or []] == ["x"] and listed_ns == ["ml"]
    ds["status"] = {"preparation": {"pods": [{"uid": "u", "node": "a", "state": "reserved"}]}}
    assert pods_to_prepare([make_node("a")], [ds], listed=None, **kw) == []  # released with no pod read
    assert pods_to_prepare([], [ds], listed=None, named_only=False, every_pod=lambda: already,
                           namespace_pods=namespace_pods) == already  # fmt: skip


def test_the_agents_are_asked_to_prepare_and_release_together_each_answer_to_its_pod() -> None:
    import threading
    import time

    nodes, pods, inventories = [], [], {}
    for i in range(6):
        nodes.append(make_node(f"gpu-{i}", annotations={"dsagent.io/free-gpus": ""}))
        inventories[f"gpu-{i}"] = {"capacityBytes": 10_000 * GB, "datasets": {}}
        current = make_pod(f"train-a{i}-0", namespace="ml", node_name=f"gpu-{i}", gpus=8, phase="Running")
        current["metadata"]["annotations"] = {"dsagent.io/next-job": f"train-b{i}", "dsagent.io/progress": "3/4"}
        follower = owned(make_pod(f"train-b{i}-0", namespace="ml", gpus=8), "Job", f"train-b{i}", f"u-b{i}")
        follower["metadata"].update(uid=f"pod-b{i}", annotations={"dsagent.io/datasets": "d"})
        pods += [current, follower]
    ds = make_dataset(
        "d", namespace="ml", source="s3://b/d", bundles="s3://b/store", status={"digest": DIGEST, "bytes": GB}
    )
    lock, now_in, most = threading.Lock(), [0], [0]

    def agent_call(node_name: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any]:
        with lock:
            now_in[0] += 1
            most[0] = max(most[0], now_in[0])
        time.sleep(0.05)  # a node's round trip
        with lock:
            now_in[0] -= 1
        state = "fetching" if node_name.endswith(("0", "2", "4")) else "reserved"  # each node its own answer
        return 200, {"task": path.rsplit("/", 1)[1], "phase": 2 if state == "fetching" else 1, "state": state}

    presets = Thresholds(subtasks_remaining=2)
    out = prepare_pass(nodes, inventories, [ds], presets, pods=pods, now=lambda: NOW,
                       agent_call=agent_call, metrics=ControllerMetrics())  # fmt: skip
    entries = {e["node"]: (e["uid"], e["state"]) for e in out[("ml", "d")]["pods"]}
    assert entries == {f"gpu-{i}": (f"pod-b{i}", "fetching" if i % 2 == 0 else "reserved") for i in range(6)}
    assert most[0] > 1  # not one node after another
    ds["status"]["preparation"] = out[("ml", "d")]
    for i in range(6):  # every follower bound: every preparation released, together
        pods[2 * i + 1]["spec"]["nodeName"] = f"gpu-{i}"
    most[0] = 0
    metrics = ControllerMetrics()
    prepare_pass(nodes, inventories, [ds], presets, pods=pods, now=lambda: NOW,
                 agent_call=agent_call, metrics=metrics)  # fmt: skip
    assert most[0] > 1
    assert metrics.preparation_releases._value.get() == 6
