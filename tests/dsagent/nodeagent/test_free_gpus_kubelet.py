"""The agent publishes true free GPUs from the kubelet's pod-resources API, even while pods use GPUs."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dsagent.nodeplugins.deviceplugin.podresources import PodResourcesClient
from gpu_topology.dumps import load_dump
from tests.dsagent.nodeagent.test_cluster_agent import NODE, cluster_agent, node_annotations, until
from tests.fake_kubelet import FakePodResources
from tools.support.fake_apiserver import FakeApiServer, make_node, make_pod


def test_free_gpus_come_from_pod_resources_and_fall_back_when_it_is_gone(
    apiserver: FakeApiServer, tmp_path: Path, fixtures_dir: Path
) -> None:
    apiserver.create(make_node(NODE))
    topology = load_dump(fixtures_dir / "topology" / "dgx1-v100-4ib-nvidia-smi-topo-m.txt")
    topology = dataclasses.replace(
        topology, gpus=tuple(dataclasses.replace(g, uuid=f"GPU-{g.index}") for g in topology.gpus)
    )
    sockets = Path(tempfile.mkdtemp(prefix="k11-", dir="/tmp"))
    client = PodResourcesClient(sockets / "pr.sock", timeout=2)

    async def scenario() -> None:
        fake = FakePodResources(sockets / "pr.sock")
        await fake.start()
        fake.allocatable = {"nvidia.com/gpu": [f"GPU-{i}" for i in range(8)]}
        fake.pods = [("default", "trainer", [("nvidia.com/gpu", ["GPU-0", "GPU-3", "GPU-5", "GPU-6"])])]
        async with cluster_agent(apiserver, tmp_path, topology=topology) as agent:
            agent._free_gpu_source = client.free_gpus
            apiserver.create(make_pod("trainer", node_name=NODE, gpus=4, phase="Running"))
            await until(lambda: node_annotations(apiserver).get("dsagent.io/free-gpus") == "1,2,4,7", what="free GPUs")
            fake.pods = []
            await until(
                lambda: node_annotations(apiserver).get("dsagent.io/free-gpus") == "0,1,2,3,4,5,6,7", what="all free"
            )
            fake.pods = [("default", "trainer", [("nvidia.com/gpu", ["GPU-0"])])]
            await fake.stop()  # the kubelet is gone: back to the estimate, a GPU pod runs -> withdrawn
            await until(lambda: "dsagent.io/free-gpus" not in node_annotations(apiserver), what="withdrawal")

    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def test_the_estimate_counts_class_resources_of_the_configured_prefix_as_gpu_requests() -> None:
    from dsagent.nodeagent.publisher import gpu_request
    from dsplatform.gpus import GpuResources

    pod = make_pod("w", gpus=0)
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"example.com/gpu-roce2": "4", "cpu": "8"},
        "requests": {"example.com/gpu-all": "8", "memory": "1Gi"},
    }
    pod["spec"]["containers"].append({"name": "side", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    example = GpuResources(prefix="example.com")
    assert gpu_request(pod, example) == 13
    # another prefix's resources are not this node's GPUs (the regex once took any prefix)
    assert gpu_request(pod) == 1
    pod["spec"]["containers"][1]["resources"] = {"limits": {"example.com/gpu-roce2x": "1"}}
    assert gpu_request(pod, example) == 12
    # a quantity the API server would never pass counts no GPUs, as in the extender
    pod["spec"]["containers"][1]["resources"] = {"limits": {"nvidia.com/gpu": "lots"}}
    assert gpu_request(pod, example) == 0


def test_the_device_plugin_serves_only_labelled_nodes(
    apiserver: FakeApiServer, tmp_path: Path, monkeypatch: Any
) -> None:
    from dsagent.cache.settings import Settings
    from dsagent.kube import apiclient
    from dsagent.nodeagent.nodeparts import device_plugin_wanted

    monkeypatch.setattr(apiclient, "load", lambda kubeconfig=None: apiserver.api_client())
    apiserver.create(make_node("plain"))
    apiserver.create(make_node("ours", labels={"dsagent.io/device-plugin": "true"}))
    apiserver.create(make_node("off", labels={"dsagent.io/device-plugin": "false"}))

    def wanted(node: str, label: str = "dsagent.io/device-plugin") -> bool:
        settings = Settings(
            root=tmp_path, node_name=node, kubernetes=True, device_plugin=True, device_plugin_node_label=label
        )
        return bool(asyncio.run(device_plugin_wanted(settings)))

    assert [wanted(n) for n in ("plain", "ours", "off")] == [False, True, False]
    assert wanted("plain", label="")  # no label configured: every node
