"""``dsagent serve --kubernetes``: the cluster agent is imported lazily, started with the
app and stopped with it, and the service is built with its hooks (constructor injection);
without ``dsagent.nodeagent`` the agent says so in one line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dsagent.api import create_app
from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.servicehooks import ServiceHooks
from dsagent.cache.settings import Settings
from dsagent.errors import NotFound
from dsagent.nodeagent.clustersettings import ClusterSettings
from dsagent.nodeagent.nodeparts import KubernetesUnavailable, load_cluster_agent, node_parts

pytestmark = pytest.mark.slow


class RecordingHooks:
    def __init__(self, settings: Settings, cluster: Any) -> None:
        self.cluster = cluster

    async def admit(self, task_id: str) -> None:
        RecordingClusterAgent.events.append(f"admit {task_id}")
        raise NotFound(f"no pod {task_id} on this node")

    def for_service(self) -> ServiceHooks:
        return ServiceHooks(admit_task=self.admit)


class RecordingClusterAgent:
    events: list[str] = []

    def __init__(
        self, service: CacheService, settings: Settings, *, cluster: Any, free_gpus: Any, hooks: RecordingHooks
    ) -> None:
        self.service, self.hooks = service, hooks
        assert cluster is hooks.cluster  # one reading of the cluster settings for both
        RecordingClusterAgent.events.append(f"init {settings.node_name}")

    async def start(self) -> None:
        assert self.service.started  # the service is up before the cluster side starts
        assert self.service.hooks == self.hooks.for_service()  # built with the agent's hooks
        RecordingClusterAgent.events.append("start")

    async def stop(self) -> None:
        RecordingClusterAgent.events.append("stop")


def test_the_cluster_agent_starts_and_stops_with_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("dsagent.nodeagent.clusteragent")
    module.ClusterAgent = RecordingClusterAgent  # type: ignore[attr-defined]
    module.ClusterSettings = ClusterSettings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dsagent.nodeagent.clusteragent", module)
    hooks = types.ModuleType("dsagent.nodeagent.clusterhooks")
    hooks.ClusterHooks = RecordingHooks  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dsagent.nodeagent.clusterhooks", hooks)
    RecordingClusterAgent.events = []
    settings = Settings(root=tmp_path, kubernetes=True, node_name="gpu-node-7", sweep_interval=3600)
    parts = node_parts(settings)
    app = create_app(settings, hooks=parts.hooks, companions=parts.companions)

    async def run() -> None:
        async with app.router.lifespan_context(app):
            assert RecordingClusterAgent.events == ["init gpu-node-7", "start"]
            with pytest.raises(NotFound, match="no pod op-job"):  # the service asks the cluster's hook
                await app.state.service.submit_task("op-job", [DatasetRequest("tiny", "s3://bucket/tiny")])
            assert RecordingClusterAgent.events[-1] == "admit op-job"

    asyncio.run(run())
    assert RecordingClusterAgent.events[-1] == "stop"


def test_without_the_kubernetes_integration_cluster_mode_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A build without the cluster agent, simulated: a None entry in sys.modules makes the
    # import fail and find_spec report the package missing.
    monkeypatch.setitem(sys.modules, "dsagent.nodeagent.clusteragent", None)
    with pytest.raises(KubernetesUnavailable):
        load_cluster_agent(Settings(root=tmp_path))
    without_kube = (
        "import sys; sys.modules['dsagent.nodeagent.clusteragent'] = None; "
        "from dsagent.cli.agent import main; main(sys.argv[1:])"
    )
    result = subprocess.run(
        [sys.executable, "-c", without_kube, "serve", "--root", str(tmp_path / "r"), "--kubernetes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert "--kubernetes" in result.stderr and "dsagent.nodeagent.clusteragent" in result.stderr


def test_bad_settings_stop_the_agent_at_start_up_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dsagent", "serve", "--root", str(tmp_path), "--capacity", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("dsagent: error: --capacity='lots': invalid size 'lots'")


def test_a_cluster_agent_refuses_a_service_built_without_its_hooks(tmp_path: Path) -> None:
    """The task guard is the service's constructor argument: an agent on a service built
    without it would leave pod task ids unchecked, so it does not start."""
    from dsagent.errors import InvalidInput
    from dsagent.nodeagent.clusteragent import ClusterAgent
    from dsagent.nodeagent.clusterhooks import ClusterHooks

    settings = Settings(root=tmp_path, node_name="gpu-node-7", kubernetes=True, sweep_interval=3600)
    cluster = ClusterSettings()
    agent = ClusterAgent(CacheService(settings), settings, api_client=object(), topology=None, cluster=cluster)
    with pytest.raises(InvalidInput, match="without the cluster agent's hooks"):
        asyncio.run(agent.start())
    hooks = ClusterHooks(settings, cluster)
    wired = CacheService(settings, hooks=hooks.for_service())
    assert ClusterAgent(wired, settings, cluster=cluster, hooks=hooks).service.hooks == hooks.for_service()


def test_cluster_peers_are_listed_only_with_a_token_and_a_port(tmp_path: Path) -> None:
    from dsagent.nodeagent.clusterhooks import ClusterHooks

    cluster = ClusterSettings()
    plain = Settings(root=tmp_path, node_name="n", kubernetes=True, listen=("0.0.0.0", 7420))
    assert CacheService(plain, hooks=ClusterHooks(plain, cluster).for_service()).peers.cluster_holders is None
    token = "0123456789abcdef"
    peers = Settings(root=tmp_path, node_name="n", kubernetes=True, listen=("0.0.0.0", 7420), peer_token=token)
    hooks = ClusterHooks(peers, cluster)
    service = CacheService(peers, hooks=hooks.for_service())
    assert service.peers.cluster_holders == hooks.peer_holders and hooks.peer_port == 7420
    assert service.peers.enabled
    # not connected yet (the agent has not started): no cluster peer, the store it is
    assert asyncio.run(hooks.peer_holders("imgs", "a" * 32)) == []


@pytest.mark.slow
def test_cluster_mode_outside_a_cluster_is_one_line_and_the_configuration_exit_code(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config either
    result = subprocess.run(
        [sys.executable, "-m", "dsagent", "serve", "--root", str(tmp_path / "r"), "--kubernetes"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, result.stderr  # a configuration error, not "worth retrying" (7)
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line, no traceback
    assert "no Kubernetes configuration" in result.stderr and "KUBECONFIG" in result.stderr
    assert not (tmp_path / "r").exists()  # nothing bound or made
