"""A ``DSAGENT_*`` variable nothing reads stops ``dsagent serve``, the webhook and
the controller at start-up with one line naming its close matches, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from dsagent.cache.settings import Settings
from dsagent.cli import platform_settings
from dsagent.controller import controllersettings, process
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.envsettings import AgentLogSettings
from dsagent.errors import SettingsError
from dsagent.kube.envnames import POD_AND_DSCTL_NAMES, known_names, refuse_unknown
from dsagent.nodeagent import nodeparts
from dsagent.nodeagent.clustersettings import ClusterSettings
from dsagent.webhook import server
from dsagent.webhook.gpurequest import GpuClassSettings

REPO = Path(__file__).resolve().parents[3]


class Recording(Mapping[str, str]):
    """An environment (``values``) that remembers every name it was asked for."""

    def __init__(self, **values: str) -> None:
        self.values = values
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return self.values[key]

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(key)
        return self.values.get(key, default)

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return key in self.values

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def test_each_process_declares_its_own_settings_classes() -> None:
    assert nodeparts.SETTINGS == (Settings, ClusterSettings)
    assert controllersettings.SETTINGS == (ControllerSettings, AgentLogSettings)
    assert server.SETTINGS == (server.WebhookSettings, GpuClassSettings, AgentLogSettings)
    agent, controller, webhook = (
        known_names(s) for s in (nodeparts.SETTINGS, controllersettings.SETTINGS, server.SETTINGS)
    )
    assert {"DSAGENT_PUBLISH_INTERVAL", "DSAGENT_CAPACITY"} <= agent and "DSAGENT_CONTROLLER_RESYNC" not in agent
    assert "DSAGENT_CONTROLLER_RESYNC" in controller and "DSAGENT_WEBHOOK_LISTEN" not in controller
    assert "DSAGENT_WEBHOOK_LISTEN" in webhook and "DSAGENT_CAPACITY" not in webhook
    assert POD_AND_DSCTL_NAMES <= agent & controller & webhook
    assert known_names(platform_settings()) == agent | controller | webhook


def test_the_readers_read_only_declared_names() -> None:
    env = Recording(DSAGENT_CONTROLLER_PREPARE="on")
    ControllerSettings.from_env(env)
    controller = known_names(controllersettings.SETTINGS)
    assert env.asked <= controller, sorted(env.asked - controller)
    env = Recording()
    with pytest.raises(SettingsError, match="INJECTION_FILE is not set"):
        server.WebhookSettings.from_env(env)
    webhook = known_names(server.SETTINGS)
    assert env.asked <= webhook, sorted(env.asked - webhook)


def test_an_unknown_name_is_refused_with_its_close_match_and_known_ones_pass() -> None:
    with pytest.raises(SettingsError) as caught:
        refuse_unknown(nodeparts.SETTINGS, {"DSAGENT_CAPACTIY": "100Gi", "DSAGENT_ROOT": "/x"})
    assert str(caught.value).startswith("unknown setting DSAGENT_CAPACTIY; did you mean DSAGENT_CAPACITY?")
    assert caught.value.exit_code == 2
    refuse_unknown(
        nodeparts.SETTINGS,
        {
            "DSAGENT_ROOT": "/x",
            "DSAGENT_STORAGE_CONNECT_TIMEOUT": "10s",
            "DSAGENT_STORAGE_OPTIONS_IMAGENET": "{}",
            "DSAGENT_TASK_ID": "t",
            "DSAGENT_COPIES_CONFIGMAP": "ns/name",
            "OTHER": "x",
        },
    )
    refuse_unknown(controllersettings.SETTINGS, {"DSAGENT_CONTROLLER_RESYNC": "30s", "DSAGENT_LOG_LEVEL": "info"})
    refuse_unknown(server.SETTINGS, {"DSAGENT_WEBHOOK_LISTEN": "0.0.0.0:8443", "DSAGENT_ACCESS_LOG": "off"})


def test_a_process_refuses_another_process_s_variable() -> None:
    with pytest.raises(SettingsError, match="unknown setting DSAGENT_CAPACITY"):
        refuse_unknown(server.SETTINGS, {"DSAGENT_CAPACITY": "100Gi"})
    with pytest.raises(SettingsError, match="unknown setting DSAGENT_WEBHOOK_LISTEN"):
        refuse_unknown(controllersettings.SETTINGS, {"DSAGENT_WEBHOOK_LISTEN": "0.0.0.0:8443"})


@pytest.mark.slow
def test_dsagent_serve_refuses_an_unknown_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAGENT_")}
    env.update(DSAGENT_ROOT=str(tmp_path / "cache"), DSAGENT_MAX_FETCHS="2", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "dsagent", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "unknown setting DSAGENT_MAX_FETCHS; did you mean DSAGENT_MAX_FETCHES?" in lines[0]
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("main", "typo", "meant"),
    [
        (server.main, "DSAGENT_WEBHOOK_LISTN", "DSAGENT_WEBHOOK_LISTEN"),
        (process.main, "DSAGENT_CONTROLLER_MIGRAT", "DSAGENT_CONTROLLER_MIGRATE"),
    ],
    ids=["webhook", "controller"],
)
def test_the_webhook_and_the_controller_refuse_an_unknown_variable(
    main: object, typo: str, meant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DSAGENT_PROTOCOLS", raising=False)  # the suite's agents' settings, not this process's
    monkeypatch.delenv("DSAGENT_EGRESS_ALLOW", raising=False)
    monkeypatch.setenv(typo, "0.0.0.0:1")
    with pytest.raises(SystemExit) as caught:
        main()  # type: ignore[operator]
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"unknown setting {typo}; did you mean {meant}" in err
