"""Issue 23: a ``DSAGENT_*`` variable nothing reads stops ``dsagent serve``, the webhook and
the controller at start-up with one line naming its close matches, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from dsagent.cluster.envnames import CLUSTER_NAMES, CONTROLLER_NAMES, WEBHOOK_NAMES, known_names, refuse_unknown
from dsagent.controller import reconcile
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.errors import SettingsError
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


def test_the_written_out_lists_are_the_settings_classes_fields() -> None:
    assert WEBHOOK_NAMES == server.WebhookSettings.env_names() | GpuClassSettings.env_names()
    names = ControllerSettings.env_names()
    assert CONTROLLER_NAMES == {n for n in names if n.startswith("DSAGENT_CONTROLLER_")}
    assert names <= known_names(), sorted(names - known_names())  # the admin token's are the agent's
    assert {"DSAGENT_PUBLISH_INTERVAL", "DSAGENT_COPIES_INTERVAL"} <= CLUSTER_NAMES <= known_names()


def test_the_readers_read_only_declared_names() -> None:
    env = Recording(DSAGENT_CONTROLLER_PREPARE="on")
    ControllerSettings.from_env(env)
    assert env.asked <= known_names(), sorted(env.asked - known_names())
    env = Recording()
    with pytest.raises(SettingsError, match="INJECTION_FILE is not set"):
        server.WebhookSettings.from_env(env)
    assert env.asked <= WEBHOOK_NAMES, sorted(env.asked - WEBHOOK_NAMES)


def test_an_unknown_name_is_refused_with_its_close_match_and_known_ones_pass() -> None:
    with pytest.raises(SettingsError) as caught:
        refuse_unknown({"DSAGENT_CAPACTIY": "100Gi", "DSAGENT_ROOT": "/x"})
    assert str(caught.value).startswith("unknown setting DSAGENT_CAPACTIY; did you mean DSAGENT_CAPACITY?")
    assert caught.value.exit_code == 2
    refuse_unknown(
        {
            "DSAGENT_ROOT": "/x",
            "DSAGENT_STORAGE_CONNECT_TIMEOUT": "10s",
            "DSAGENT_STORAGE_OPTIONS_IMAGENET": "{}",
            "DSAGENT_TASK_ID": "t",
            "DSAGENT_CONTROLLER_RESYNC": "30s",
            "DSAGENT_WEBHOOK_LISTEN": "0.0.0.0:8443",
            "DSAGENT_COPIES_CONFIGMAP": "ns/name",
            "OTHER": "x",
        }
    )


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


@pytest.mark.parametrize("main", [server.main, reconcile.main], ids=["webhook", "controller"])
def test_the_webhook_and_the_controller_refuse_an_unknown_variable(
    main: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DSAGENT_WEBHOOK_LISTN", "0.0.0.0:1")
    with pytest.raises(SystemExit) as caught:
        main()  # type: ignore[operator]
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown setting DSAGENT_WEBHOOK_LISTN; did you mean DSAGENT_WEBHOOK_LISTEN?" in err
