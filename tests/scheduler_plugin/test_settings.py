"""Settings: read from DSEXT_* once, validated, with clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsagent.cli import cli
from dsagent.cli import main as dsctl
from dsplatform.units import parse_duration
from scheduler_plugin.errors import SettingsError
from scheduler_plugin.settings import DEFAULT_JOB_LABELS, Settings, Weights


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert (settings.host, settings.port, settings.watch, settings.partial_datasets) == (
        "127.0.0.1",
        8888,
        False,
        False,
    )
    assert settings.weights == Weights(0.5, 0.3, 0.2)
    assert settings.job_labels == DEFAULT_JOB_LABELS and settings.job_labels[0] == "dsagent.io/job"


def test_environment_is_read_and_overrides_win() -> None:
    env = {
        "DSEXT_PORT": "9000",
        "DSEXT_WEIGHTS": "dataset=1,numa=0",
        "DSEXT_WATCH": "yes",
        "DSEXT_JOB_LABELS": "team/job, other",
        "DSEXT_JOB_TTL": "15m",
        "DSEXT_BASE_PATH": "/sched",
        "DSEXT_PARTIAL_DATASETS": "true",
    }
    settings = Settings.from_env(env, port=9001)
    assert settings.port == 9001 and settings.watch and settings.partial_datasets
    assert settings.weights == Weights(dataset=1.0, roce=0.3, numa=0.0)
    assert settings.job_labels == ("team/job", "other") and settings.job_ttl_s == 900 and settings.base_path == "/sched"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DSEXT_PORT": "eighty"}, "DSEXT_PORT"),
        ({"DSEXT_PORT": "70000"}, "out of range"),
        ({"DSEXT_WEIGHTS": "dataset=-1"}, "must be a finite number >= 0"),
        ({"DSEXT_WEIGHTS": "affinity=1"}, "invalid weight"),
        ({"DSEXT_WATCH": "maybe"}, "not a boolean"),
        ({"DSEXT_JOB_TTL": "soon"}, "invalid duration"),
        ({"DSEXT_BASE_PATH": "sched/"}, "must start with '/'"),
        ({"DSEXT_JOB_LABELS": " , "}, "at least one job label"),
        ({"DSEXT_LOG_LEVEL": "loud"}, "unknown log level"),
    ],
)
def test_invalid_settings_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("1h", 3600.0), ("250ms", 0.25)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.slow
def test_python_m_scheduler_plugin_exits_2_on_a_bad_setting() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scheduler_plugin"],
        env={"DSEXT_PORT": "x", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "DSEXT_PORT" in result.stderr and "Traceback" not in result.stderr


def test_dsctl_scheduler_serve_is_wired() -> None:
    result = CliRunner().invoke(cli, ["scheduler", "serve", "--help"])
    assert result.exit_code == 0
    assert "--watch / --no-watch" in result.output


def test_dsctl_scheduler_serve_rejects_bad_weights_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        dsctl(["scheduler", "serve", "--weights", "dataset=lots"])
    assert excinfo.value.code == 2
    assert "weight dataset='lots' is not a number" in capsys.readouterr().err


def test_a_kubeconfig_that_does_not_exist_is_a_setting_error_not_an_internal_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it was exit 1, "internal error: ConfigException" (a bug report for a typo)
    missing = tmp_path / "nokube"
    with pytest.raises(SystemExit) as excinfo:
        dsctl(["scheduler", "serve", "--watch", "--kubeconfig", str(missing)])
    err = capsys.readouterr().err
    assert excinfo.value.code == 2
    assert f"cannot read the kubeconfig {missing}" in err and "internal error" not in err and err.count("\n") == 1


@pytest.mark.slow
def test_python_m_scheduler_plugin_serves_the_extender() -> None:
    import os
    import time
    from contextlib import ExitStack

    import httpx

    from scheduler_plugin.testing import args_body, node, pod
    from tools.support.harness import held_port

    hold = ExitStack()
    port = hold.enter_context(held_port())  # nobody else's until the extender listens on it
    env = {**os.environ, "DSEXT_PORT": str(port), "DSEXT_LOG_LEVEL": "warning"}
    server = subprocess.Popen([sys.executable, "-m", "scheduler_plugin"], env=env)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            hold.close()
            body = args_body(pod(gpus=1), [node("n1", free_gpus=[0])], node_cache_capable=False)
            # No datasets, no topology: only the RoCE best fit (10) counts, at weight 0.3.
            assert http.post("/prioritize", content=body).json() == [{"Host": "n1", "Score": 3}]
    finally:
        hold.close()
        server.terminate()
        # uvicorn shuts down cleanly, then re-raises SIGTERM as its exit status.
        assert server.wait(10) in (0, -15)
