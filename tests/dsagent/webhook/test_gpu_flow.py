"""End to end with the fakes: webhook -> extender -> device plugin.

A two-worker PyTorchJob whose pods ask ``nvidia.com/gpu: 4`` on five DGX-1 nodes (the
fixture's ``nvidia-smi topo -m``; by the ``numa`` rule two classes: ``gpu-roce1`` = GPUs
0-3 with ``mlx5_0,1``, ``gpu-roce2`` = GPUs 4-7 with ``mlx5_2,3``), each Node annotated
with its topology and free GPUs as the agent publishes them (``desired_annotations``):

1. the webhook (over HTTP, AdmissionReview v1, against the fake API server) rewrites each
   worker's request into the job's class resource, the class kept in the job's Lease;
2. the extender (over HTTP, ExtenderArgs as kube-scheduler sends them) filters and
   prioritizes the nodes; the worker goes to the best-scored node (ties: by name, where
   kube-scheduler would pick one at random);
3. on that node, the agent's device plugin, started as ``dsagent serve`` starts it
   (:func:`dsagent.nodeagent.nodeparts.start_device_plugin`, from the same :class:`Settings` whose
   ``roce_classes`` the agent publishes with), registers with a fake kubelet (real gRPC over
   unix sockets); the kubelet lists the class's devices, asks GetPreferredAllocation and
   Allocates. Each node has its own sysfs tree with two VFs per IB NIC (tests/sysfs_vf.py).

After a worker's Allocate, its node republishes its free GPUs (as the agent does from the
kubelet's pod-resources API), so the second worker lands on another node.

One resource prefix (``example.com``, not the default) is given to all three, as the chart
gives ``gpuClasses.resourcePrefix`` to each.
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
from gpu_topology import Topology, best_gpu_set, to_json
from gpu_topology.discovery.sriov import discover_vfs
from gpu_topology.dumps import load_dump
from scheduler_plugin.app import create_app as extender_app
from scheduler_plugin.settings import Settings as ExtenderSettings
from scheduler_plugin.testing import args_body
from tests.fake_kubelet import FakeKubelet
from tests.scheduler_plugin.server import serving
from tests.sysfs_vf import build_vfs
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_node, make_pod, pod_review

DGX1 = "dgx1-v100-4ib-nvidia-smi-topo-m.txt"
PREFIX = "example.com"  # the chart's gpuClasses.resourcePrefix, given to all three
MODE = "numa"  # the agent's DSAGENT_ROCE_CLASSES
GPUS = 4
OWNER = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "name": "llama",
    "uid": "0d5e7a52-pytorchjob-llama",
    "controller": True,
    "blockOwnerDeletion": True,
}
# Free GPUs per node. Each node suggests its class with the most free GPUs (at least 4):
# n1, n2, n3 suggest gpu-roce2, n4 gpu-roce1, n5 nothing (3 + 2): the vote is gpu-roce2.
FREE = {"n1": [1, 2, 3, 4, 5, 6, 7], "n2": [4, 5, 6, 7], "n3": [4, 5, 6, 7], "n4": [0, 1, 2, 3], "n5": [0, 1, 2, 4, 5]}


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-{index:012x}"


@pytest.fixture(scope="module")
def dgx1(fixtures_dir: Path) -> Topology:
    """The DGX-1 matrix through gpu_topology's dump loader, with made-up UUIDs."""
    topology = load_dump(fixtures_dir / "topology" / DGX1)
    return dataclasses.replace(
        topology, gpus=tuple(dataclasses.replace(g, uuid=gpu_uuid(g.index)) for g in topology.gpus)
    )


@pytest.fixture
def apiserver(dgx1: Topology) -> Iterator[FakeApiServer]:
    published = to_json(dgx1, mode=MODE)  # what ClusterAgent publishes with Settings.roce_classes
    with FakeApiServer() as server:
        for name, free in FREE.items():
            annotations = desired_annotations(None, published, free)
            # with the device plugin on, the node advertises class resources, not nvidia.com/gpu
            allocatable = {f"{PREFIX}/gpu-roce1": "4", f"{PREFIX}/gpu-roce2": "4", f"{PREFIX}/gpu-all": "8"}
            server.create(make_node(name, annotations=annotations, gpus=0, extra_allocatable=allocatable))
        yield server


def worker(index: int) -> dict[str, Any]:
    pod = make_pod(
        f"llama-worker-{index}",
        namespace="ml",
        gpus=GPUS,
        labels={"training.kubeflow.org/job-name": "llama", "training.kubeflow.org/replica-type": "worker"},
    )
    pod["metadata"]["ownerReferences"] = [OWNER]
    pod["metadata"]["uid"] = f"uid-llama-worker-{index}"
    return pod


def admit(apiserver: FakeApiServer, pod: dict[str, Any]) -> dict[str, Any]:
    """A fresh webhook replica (its own API client, no shared memory) admits ``pod``."""
    settings = GpuClassSettings(enabled=True, prefix=PREFIX)
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


def schedule(apiserver: FakeApiServer, pod: dict[str, Any]) -> tuple[str, list[str]]:
    """kube-scheduler's extender calls: filter, then prioritize the survivors; the best node."""
    nodes = apiserver.list("nodes")
    extender = extender_app(ExtenderSettings(roce_resource_prefix=f"{PREFIX}/gpu-roce"))
    headers = {"Content-Type": "application/json"}
    with serving(extender) as url, httpx.Client(base_url=url, timeout=30) as http:
        filtered = http.post("/filter", content=args_body(pod, nodes, node_cache_capable=False), headers=headers)
        result = filtered.json()
        assert result["Error"] == ""
        passed = [n for n in result["Nodes"]["items"]]
        scores = http.post("/prioritize", content=args_body(pod, passed, node_cache_capable=False), headers=headers)
    ranked = sorted(scores.json(), key=lambda hp: (-hp["Score"], hp["Host"]))
    assert sorted(hp["Host"] for hp in ranked) == sorted(n["metadata"]["name"] for n in passed)
    return ranked[0]["Host"], [n["metadata"]["name"] for n in passed]


async def kubelet_runs(base: Path, topology: Topology, resource: str, count: int) -> dict[str, Any]:
    """The node's agent serves the plugin; its kubelet lists, prefers and allocates ``count``."""
    (base / "dp").mkdir(parents=True)
    build_vfs(base / "host", 4)  # the DGX-1's mlx5_0..3, two VFs each
    settings = AgentSettings.from_env(
        {
            "DSAGENT_ROOT": str(base / "root"),
            "DSAGENT_DEVICE_PLUGIN": "true",
            "DSAGENT_RESOURCE_PREFIX": PREFIX,
            "DSAGENT_ROCE_CLASSES": MODE,
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


def test_a_two_worker_job_goes_through_webhook_extender_and_device_plugin(
    apiserver: FakeApiServer, dgx1: Topology, short_dir: Path
) -> None:
    published = {c["name"]: c for c in json.loads(to_json(dgx1, mode=MODE))["classes"]}
    assert {name: c["gpus"] for name, c in published.items()} == {"gpu-roce1": [0, 1, 2, 3], "gpu-roce2": [4, 5, 6, 7]}
    by_uuid = {g.uuid: g.index for g in dgx1.gpus}
    free = {name: list(gpus) for name, gpus in FREE.items()}
    placed: dict[str, dict[str, Any]] = {}

    for index in range(2):
        # (a) the webhook: nvidia.com/gpu: 4 -> the job's class resource
        pod = admit(apiserver, worker(index))
        resources = pod["spec"]["containers"][0]["resources"]
        [(resource, quantity)] = resources["limits"].items()
        assert resources["requests"] == resources["limits"] and quantity == str(GPUS)
        gpu_class = pod["metadata"]["annotations"]["dsagent.io/gpu-class"]
        assert resource == f"{PREFIX}/{gpu_class}"

        # (b) the extender: filter + prioritize
        name, passed = schedule(apiserver, pod)
        free_in_class = [g for g in free[name] if g in published[gpu_class]["gpus"]]
        assert len(free_in_class) >= GPUS

        # (c) the device plugin on the chosen node, under its kubelet
        got = asyncio.run(asyncio.wait_for(kubelet_runs(short_dir / name, dgx1, resource, GPUS), 60))
        assert resource in got["registered"]  # the plugin advertises what the webhook wrote
        best = best_gpu_set(dgx1, free_in_class, GPUS)
        assert best is not None
        assert sorted(by_uuid[u] for u in got["preferred"]) == sorted(best.gpus)
        placed[f"worker-{index}"] = {"pod": pod, "node": name, "passed": passed, "class": gpu_class, **got}

        # the node's agent republishes: those GPUs are no longer free
        free[name] = [g for g in free[name] if g not in best.gpus]
        apiserver.patch("nodes", name, {"metadata": {"annotations": desired_annotations(None, None, free[name])}})

    w0, w1 = placed["worker-0"], placed["worker-1"]
    # both workers on one class, the vote's, kept in the job's Lease
    assert w0["class"] == w1["class"] == "gpu-roce2"
    lease = apiserver.get("leases", lease_name("ml/llama"), "ml")
    assert lease is not None and lease["spec"]["holderIdentity"] == "gpu-roce2"
    # the extender held them to nodes with 4 free GPUs of that class; worker-1 no longer fits n1
    assert w0["passed"] == ["n1", "n2", "n3"] and w0["node"] == "n1"
    assert w1["passed"] == ["n2", "n3"] and w1["node"] == "n2"

    nics = published["gpu-roce2"]["nics"]
    assert nics == ["mlx5_2", "mlx5_3"]
    for placement in (w0, w1):
        answer, node = placement["answer"], placement["node"]
        # the best_gpu_set GPUs, as UUIDs for the NVIDIA container runtime
        visible = answer.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert sorted(visible) == sorted(placement["preferred"])
        assert sorted(by_uuid[u] for u in visible) == [4, 5, 6, 7]
        # one VF for the container, of a NIC near the GPUs (4, 5 under mlx5_2; 6, 7 under
        # mlx5_3): the class's first, so both workers use the same rail; its /dev/infiniband node
        vfs = {vf.device_nodes[0]: vf for pf in discover_vfs(short_dir / node / "host").values() for vf in pf.vfs}
        uverbs = [d.host_path for d in answer.devices if "uverbs" in d.host_path]
        assert len(uverbs) == 1 and [d.container_path for d in answer.devices] == [d.host_path for d in answer.devices]
        given = [vfs[u] for u in uverbs]
        assert [vf.pf for vf in given] == nics[:1]
        # NCCL told to use it, in the environment and in the mounted nccl.conf
        hca = "=" + str(given[0].rdma_device)
        assert answer.envs["NCCL_IB_HCA"] == hca and "NCCL_CROSS_NIC" not in answer.envs
        [mount] = answer.mounts
        assert mount.container_path == "/etc/nccl.conf" and mount.read_only
        conf = Path(mount.host_path).read_text(encoding="utf-8").splitlines()
        assert f"NCCL_IB_HCA={hca}" in conf
        ifnames = "=" + ",".join(str(vf.netdev) for vf in given)
        assert f"NCCL_IB_GID_INDEX={given[0].gid_index}" in conf and f"NCCL_SOCKET_IFNAME={ifnames}" in conf
