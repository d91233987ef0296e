"""The hand-over from NVIDIA's device plugin: real unix sockets in a device-plugins directory,
the fake kubelet, and the fake API server for what the agent says on its Node."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.settings import Settings
from dsagent.nodeagent import handover
from dsagent.nodeagent.handover import live_foreign_plugins, wait_until_gone
from dsagent.nodeagent.hardware import NVIDIA_PLUGIN_LABEL, PLUGIN_LABEL
from dsagent.nodeagent.nodeparts import start_when_handed_over
from gpu_topology import Topology
from tests.fake_kubelet import FakeKubelet
from tests.sysfs_vf import build_dgx_a100_vfs


def listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    return server


def test_only_nvidia_sockets_that_answer_count(short_dir: Path) -> None:
    live = listening(short_dir / "nvidia-gpu.sock")
    ours = listening(short_dir / "dsagent-gpu.sock")
    stale = listening(short_dir / "nvidia-mig-1g.10gb.sock")
    stale.close()  # a killed plugin's socket: the file stays, a connection is refused
    (short_dir / "nvidia-notes.sock").write_text("not a socket")
    try:
        assert (short_dir / "nvidia-mig-1g.10gb.sock").exists()
        assert live_foreign_plugins(short_dir) == ["nvidia-gpu.sock"]
        live.close()
        assert live_foreign_plugins(short_dir) == []
        assert live_foreign_plugins(short_dir / "missing") == []
    finally:
        live.close()
        ours.close()


def test_the_wait_takes_the_callers_probe_as_its_first_answer(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the agent probed NVIDIA's sockets to decide whether to wait: the wait starts with that
    # answer and probes again only after its first poll, not at once
    probes: list[float] = []
    monkeypatch.setattr(handover, "live_foreign_plugins", lambda d: probes.append(time.monotonic()) or [])
    started = time.monotonic()
    assert asyncio.run(wait_until_gone(short_dir, 10, poll=0.2, seen=["nvidia-gpu.sock"])) == []
    assert len(probes) == 1 and probes[0] - started >= 0.2
    assert asyncio.run(wait_until_gone(short_dir, 10, poll=0.2, seen=[])) == [] and len(probes) == 1
    assert asyncio.run(wait_until_gone(short_dir, 10, poll=0.2)) == [] and len(probes) == 2


def test_the_wait_ends_when_the_plugin_leaves_or_at_its_bound(short_dir: Path) -> None:
    server = listening(short_dir / "nvidia-gpu.sock")

    async def scenario() -> None:
        asyncio.get_running_loop().call_later(0.3, server.close)
        assert await wait_until_gone(short_dir, 10, poll=0.05) == []
        stays = listening(short_dir / "nvidia-gpu-2.sock")
        try:
            assert await wait_until_gone(short_dir, 0.2, poll=0.05) == ["nvidia-gpu-2.sock"]
        finally:
            stays.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        server.close()


def _settings(tmp_path: Path, plugin_dir: Path, **extra: Any) -> Settings:
    return Settings(
        root=tmp_path / "root",
        device_plugin_dir=plugin_dir,
        pod_resources_socket=plugin_dir / "none.sock",
        device_plugin_gpu_resource="nvidia.com/gpu",
        **extra,
    )


def test_the_plugin_registers_once_nvidias_has_left(short_dir: Path, tmp_path: Path, dgx_a100: Topology) -> None:
    build_dgx_a100_vfs(tmp_path / "sys-root")
    (short_dir / "dp").mkdir()
    nvidia = listening(short_dir / "dp" / "nvidia-gpu.sock")
    settings = _settings(tmp_path, short_dir / "dp", device_plugin="on", sysfs_root=tmp_path / "sys-root")

    async def scenario() -> None:
        kubelet = FakeKubelet(short_dir / "dp")
        await kubelet.start()
        task = asyncio.create_task(start_when_handed_over(settings, dgx_a100))
        await asyncio.sleep(0.5)
        assert not task.done() and kubelet.registrations == []  # nothing registered beside NVIDIA's
        nvidia.close()
        plugin = await asyncio.wait_for(task, 10)
        try:
            names = [r.resource_name for r in kubelet.registrations]
            assert names[-1] == "nvidia.com/gpu" and "dsagent.io/gpu-roce1" in names
        finally:
            await plugin.stop()
            await kubelet.stop()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        nvidia.close()


def test_a_plugin_that_stays_keeps_ours_off_and_the_node_says_why(
    apiserver: Any, short_dir: Path, tmp_path: Path, dgx_a100: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools.support.fake_apiserver import make_node

    monkeypatch.setenv("KUBECONFIG", str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    node = make_node("gpu-1")
    # what the agent's auto decision wrote before it waited
    node["metadata"]["labels"] = {PLUGIN_LABEL: "true", NVIDIA_PLUGIN_LABEL: "false"}
    apiserver.create(node)
    (short_dir / "dp").mkdir()
    nvidia = listening(short_dir / "dp" / "nvidia-gpu.sock")
    settings = _settings(
        tmp_path, short_dir / "dp", device_plugin="auto", device_plugin_handover=0.3, kubernetes=True, node_name="gpu-1"
    )
    try:
        assert asyncio.run(asyncio.wait_for(start_when_handed_over(settings, dgx_a100), 30)) is None
    finally:
        nvidia.close()
    written = apiserver.get("nodes", "gpu-1")
    assert written is not None
    labels = written["metadata"]["labels"]
    assert labels[PLUGIN_LABEL] == "false" and NVIDIA_PLUGIN_LABEL not in labels  # NVIDIA's label given back
    condition = next(c for c in written["status"]["conditions"] if c["type"] == "DsplatformRoceClasses")
    assert (condition["status"], condition["reason"]) == ("False", "NvidiaPluginStays")
    assert "nvidia-gpu.sock" in condition["message"]
    assert [e["reason"] for e in apiserver.list("events")] == ["DevicePluginOff"]


def test_auto_takes_no_node_whose_kubelet_socket_is_elsewhere(
    short_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubelet whose root is not the chart's (csi.kubeletDir): no kubelet.sock where the agent
    looks, so the agent leaves the node to NVIDIA's plugin rather than take it and be unheard."""
    import os

    from dsagent.nodeagent.nodeparts import decide_device_plugin
    from tests.fake_nvidia_smi import fake_nvidia_smi

    (tmp_path / "bin").mkdir()
    fake_nvidia_smi(
        tmp_path / "bin", "gpu-1", "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt"
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    (short_dir / "dp").mkdir()
    settings = _settings(tmp_path, short_dir / "dp", device_plugin="auto", sysfs_root=tmp_path / "no-sys")
    on, topology = asyncio.run(decide_device_plugin(settings))
    assert not on and topology is not None and len(topology.gpus) == 8
    kubelet = listening(short_dir / "dp" / "kubelet.sock")  # the kubelet's socket where the agent looks
    try:
        assert asyncio.run(decide_device_plugin(settings))[0]
    finally:
        kubelet.close()
