"""End to end with the fakes: a job's class set through webhook -> extender -> device plugin.

A two-worker job whose pods ask ``nvidia.com/gpu: 4`` (``dsagent.io/workers: "2"``) on
three DGX-A100-class nodes (the NPS4 fixture: four RoCE classes of two GPUs, each class's
GPUs near two NICs), each Node annotated with its topology and free GPUs as the agent
publishes them (docs/design.md#class-sets):

1. the webhook (over HTTP, AdmissionReview v1, a fresh replica per worker, against the
   fake API server) chooses the job's class set, keeps it in the job's Lease, rewrites
   each worker's request into the set's resource and adds the Multus attachment of every
   class of the set;
2. the extender (over HTTP, ExtenderArgs as kube-scheduler sends them) keeps each worker
   on the nodes with free GPUs in exactly that set;
3. on the chosen node, the agent's device plugin as ``dsagent serve`` starts it registers
   with a fake kubelet (real gRPC over unix sockets); the kubelet lists the set's devices,
   asks GetPreferredAllocation and Allocates: the worker gets two GPUs of each class, one VF
   of every NIC near its GPUs, and NCCL is told to use all of them, rails kept apart.

After a worker's Allocate its node republishes its free GPUs, so the second worker lands
on the other node that serves the set.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.cache.settings import Settings as AgentSettings
from dsagent.nodeagent.nodeparts import start_device_plugin
from dsagent.nodeagent.publisher import desired_annotations
from dsagent.webhook.gpurequest import GpuClassSettings, lease_name
from dsagent.webhook.mutation import Injection
from dsagent.webhook.roceclass import GpuClassPolicy, KubeGpuClasses
from dsagent.webhook.server import create_app as webhook_app
from gpu_topology import Topology, to_json
from gpu_topology.discovery.nvidia_smi import parse_topo_matrix
from scheduler_plugin.app import create_app as extender_app
from scheduler_plugin.settings import Settings as ExtenderSettings
from scheduler_plugin.testing import args_body
from tests.fake_kubelet import FakeKubelet
from tests.scheduler_plugin.server import serving
from tests.sysfs_vf import build_dgx_a100_vfs, vf_rdma
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_node, make_pod, pod_review

pytestmark = pytest.mark.slow

DGX_A100 = "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt"
PREFIX = "example.com"  # the chart's gpuClasses.resourcePrefix, given to all three
SET = f"{PREFIX}/gpu-roce1-2"  # classes 1 (GPUs 0, 1) and 2 (GPUs 2, 3)
OWNER = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "name": "bert",
    "uid": "0d5e7a52-pytorchjob-bert",
    "controller": True,
    "blockOwnerDeletion": True,
}
# Free GPUs per node. Classes 1+2 are free on a100-0, a100-1 and a100-3; classes 3+4 on
# a100-0 and a100-2; 2+3 on a100-0 only. Every set of two classes that holds both workers
# now, 1+2 on the most nodes: the job's set. a100-2 has four free GPUs, but not in it.
FREE = {"a100-0": list(range(8)), "a100-1": [0, 1, 2, 3], "a100-2": [4, 5, 6, 7], "a100-3": [0, 1, 2, 3]}
SERVE_THE_SET = ("a100-0", "a100-1", "a100-3")


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-{index:012x}"


@pytest.fixture(scope="module")
def a100(fixtures_dir: Path) -> Topology:
    """The DGX A100 matrix as the agent reads it, with made-up UUIDs (``nvidia-smi topo -m`` prints none)."""
    topology = parse_topo_matrix((fixtures_dir / "topology" / DGX_A100).read_text(encoding="utf-8"))
    return dataclasses.replace(
        topology, gpus=tuple(dataclasses.replace(g, uuid=gpu_uuid(g.index)) for g in topology.gpus)
    )


@pytest.fixture
def apiserver(a100: Topology) -> Iterator[FakeApiServer]:
    published = to_json(a100)  # what ClusterAgent publishes with the default class rule
    with FakeApiServer() as server:
        for name, free in FREE.items():
            annotations = desired_annotations(None, published, free)
            # with the device plugin on, the node advertises class resources, not nvidia.com/gpu
            allocatable = {f"{PREFIX}/gpu-roce{i}": "2" for i in (1, 2, 3, 4)}
            server.create(make_node(name, annotations=annotations, gpus=0, extra_allocatable=allocatable))
        yield server


def worker(index: int) -> dict[str, Any]:
    pod = make_pod(
        f"bert-worker-{index}",
        namespace="ml",
        gpus=4,
        labels={"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "worker"},
        annotations={"dsagent.io/workers": "2"},
    )
    pod["metadata"]["ownerReferences"] = [OWNER]
    pod["metadata"]["uid"] = f"uid-bert-worker-{index}"
    return pod


def admit(apiserver: FakeApiServer, pod: dict[str, Any]) -> dict[str, Any]:
    """A fresh webhook replica (its own API client, no shared memory) admits ``pod``."""
    settings = GpuClassSettings(enabled=True, prefix=PREFIX, networks="dsplatform/rail-{class}")
    review = pod_review(pod, namespace="ml")
    client = apiserver.api_client()
    try:
        policy = GpuClassPolicy(settings, KubeGpuClasses(client, settings))
        app = webhook_app(Injection(image="img:1"), lambda ns, name: pytest.fail("no datasets"), policy)
        with serving(app) as url:
            answer = httpx.post(f"{url}/mutate", json=review, timeout=30).json()["response"]
    finally:
        client.close()
    assert answer["allowed"] is True and "warnings" not in answer
    mutated: dict[str, Any] = json_patch(copy.deepcopy(pod), json.loads(base64.b64decode(answer["patch"])))
    return mutated


def schedule(apiserver: FakeApiServer, pod: dict[str, Any]) -> tuple[str, list[str], dict[str, str]]:
    """kube-scheduler's extender calls: filter, then prioritize the survivors; the best node,
    the nodes that passed, and the reasons of those that failed."""
    nodes = apiserver.list("nodes")
    extender = extender_app(ExtenderSettings(roce_resource_prefix=f"{PREFIX}/gpu-roce"))
    headers = {"Content-Type": "application/json"}
    with serving(extender) as url, httpx.Client(base_url=url, timeout=30) as http:
        filtered = http.post("/filter", content=args_body(pod, nodes, node_cache_capable=False), headers=headers)
        result = filtered.json()
        assert result["Error"] == ""
        passed = list(result["Nodes"]["items"])
        failed = {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}
        scores = http.post("/prioritize", content=args_body(pod, passed, node_cache_capable=False), headers=headers)
    ranked = sorted(scores.json(), key=lambda hp: (-hp["Score"], hp["Host"]))
    return ranked[0]["Host"], sorted(n["metadata"]["name"] for n in passed), failed


async def kubelet_runs(base: Path, topology: Topology, resource: str, count: int) -> dict[str, Any]:
    """The node's agent serves the plugin; its kubelet lists, prefers and allocates ``count``."""
    (base / "dp").mkdir(parents=True)
    build_dgx_a100_vfs(base / "host")  # mlx5_0..7, two VFs each
    settings = AgentSettings.from_env(
        {
            "DSAGENT_ROOT": str(base / "root"),
            "DSAGENT_DEVICE_PLUGIN": "true",
            "DSAGENT_RESOURCE_PREFIX": PREFIX,
            "DSAGENT_DEVICE_PLUGIN_DIR": str(base / "dp"),
            "DSAGENT_POD_RESOURCES_SOCKET": str(base / "pr.sock"),
        }
    )
    kubelet = FakeKubelet(base / "dp")
    await kubelet.start()
    plugin = await start_device_plugin(settings, topology=topology, sysfs_root=base / "host")
    try:
        registered = [r.resource_name for r in kubelet.registrations]
        devices = await kubelet.first_list(resource)
        available = [d.ID for d in devices if d.health == "Healthy"]
        preferred = await kubelet.preferred(resource, available, [], count)
        answer = await kubelet.allocate(resource, preferred)
        return {"registered": registered, "available": available, "preferred": preferred, "answer": answer}
    finally:
        await plugin.stop()
        await kubelet.stop()


def test_a_two_worker_job_keeps_one_class_set_through_webhook_extender_and_device_plugin(
    apiserver: FakeApiServer, a100: Topology, short_dir: Path
) -> None:
    placed: dict[str, str] = {}
    for index in (0, 1):
        pod = admit(apiserver, worker(index))
        # 1. the webhook: the set's resource, its classes' attachments, the set in the Lease
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {SET: "4"} and pod["spec"]["containers"][0]["resources"]["requests"] == {SET: "4"}
        annotations = pod["metadata"]["annotations"]
        assert annotations["dsagent.io/gpu-class"] == "gpu-roce1+gpu-roce2"
        assert annotations["k8s.v1.cni.cncf.io/networks"] == "dsplatform/rail-gpu-roce1,dsplatform/rail-gpu-roce2"
        assert "dsagent.io/class-set-split" not in annotations
        lease = apiserver.get("leases", lease_name("ml/bert"), "ml")
        assert lease is not None and lease["spec"]["holderIdentity"] == "gpu-roce1+gpu-roce2"

        # 2. the extender: only nodes with 2 + 2 free GPUs in classes 1 and 2 (a100-0 has
        # them no more once the first worker is there)
        node, passed, failed = schedule(apiserver, pod)
        expected = sorted(n for n in SERVE_THE_SET if n not in placed.values())
        assert passed == expected
        assert "class set gpu-roce1+gpu-roce2" in failed["a100-2"]
        placed[pod["metadata"]["name"]] = node

        # 3. the device plugin on that node: two GPUs of each class, one VF on the set's first rail
        run = asyncio.run(kubelet_runs(short_dir / f"w{index}", a100, SET, 4))
        assert SET in run["registered"]
        assert sorted(run["preferred"]) == [gpu_uuid(i) for i in range(4)]
        answer = run["answer"]
        # GPUs 0-3 sit near mlx5_0..3: one VF, of class 1's first NIC, the same on every worker
        assert answer.envs["NCCL_IB_HCA"] == f"={vf_rdma(0, 0)}" and "NCCL_CROSS_NIC" not in answer.envs
        assert sorted(answer.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == [gpu_uuid(i) for i in range(4)]

        # the agent republishes the node's free GPUs (pod-resources after the Allocate)
        free = [g for g in FREE[node] if g not in range(4)]
        apiserver.patch(
            "nodes", node, {"metadata": {"annotations": {"dsagent.io/free-gpus": ",".join(map(str, free))}}}
        )
        apiserver.create(pod)  # the admitted pod exists (its Lease owner's sibling)

    assert len(set(placed.values())) == 2 and set(placed.values()) <= set(SERVE_THE_SET)
