"""End to end without a cluster: a two-worker job through the webhook, then the extender.

Two workers of one PyTorchJob ask for ``nvidia.com/gpu: 4`` each. Each is admitted by a
different webhook replica (over HTTP, AdmissionReview v1, the fake API server holding the
Nodes and the job's Lease); both come out asking for the same class resource, the one the
cluster-wide vote chose for the first. The extender's filter (over HTTP, ExtenderArgs as
kube-scheduler sends them) then passes only the nodes with 4 free GPUs of that class.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dsagent.webhook.gpurequest import GpuClassSettings, lease_name
from dsagent.webhook.mutation import Injection
from dsagent.webhook.roceclass import GpuClassPolicy, KubeGpuClasses, read_cluster
from dsagent.webhook.server import create_app as webhook_app
from scheduler_plugin.app import create_app as extender_app
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import args_body, node, topology_json
from tests.scheduler_plugin.server import serving
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_pod, pod_review

SETTINGS = GpuClassSettings(enabled=True)
OWNER = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "name": "bert",
    "uid": "5b0e2c1a-pytorchjob-bert",
    "controller": True,
    "blockOwnerDeletion": True,
}
# Free GPUs per node (gpu-roce1 = GPUs 0-3, gpu-roce2 = 4-7). The vote: a suggests both
# classes, b and e gpu-roce2, c gpu-roce1, d nothing (3 free at most): gpu-roce2, 3 to 2.
FREE = {"a": range(8), "b": [4, 5, 6, 7], "c": [0, 1, 2, 3], "d": [4, 5, 6], "e": [0, 1, 4, 5, 6, 7]}


def worker(index: int) -> dict[str, Any]:
    pod = make_pod(
        f"bert-worker-{index}",
        namespace="ml",
        gpus=4,
        labels={"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "worker"},
    )
    pod["metadata"]["ownerReferences"] = [OWNER]
    pod["metadata"]["uid"] = f"uid-bert-worker-{index}"
    return pod


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for name, free in FREE.items():
            obj = node(name, topology=topology_json(), free_gpus=free)
            obj["kind"], obj["apiVersion"] = "Node", "v1"
            obj["metadata"].pop("resourceVersion")
            server.create(obj)
        yield server


def admit(apiserver: FakeApiServer, pod: dict[str, Any]) -> dict[str, Any]:
    """One webhook replica (its own API client and node cache) admits ``pod``."""
    client = apiserver.api_client()
    try:
        policy = GpuClassPolicy(SETTINGS, KubeGpuClasses(client, SETTINGS))
        with serving(webhook_app(Injection(image="img:1"), lambda ns, name: pytest.fail("no datasets"), policy)) as url:
            answer = httpx.post(f"{url}/mutate", json=pod_review(pod, namespace="ml"), timeout=30).json()["response"]
    finally:
        client.close()
    assert answer["allowed"] is True and "warnings" not in answer
    mutated: dict[str, Any] = json_patch(copy.deepcopy(pod), json.loads(base64.b64decode(answer["patch"])))
    return mutated


def test_a_two_worker_job_gets_one_class_and_the_filter_holds_it_to_free_gpus_of_that_class(
    apiserver: FakeApiServer,
) -> None:
    first = admit(apiserver, worker(0))
    # Meanwhile node b's gpu-roce2 GPUs fill up and its gpu-roce1 ones free: a fresh vote
    # would now pick gpu-roce1 (a, b, c against a, e), but the job's Lease keeps gpu-roce2.
    apiserver.patch("nodes", "b", {"metadata": {"annotations": {"dsagent.io/free-gpus": "0,1,2,3"}}})
    assert read_cluster(apiserver.list("nodes")).vote(4) == "gpu-roce1"
    second = admit(apiserver, worker(1))

    for pod in (first, second):
        for kind in ("limits", "requests"):
            assert pod["spec"]["containers"][0]["resources"][kind] == {"dsagent.io/gpu-roce2": "4"}
        assert pod["metadata"]["annotations"]["dsagent.io/gpu-class"] == "gpu-roce2"
    lease = apiserver.get("leases", lease_name("ml/bert"), "ml")
    assert lease is not None and lease["spec"]["holderIdentity"] == "gpu-roce2"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == OWNER["uid"]

    nodes = apiserver.list("nodes")
    with serving(extender_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        result = http.post(
            "/filter",
            content=args_body(second, nodes, node_cache_capable=False),
            headers={"Content-Type": "application/json"},
        ).json()
    assert result["Error"] == ""
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["a", "e"]
    assert result["FailedNodes"] == {
        "b": "0 free GPUs in class gpu-roce2, pod needs 4",
        "c": "0 free GPUs in class gpu-roce2, pod needs 4",
        "d": "3 free GPUs in class gpu-roce2, pod needs 4",
    }
