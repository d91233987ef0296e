"""``dsagent serve --kubernetes``: the cluster agent is imported lazily, started with the
app and stopped with it; without ``dsagent.cluster`` the agent says so in one line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dsagent.api import create_app
from dsagent.cache.service import CacheService
from dsagent.cache.settings import Settings
from dsagent.cli.agent import KubernetesUnavailable, companions, load_cluster_agent


class RecordingClusterAgent:
    events: list[str] = []

    def __init__(self, service: CacheService, settings: Settings, *, free_gpus: Any = None) -> None:
        self.service = service
        RecordingClusterAgent.events.append(f"init {settings.node_name}")

    async def start(self) -> None:
        assert self.service.started  # the service is up before the cluster side starts
        RecordingClusterAgent.events.append("start")

    async def stop(self) -> None:
        RecordingClusterAgent.events.append("stop")


def test_the_cluster_agent_starts_and_stops_with_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("dsagent.cluster.nodeagent")
    module.ClusterAgent = RecordingClusterAgent  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dsagent.cluster.nodeagent", module)
    RecordingClusterAgent.events = []
    settings = Settings(root=tmp_path, kubernetes=True, node_name="gpu-node-7", sweep_interval=3600)
    app = create_app(settings, companions=companions(settings))

    async def run() -> None:
        async with app.router.lifespan_context(app):
            assert RecordingClusterAgent.events == ["init gpu-node-7", "start"]

    asyncio.run(run())
    assert RecordingClusterAgent.events == ["init gpu-node-7", "start", "stop"]


def test_without_the_kubernetes_integration_cluster_mode_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A build without dsagent.cluster, simulated: a None entry in sys.modules makes the
    # import fail and find_spec report the package missing.
    monkeypatch.setitem(sys.modules, "dsagent.cluster", None)
    monkeypatch.setitem(sys.modules, "dsagent.cluster.nodeagent", None)
    with pytest.raises(KubernetesUnavailable):
        load_cluster_agent(Settings(root=tmp_path))
    without_kube = (
        "import sys; sys.modules['dsagent.cluster'] = None; sys.modules['dsagent.cluster.nodeagent'] = None; "
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
    assert "--kubernetes" in result.stderr and "dsagent.cluster" in result.stderr


def test_bad_settings_stop_the_agent_at_start_up_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dsagent", "serve", "--root", str(tmp_path), "--capacity", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("dsagent: error: --capacity='lots': invalid size 'lots'")
