"""End to end without a cluster: the RoCE-class path as a default install runs it.

The chart is rendered with its defaults; the agents, the webhook and the device plugin read
the settings the chart gives them. Three nodes from recorded topologies: two DGX A100-class
nodes (eight RoCE NICs in four NUMA groups: four classes) and one 8xH100 with no RDMA NIC.
Each agent discovers its node through ``nvidia-smi`` (a script printing the node's recorded
``topo -m``), decides, and says so on its Node in the fake API server. On the DGX nodes
NVIDIA's plugin is still serving when the agent decides (a live ``nvidia-gpu.sock``): the
agent's plugin registers with the fake kubelet only once it has gone, then serves the class
resources and ``nvidia.com/gpu``, after creating the VFs of a NIC whose SR-IOV is on but
which has none yet. The webhook (over HTTP, AdmissionReview v1) leaves a
single GPU pod alone and gives a two-worker job one class set of the served nodes; the
kubelet's Allocate of that set gives each worker GPUs of the set and one VF.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.cache.settings import Settings
from dsagent.nodeagent import publisher
from dsagent.nodeagent.hardware import NVIDIA_PLUGIN_LABEL
from dsagent.nodeagent.nodeparts import decide_device_plugin, start_when_handed_over
from dsagent.nodeplugins.deviceplugin.allocation import node_classes
from dsagent.webhook.gpurequest import GpuClassSettings
from dsagent.webhook.mutation import Injection
from dsagent.webhook.roceclass import GpuClassPolicy, KubeGpuClasses
from dsagent.webhook.server import create_app as webhook_app
from dsplatform import published
from tests.charts.test_chart import agent_pod, find, render
from tests.fake_kubelet import FakeKubelet
from tests.fake_nvidia_smi import fake_nvidia_smi
from tests.scheduler_plugin.server import serving
from tests.sysfs_vf import build_dgx_a100_vfs
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_node, make_pod, pod_review

pytestmark = pytest.mark.slow

DGX = "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt"
NO_NIC = "ml-engineering-8xH100-no-nic-spaces-nvidia-smi-topo-m.txt"
NODES = {"dgx-1": DGX, "dgx-2": DGX, "h100-1": NO_NIC}
NUMVFS = "sys/class/infiniband/mlx5_4/device/sriov_numvfs"


def chart_env(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, str]:
    if kind == "DaemonSet":
        containers = agent_pod(docs)["containers"]
    else:
        containers = find(docs, kind, suffix)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for c in containers for e in c.get("env", []) if isinstance(e.get("value"), str)}


def test_a_default_install_serves_classes_where_the_hardware_carries_them(
    short_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render({})
    agent_env = chart_env(docs, "DaemonSet", "-agent")
    webhook_env = chart_env(docs, "Deployment", "-webhook")
    assert agent_env["DSAGENT_DEVICE_PLUGIN"] == "auto" and webhook_env["DSAGENT_WEBHOOK_GPU_CLASSES"] == "auto"
    assert "--kubernetes" in agent_pod(docs)["containers"][0]["command"]  # cluster mode: DSAGENT_KUBERNETES

    with FakeApiServer() as apiserver:
        monkeypatch.setenv("KUBECONFIG", str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        for name in NODES:
            apiserver.create(make_node(name))

        # -- each agent decides on its node, with the chart's settings
        kubelets: dict[str, FakeKubelet] = {}
        plugins: dict[str, Any] = {}
        nvidia_plugins: dict[str, socket.socket] = {}
        decided: dict[str, bool] = {}
        topologies: dict[str, Any] = {}
        base_path = os.environ.get("PATH", "")

        async def agents() -> None:
            for name, fixture in NODES.items():
                node_dir = short_dir / name
                (node_dir / "bin").mkdir(parents=True)
                (node_dir / "dp").mkdir()
                fake_nvidia_smi(node_dir / "bin", name, fixture)
                build_dgx_a100_vfs(tmp_path / name / "host")
                # SR-IOV on but no VF yet on one NIC: VF creation (auto) makes claim 3's count
                (tmp_path / name / "host" / NUMVFS).write_text("0\n")
                nvidia = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # NVIDIA's plugin, still serving
                nvidia.bind(str(node_dir / "dp" / "nvidia-gpu.sock"))
                nvidia.listen(4)
                nvidia_plugins[name] = nvidia
                env = {
                    k: v
                    for k, v in agent_env.items()
                    if k.startswith("DSAGENT_") and not k.endswith(("_FILE", "_ROOT", "_DIR", "_SOCKET", "LISTEN"))
                }
                settings = Settings.from_env(
                    {
                        **env,
                        "DSAGENT_ROOT": str(tmp_path / name / "cache"),
                        "DSAGENT_NODE_NAME": name,
                        "DSAGENT_KUBERNETES": "true",
                        "DSAGENT_DEVICE_PLUGIN_DIR": str(node_dir / "dp"),
                        "DSAGENT_POD_RESOURCES_SOCKET": str(node_dir / "pr.sock"),
                        "DSAGENT_SYSFS_ROOT": str(tmp_path / name / "host"),
                        "DSAGENT_DEVICE_PLUGIN_HANDOVER": "20s",
                    }
                )
                kubelets[name] = FakeKubelet(node_dir / "dp")  # every node's kubelet runs
                await kubelets[name].start()
                monkeypatch.setenv("PATH", f"{node_dir / 'bin'}{os.pathsep}{base_path}")
                decided[name], topologies[name] = await decide_device_plugin(settings)
                if not decided[name]:
                    continue
                waiting = asyncio.create_task(start_when_handed_over(settings, topologies[name]))
                await asyncio.sleep(0.3)
                assert not waiting.done() and kubelets[name].registrations == []  # NVIDIA's still there
                nvidia.close()  # the GPU Operator took its plugin off the node (the label)
                plugins[name] = await asyncio.wait_for(waiting, 15)

        async def scenario() -> None:
            await asyncio.wait_for(agents(), 60)
            await asyncio.to_thread(check_and_admit)
            await allocate_and_check()

        def check_and_admit() -> None:
            assert decided == {"dgx-1": True, "dgx-2": True, "h100-1": False}
            assert agent_env["DSAGENT_VF_SETUP"] == "auto"
            for name, on in decided.items():  # made where the plugin serves, nowhere else
                assert (tmp_path / name / "host" / NUMVFS).read_text().strip() == ("2" if on else "0")
            for name, on in decided.items():
                labels = apiserver.get("nodes", name)["metadata"]["labels"]  # type: ignore[index]
                assert labels[agent_env["DSAGENT_DEVICE_PLUGIN_NODE_LABEL"]] == ("true" if on else "false")
                assert (labels.get(NVIDIA_PLUGIN_LABEL) == "false") is on  # NVIDIA's stays where ours does not
            assert kubelets["h100-1"].registrations == []  # NVIDIA's plugin's node
            for name in ("dgx-1", "dgx-2"):
                names = [r.resource_name for r in kubelets[name].registrations]
                assert "dsagent.io/gpu-roce1" in names and "dsagent.io/gpu-roce1-2" in names
                assert names[-1] == "nvidia.com/gpu"  # pods no class was given keep the node
            events = {e["regarding"]["name"]: e["reason"] for e in apiserver.list("events")}
            assert events == {"dgx-1": "DevicePluginOn", "dgx-2": "DevicePluginOn", "h100-1": "DevicePluginOff"}

            # -- the agents publish their topology and free GPUs (all free)
            for name in NODES:
                topology = topologies[name]
                text = publisher.topology_json(topology, agent_env.get("DSAGENT_ROCE_CLASSES", "numa"), name)
                annotations = {published.TOPOLOGY: text, **publisher.node_annotations(topology.gpu_indices)}
                apiserver.patch("nodes", name, {"metadata": {"annotations": annotations}})

            # -- the webhook, with the chart's settings
            classes = GpuClassSettings.from_env(
                {k: v for k, v in webhook_env.items() if k.startswith("DSAGENT_WEBHOOK_")}
            )
            client = apiserver.api_client()
            try:
                policy = GpuClassPolicy(classes, KubeGpuClasses(client, classes))
                app = webhook_app(Injection(image="img:1"), lambda ns, name: pytest.fail("no datasets"), policy)
                with serving(app) as url:

                    def admit(pod: dict[str, Any]) -> dict[str, Any]:
                        answer = httpx.post(f"{url}/mutate", json=pod_review(pod, namespace="ml"), timeout=30).json()[
                            "response"
                        ]
                        assert answer["allowed"] is True
                        if "patch" not in answer:
                            return pod
                        return json_patch(copy.deepcopy(pod), json.loads(base64.b64decode(answer["patch"])))

                    single = make_pod("notebook", namespace="ml", gpus=1)
                    assert admit(single) == single  # no job: it keeps nvidia.com/gpu, any node serves it

                    workers = []
                    for index in range(2):
                        pod = make_pod(
                            f"bert-worker-{index}",
                            namespace="ml",
                            gpus=4,
                            labels={"dsagent.io/job": "bert"},
                            annotations={"dsagent.io/workers": "2"},
                        )
                        workers.append(admit(pod))
            finally:
                client.close()
            resources = [w["spec"]["containers"][0]["resources"]["limits"] for w in workers]
            assert resources[0] == resources[1] and len(resources[0]) == 1
            [(resource, count)] = resources[0].items()
            assert resource.startswith("dsagent.io/gpu-roce") and "-" in resource.rsplit("roce", 1)[1]
            assert count == "4"

            admitted.append(resource)

        admitted: list[str] = []

        async def allocate_and_check() -> None:
            # -- the kubelet on a served node allocates the set: GPUs of the set, one VF
            [resource] = admitted
            kubelet = kubelets["dgx-1"]
            offered = [d.ID for d in await kubelet.first_list(resource) if d.health == "Healthy"]
            chosen = await kubelet.preferred(resource, offered, [], 4)
            answer = await kubelet.allocate(resource, chosen)
            assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(sorted(chosen))
            # the GPUs are those of the set's classes (gpu-roce1-2: classes 1 and 2), a share of each
            numbers = [int(n) for n in resource.rsplit("roce", 1)[1].split("-")]
            topology = topologies["dgx-1"]
            by_uuid = {g.uuid: g.index for g in topology.gpus}
            members = {c.resource: set(c.gpus) for c in node_classes(topology)}
            per_class = [len(members[f"dsagent.io/gpu-roce{n}"] & {by_uuid[u] for u in chosen}) for n in numbers]
            assert sum(per_class) == 4 and min(per_class) >= 1
            assert answer.envs["NCCL_IB_HCA"].startswith("=mlx5_") and "," not in answer.envs["NCCL_IB_HCA"]

        async def main() -> None:
            try:
                await scenario()
            finally:
                for plugin in plugins.values():
                    await plugin.stop()
                for kubelet in kubelets.values():
                    await kubelet.stop()
                for nvidia in nvidia_plugins.values():
                    nvidia.close()

        asyncio.run(asyncio.wait_for(main(), 120))
