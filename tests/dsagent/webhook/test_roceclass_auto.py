"""``DSAGENT_WEBHOOK_GPU_CLASSES=auto``: class resources only between the nodes of one job,
and only over the nodes the dsagent device plugin serves (fake API server).

Served nodes are DGX A100 fixtures (four classes of two GPUs) labelled
``dsagent.io/device-plugin=true``; the others (A100s labelled ``false``, and unlabelled
nodes of the two-class test topology) are served by NVIDIA's plugin, with ``nvidia.com/gpu``
only, so their free GPUs never count.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dsagent.errors import SettingsError
from dsagent.webhook.gpurequest import GpuClassSettings, lease_name
from dsagent.webhook.mutation import Injection
from dsagent.webhook.roceclass import SPLIT, SPLIT_ANNOTATION, GpuClassPolicy, KubeGpuClasses, read_cluster
from dsagent.webhook.server import WebhookSettings
from dsagent.webhook.server import create_app as webhook_app
from dsplatform.published import DEVICE_PLUGIN_LABEL
from tests.dsagent.webhook.test_roceclass import gpu_node, resources, worker
from tests.dsagent.webhook.test_roceclass_sets import A100, member
from tests.scheduler_plugin.server import serving
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_pod, pod_review

AUTO = GpuClassSettings(mode="auto")
ON = GpuClassSettings(mode="on")
KEEPS = "the job keeps its nvidia.com/gpu request"
ON_SERVED = "on the nodes the dsagent device plugin serves (dsagent.io/device-plugin=true)"


def node(name: str, free: list[int], served: str | None = "true", *, topology: str | None = A100) -> dict[str, Any]:
    """A GPU node; ``served``: its device-plugin label (None: unlabelled)."""
    obj = gpu_node(name, free, topology=topology)
    if served is not None:
        obj["metadata"].setdefault("labels", {})[DEVICE_PLUGIN_LABEL] = served
    return obj


def quad(name: str, free: list[int]) -> dict[str, Any]:
    """An unlabelled node of the two-class test topology (two classes of four GPUs)."""
    return node(name, free, None, topology=None)


@pytest.fixture
def both(apiserver: FakeApiServer) -> Iterator[tuple[GpuClassPolicy, GpuClassPolicy]]:
    """A policy in ``on`` mode and one in ``auto`` mode, over the same cluster."""
    client = apiserver.api_client()
    try:
        yield GpuClassPolicy(ON, KubeGpuClasses(client, ON)), GpuClassPolicy(AUTO, KubeGpuClasses(client, AUTO))
    finally:
        client.close()


@pytest.fixture
def auto(apiserver: FakeApiServer) -> Iterator[GpuClassPolicy]:
    client = apiserver.api_client()
    try:
        yield GpuClassPolicy(AUTO, KubeGpuClasses(client, AUTO))
    finally:
        client.close()


def admitted(policy: GpuClassPolicy, pod: dict[str, Any]) -> tuple[dict[str, Any], list[Any], tuple[str, ...]]:
    decision = policy.decide(pod, "ml", annotations_exist=pod["metadata"].get("annotations") is not None)
    return json_patch(copy.deepcopy(pod), decision.patch), decision.patch, decision.warnings


def holder(apiserver: FakeApiServer, job: str) -> str | None:
    lease = apiserver.get("leases", lease_name(f"ml/{job}"), "ml")
    return None if lease is None else str(lease["spec"]["holderIdentity"])


# -- the settings


@pytest.mark.parametrize(
    ("value", "mode", "enabled"),
    [("auto", "auto", True), ("AUTO", "auto", True), ("true", "on", True), ("on", "on", True)]
    + [("false", "off", False), ("off", "off", False), ("0", "off", False)],
)
def test_gpu_classes_is_on_off_or_auto_and_a_boolean_means_on_or_off(value: str, mode: str, enabled: bool) -> None:
    settings = GpuClassSettings.from_env({"DSAGENT_WEBHOOK_GPU_CLASSES": value})
    assert (settings.mode, settings.enabled, settings.auto) == (mode, enabled, mode == "auto")
    # given directly, by the field's name or by the name it had as a flag
    assert GpuClassSettings(mode=value).mode == GpuClassSettings(enabled=value).mode == mode
    # the webhook serves a class policy (server.serve) for on and auto alike
    webhook = WebhookSettings.from_env({"DSAGENT_WEBHOOK_GPU_CLASSES": value}, injection=Injection(image="img:1"))
    assert webhook.gpu_classes.enabled is enabled


def test_a_gpu_classes_value_that_is_no_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(SettingsError, match=r"DSAGENT_WEBHOOK_GPU_CLASSES='sometimes'.*expected on, off or auto"):
        GpuClassSettings.from_env({"DSAGENT_WEBHOOK_GPU_CLASSES": "sometimes"})


def test_the_served_label_defaults_to_the_agents_and_must_be_a_label_key() -> None:
    assert GpuClassSettings.from_env({}).served_label == DEVICE_PLUGIN_LABEL == "dsagent.io/device-plugin"
    renamed = GpuClassSettings.from_env({"DSAGENT_WEBHOOK_SERVED_LABEL": "example.com/gpu-plugin"})
    assert renamed.served_label == "example.com/gpu-plugin"
    with pytest.raises(SettingsError, match=r"DSAGENT_WEBHOOK_SERVED_LABEL='not a label'.*not a label key"):
        GpuClassSettings.from_env({"DSAGENT_WEBHOOK_SERVED_LABEL": "not a label"})


# -- the cluster view


def test_only_nodes_labelled_served_count_when_a_label_is_given() -> None:
    nodes = [node("a", list(range(8))), node("b", list(range(8)), "false"), quad("q", list(range(8)))]
    assert len(read_cluster(nodes).sizes) == 3  # on: every node counts
    view = read_cluster(nodes, DEVICE_PLUGIN_LABEL)
    assert len(view.sizes) == len(view.rooms) == 1 and set(view.sizes[0]) == {f"gpu-roce{i}" for i in (1, 2, 3, 4)}
    assert read_cluster(nodes, "example.com/other").sizes == ()


# -- pods outside a multi-worker job


def test_a_single_pod_or_single_worker_job_keeps_its_request_without_a_lease(
    apiserver: FakeApiServer, auto: GpuClassPolicy
) -> None:
    apiserver.create(node("a100-0", list(range(8))))
    apiserver.create(node("a100-1", list(range(8))))
    # a pod of no job, a job's worker that names no worker count, a job of one worker
    for pod in (worker(gpus=4, job=None, owner=None), worker(gpus=4), member(0, 1, gpus=2, job="solo")):
        patched, patch, warnings = admitted(auto, pod)
        assert (patch, warnings) == ([], ())
        assert patched == pod
    assert apiserver.list("leases") == []


# -- multi-worker jobs


def test_a_job_a_served_set_holds_gets_the_set_and_its_lease(apiserver: FakeApiServer, auto: GpuClassPolicy) -> None:
    apiserver.create(node("a100-0", list(range(8))))
    apiserver.create(node("a100-1", list(range(8))))
    apiserver.create(quad("quad-0", list(range(8))))
    for index in (0, 1):
        patched, _, warnings = admitted(auto, member(index, 2))
        assert warnings == ()
        assert resources(patched)["limits"] == resources(patched)["requests"] == {"dsagent.io/gpu-roce1-2": "4"}
        assert patched["metadata"]["annotations"]["dsagent.io/gpu-class"] == "gpu-roce1+gpu-roce2"
        assert SPLIT_ANNOTATION not in patched["metadata"]["annotations"]
    assert holder(apiserver, "bert") == "gpu-roce1+gpu-roce2"
    assert len(apiserver.list("leases")) == 1


def test_unserved_nodes_free_gpus_do_not_count_and_the_job_keeps_its_plain_request(
    apiserver: FakeApiServer, both: tuple[GpuClassPolicy, GpuClassPolicy]
) -> None:
    # two 8-GPU workers: one served A100 has room; an A100 labelled false and an unlabelled
    # A100 would each hold the other worker in the same set, if they counted
    apiserver.create(node("a100-0", list(range(8))))
    apiserver.create(node("a100-1", list(range(8)), "false"))
    apiserver.create(node("a100-2", list(range(8)), None))
    on, auto = both
    counted, _, _ = admitted(on, member(0, 2, gpus=8, job="everywhere"))
    assert resources(counted)["limits"] == {"dsagent.io/gpu-roce1-2-3-4": "8"}  # on: every node counts

    reasons = []
    for index in (0, 1):
        kept, patch, warnings = admitted(auto, member(index, 2, gpus=8, job="wide"))
        assert warnings == ()
        assert resources(kept)["limits"] == resources(kept)["requests"] == {"nvidia.com/gpu": "8"}
        assert [op["path"] for op in patch] == ["/metadata/annotations/dsagent.io~1class-set-split"]
        assert "dsagent.io/gpu-class" not in kept["metadata"]["annotations"]
        reasons.append(kept["metadata"]["annotations"][SPLIT_ANNOTATION])
    assert all(reason.startswith(KEEPS) and f"no class set {ON_SERVED}" in reason for reason in reasons)
    assert "can hold 2 workers of 8 GPUs now (best: gpu-roce1+gpu-roce2+gpu-roce3+gpu-roce4, 1 nodes" in reasons[0]
    assert "when the job's first worker came" in reasons[1]  # the later worker reads the Lease
    assert holder(apiserver, "wide") == SPLIT


def test_a_job_whose_workers_no_served_node_can_take_keeps_its_request_alike(
    apiserver: FakeApiServer, auto: GpuClassPolicy
) -> None:
    # 16-GPU workers: no served node's layout serves one; the Lease still says so for all
    apiserver.create(node("a100-0", list(range(8))))
    kept, _, warnings = admitted(auto, member(0, 2, gpus=16, job="huge"))
    assert warnings == () and resources(kept)["limits"] == {"nvidia.com/gpu": "16"}
    assert KEEPS in kept["metadata"]["annotations"][SPLIT_ANNOTATION]
    assert "can take a worker of 16 GPUs" in kept["metadata"]["annotations"][SPLIT_ANNOTATION]
    assert holder(apiserver, "huge") == SPLIT


def test_with_no_served_node_a_job_keeps_its_request_without_a_lease_or_annotation(
    apiserver: FakeApiServer, auto: GpuClassPolicy
) -> None:
    apiserver.create(node("a100-0", list(range(8)), "false"))
    apiserver.create(quad("quad-0", list(range(8))))
    for pod in (member(0, 2), member(1, 2), member(0, 2, job="strict", placement="required")):
        _, patch, warnings = admitted(auto, pod)
        assert (patch, warnings) == ([], ())
    assert apiserver.list("leases") == []


def test_served_nodes_that_publish_no_free_gpus_yet_decide_nothing_for_the_job(
    apiserver: FakeApiServer, auto: GpuClassPolicy
) -> None:
    # a served node whose agent has not published its free GPUs yet (just started): its
    # room is unknown, so no set is chosen and the job is not recorded as split for good;
    # once the node publishes them, the job's next worker gets the set
    for name in ("a100-0", "a100-1"):
        fresh = node(name, list(range(8)))
        del fresh["metadata"]["annotations"]["dsagent.io/free-gpus"]
        apiserver.create(fresh)
    kept, patch, warnings = admitted(auto, member(0, 2))
    assert (patch, warnings) == ([], ()) and resources(kept)["limits"] == {"nvidia.com/gpu": "4"}
    assert apiserver.list("leases") == []
    for name in ("a100-0", "a100-1"):
        apiserver.delete("nodes", name)
        apiserver.create(node(name, list(range(8))))
    client = apiserver.api_client()
    try:  # a webhook whose view of the nodes is newer than the first one's
        later = GpuClassPolicy(AUTO, KubeGpuClasses(client, AUTO))
        patched, _, _ = admitted(later, member(1, 2))
    finally:
        client.close()
    assert resources(patched)["limits"] == {"dsagent.io/gpu-roce1-2": "4"}
    assert holder(apiserver, "bert") == "gpu-roce1+gpu-roce2"


def test_a_job_requiring_one_subnet_is_rewritten_to_wait_for_a_served_set(
    apiserver: FakeApiServer, auto: GpuClassPolicy
) -> None:
    # two 4-GPU workers, one served A100 with room for one; the unserved A100 has room too
    apiserver.create(node("a100-0", list(range(8))))
    apiserver.create(node("a100-1", list(range(8)), "false"))
    patched, _, warnings = admitted(auto, member(0, 2, job="strict", placement="required"))
    assert warnings == ()
    assert resources(patched)["limits"] == {"dsagent.io/gpu-roce1-2": "4"}
    assert SPLIT_ANNOTATION not in patched["metadata"]["annotations"]
    assert holder(apiserver, "strict") == "gpu-roce1+gpu-roce2"


# -- a pod that asks for a class itself


def test_a_pod_asking_for_a_class_resource_is_handled_as_with_on(
    apiserver: FakeApiServer, both: tuple[GpuClassPolicy, GpuClassPolicy]
) -> None:
    apiserver.create(node("a100-0", list(range(8))))
    apiserver.create(node("a100-1", list(range(8))))
    outcomes = []
    for mode, policy in zip(("on", "auto"), both):
        job = f"bert-{mode}"
        first = worker(0, gpus=2, job=job, resource="dsagent.io/gpu-roce2")
        second = worker(1, gpus=2, job=job, resource="dsagent.io/gpu-roce3")
        lone = worker(0, gpus=2, job=None, owner=None, resource="dsagent.io/gpu-roce4")
        results = [admitted(policy, pod) for pod in (first, second, lone)]
        assert results[0][1:] == ([], ())  # the job's first worker: its own class, kept
        assert resources(results[1][0])["limits"] == {"dsagent.io/gpu-roce2": "2"}  # held to the job's class
        assert results[1][2] and "uses GPU class gpu-roce2" in results[1][2][0]
        assert results[2][1:] == ([], ())
        assert holder(apiserver, job) == "gpu-roce2"
        outcomes.append([(resources(pod), pod["metadata"].get("annotations"), len(w)) for pod, _, w in results])
    assert outcomes[0] == outcomes[1]


# -- through the webhook


def test_through_the_webhook_auto_leaves_a_single_gpu_pods_request_alone(apiserver: FakeApiServer) -> None:
    apiserver.create(node("a100-0", list(range(8))))
    apiserver.create(node("a100-1", list(range(8))))
    apiserver.create(quad("quad-0", list(range(8))))
    settings = GpuClassSettings.from_env({"DSAGENT_WEBHOOK_GPU_CLASSES": "auto"})
    client = apiserver.api_client()
    answers = []
    try:
        policy = GpuClassPolicy(settings, KubeGpuClasses(client, settings))
        app = webhook_app(Injection(image="img:1"), lambda ns, name: pytest.fail("no datasets"), policy)
        with serving(app) as url:
            for pod in (make_pod("single", namespace="ml", gpus=1), member(0, 2, job="pair")):
                review = pod_review(pod, namespace="ml")
                answers.append(httpx.post(f"{url}/mutate", json=review, timeout=30).json()["response"])
    finally:
        client.close()
    single, pair = answers
    assert single == {"uid": "review-single", "allowed": True}  # no patch, no warning
    assert pair["allowed"] is True and "warnings" not in pair
    patched = json_patch(copy.deepcopy(member(0, 2, job="pair")), json.loads(base64.b64decode(pair["patch"])))
    assert resources(patched)["limits"] == {"dsagent.io/gpu-roce1-2": "4"}  # the job's set, on the served A100s
    assert holder(apiserver, "pair") == "gpu-roce1+gpu-roce2"
