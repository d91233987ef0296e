"""``dsagent serve --kubernetes`` as a real process against the fake API server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsagent.api.client import AgentClient
from dsagent.errors import AgentUnreachable, NotFound
from dsagent.nodeagent.serve import STOP_DEADLINE
from tools.support.fake_apiserver import FakeApiServer, make_node, make_pod
from tools.support.harness import eventually, unix_socket_listening

pytestmark = pytest.mark.slow

NODE = "gpu-7"


@pytest.fixture
def cluster_agent(apiserver: FakeApiServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield from running_agent(apiserver, tmp_path, {})


def running_agent(apiserver: FakeApiServer, tmp_path: Path, extra: dict[str, str]) -> Iterator[dict[str, Any]]:
    """``dsagent serve --kubernetes`` against ``apiserver``, healthy, with ``extra`` variables."""
    apiserver.create(make_node(NODE, annotations={"keep": "me"}))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    source = tmp_path / "coco"
    source.mkdir()
    for i in range(5):
        (source / f"{i}.jpg").write_bytes(os.urandom(1000))
    sockets = Path(tempfile.mkdtemp(prefix="dsk-", dir="/tmp"))
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "DSAGENT_KUBERNETES": "1",
        # no disk floor: the test machine's own disk fullness must not decide the test
        # (the floor is tested in tests/dsagent/cache/test_disk_floor.py)
        "DSAGENT_RESERVE": "0",
        "DSAGENT_NODEFS_AVAILABLE": "0",
        "DSAGENT_NODE_NAME": NODE,
        "DSAGENT_PUBLISH_INTERVAL": "100ms",
        "DSAGENT_ROOT": str(tmp_path / "cache"),
        "DSAGENT_SOCKET": str(sockets / "dsagent.sock"),
        "DSAGENT_LOCAL_SOURCES": str(source),
        **{k: v.replace("SOCKETS", str(sockets)) for k, v in extra.items()},
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = open(tmp_path / "agent.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "dsagent", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    client = AgentClient(socket_path=sockets / "dsagent.sock", timeout=30)

    def healthy() -> bool:
        assert process.poll() is None, (tmp_path / "agent.log").read_text()
        if not unix_socket_listening(sockets / "dsagent.sock"):  # httpcore leaks a refused socket
            return False
        try:
            return bool(client.health())
        except AgentUnreachable:
            return False

    try:
        eventually(healthy, what="the agent")
        yield {
            "process": process,
            "client": client,
            "source": str(source),
            "env": env,
            "log": tmp_path / "agent.log",
            "sockets": sockets,
        }
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()
        shutil.rmtree(sockets, ignore_errors=True)


def published(apiserver: FakeApiServer) -> dict[str, str]:
    """The status of the agent's NodeCache ({} before it wrote one)."""
    cache = apiserver.get("nodecaches", NODE)
    return dict((cache or {}).get("status") or {})


def task(client: AgentClient, uid: str) -> dict[str, Any] | None:
    try:
        return client.get_task(uid)
    except NotFound:
        return None


def test_the_daemonset_agent_end_to_end(apiserver: FakeApiServer, cluster_agent: dict[str, Any]) -> None:
    client: AgentClient = cluster_agent["client"]
    eventually(lambda: "inventory" in published(apiserver), what="the inventory in its NodeCache")
    assert json.loads(published(apiserver)["inventory"])["node"] == NODE

    datasets = json.dumps([{"name": "coco", "source": cluster_agent["source"]}])
    pod = apiserver.create(make_pod("train", node_name=NODE, annotations={"dsagent.io/datasets": datasets}))
    uid = pod["metadata"]["uid"]
    eventually(lambda: (task(client, uid) or {}).get("state") == "ready", what="caching at bind time")
    eventually(lambda: '"coco"' in published(apiserver)["inventory"], what="the dataset published")

    # an init-container of this pod repeats the request: accepted, same task
    env = {**cluster_agent["env"], "DSAGENT_DATASETS": datasets, "DSAGENT_TASK_ID": uid}
    ok = subprocess.run(
        [sys.executable, "-m", "dsagent.cli", "cache", "--from-env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr

    # a task id of a pod that is not on this node is refused
    foreign = {**env, "DSAGENT_TASK_ID": str(uuid.uuid4())}
    refused = subprocess.run(
        [sys.executable, "-m", "dsagent.cli", "cache", "--from-env", "--no-wait"],
        env=foreign,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and f"not a pod on node {NODE}" in refused.stderr

    apiserver.delete("pods", "train")
    eventually(lambda: task(client, uid) is None, what="the release")

    process: subprocess.Popen[bytes] = cluster_agent["process"]
    process.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert process.wait(30) in (0, -signal.SIGTERM)
    node = apiserver.get("nodes", NODE) or {}
    assert node["metadata"].get("annotations") == {"keep": "me"}  # the graceful stop took its annotation away
    assert "inventory" not in published(apiserver)  # and emptied its NodeCache


def test_sigterm_ends_the_agent_with_its_csi_plugin_while_the_api_server_hangs(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """Cluster mode and the CSI node plugin in one process, the
    API server turned into a black hole (connections accepted, never answered: a watch
    and a publish hang on it). SIGTERM must still end the process: the orderly shutdown
    waits on the hung calls, and the watchdog ends it at STOP_DEADLINE (9 s; the
    DaemonSet's grace period is 30 s). Measured: 0.2-0.3 s idle, 9.1 s here. The bound
    below is generous; the test fails only if the process hangs."""
    extra = {"DSAGENT_CSI_SOCKET": "SOCKETS/csi.sock", "DSAGENT_CSI_KUBELET_PODS_DIR": str(tmp_path / "pods")}
    agent = running_agent(apiserver, tmp_path, extra)
    started = next(agent)
    process: subprocess.Popen[bytes] = started["process"]
    hole = socket.socket()
    try:
        eventually(lambda: (started["sockets"] / "csi.sock").exists(), what="the CSI socket")
        port = apiserver.port
        apiserver.stop()
        hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hole.bind(("127.0.0.1", port))
        hole.listen(64)  # never accepted: the agent's next calls connect, then wait for ever
        requests = len(apiserver.requests)
        time.sleep(2)  # let the publish loop and the watch reconnect hang on it (not an assertion)
        process.send_signal(signal.SIGTERM)
        code = process.wait(STOP_DEADLINE + 60)
        assert code in (0, -signal.SIGTERM), started["log"].read_text()[-3000:]
        assert len(apiserver.requests) == requests  # nothing reached a real API server meanwhile
    finally:
        hole.close()
        agent.close()


def _gpu_node(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A DGX A100-class node for ``dsagent serve``: its recorded topology through a fake
    ``nvidia-smi`` on PATH, its VFs' sysfs, and a device-plugins directory (returned)."""
    from tests.fake_nvidia_smi import fake_nvidia_smi
    from tests.sysfs_vf import build_dgx_a100_vfs

    bindir, plugins = tmp_path / "bin", Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    bindir.mkdir()
    fake_nvidia_smi(bindir, NODE, "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt")
    build_dgx_a100_vfs(tmp_path / "host")
    return {
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "DSAGENT_DEVICE_PLUGIN": "auto",
        "DSAGENT_DEVICE_PLUGIN_DIR": str(plugins),
        "DSAGENT_DEVICE_PLUGIN_GPU_RESOURCE": "nvidia.com/gpu",
        "DSAGENT_DEVICE_PLUGIN_HANDOVER": "60s",
        "DSAGENT_POD_RESOURCES_SOCKET": str(plugins / "no-pod-resources.sock"),
        "DSAGENT_SYSFS_ROOT": str(tmp_path / "host"),
    }, plugins


@pytest.mark.parametrize("nvidia_leaves", [True, False])
def test_the_agent_serves_datasets_while_nvidias_plugin_leaves_and_stops_cleanly_either_way(
    apiserver: FakeApiServer, tmp_path: Path, nvidia_leaves: bool
) -> None:
    """Device plugin auto on a DGX A100-class node where NVIDIA's plugin still answers: the
    agent serves at once, its plugin registers only once NVIDIA's socket stops answering,
    and a stop while it still waits is a clean stop."""
    extra, plugins = _gpu_node(tmp_path)
    kubelet = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the kubelet's socket is there
    kubelet.bind(str(plugins / "kubelet.sock"))
    kubelet.listen(4)
    nvidia = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    nvidia.bind(str(plugins / "nvidia-gpu.sock"))
    nvidia.listen(4)
    started = running_agent(apiserver, tmp_path, extra)
    try:
        agent = next(started)
        process, log = agent["process"], agent["log"]
        assert agent["client"].health()  # datasets served while the hand-over waits
        eventually(lambda: "device plugin waiting for NVIDIA's to leave" in log.read_text(), what="the line")
        labels = (apiserver.get("nodes", NODE) or {})["metadata"]["labels"]
        assert labels["dsagent.io/device-plugin"] == "true"
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
        assert not (plugins / "dsagent-gpu.sock").exists()  # nothing beside NVIDIA's
        if nvidia_leaves:
            nvidia.close()  # the GPU Operator took its plugin off the node
            eventually(lambda: (plugins / "dsagent-gpu.sock").exists(), what="the plain resource's socket")
            assert (plugins / "dsagent-gpu-roce1.sock").exists()
        process.send_signal(signal.SIGTERM)
        assert process.wait(STOP_DEADLINE + 10) in (0, -signal.SIGTERM), log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        started.close()
        nvidia.close()
        kubelet.close()
        shutil.rmtree(plugins, ignore_errors=True)
