"""What ``dsctl`` says in the cases an operator found unclear: a misspelt variable, the
last seconds of a fetch (verifying, not "eta 0s")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dsagent.cli import COMMON_VARIABLES, platform_settings
from dsagent.cli.cache import describe
from dsagent.kube.envnames import known_names


def dsctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsagent.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow  # runs dsctl as a process
def test_a_misspelt_variable_stops_dsctl_with_one_line_naming_the_right_one(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DSAGENT_SOKET": str(tmp_path / "x.sock")}
    answer = dsctl("ls", env=env)
    assert answer.returncode == 2
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsctl: error:")
    assert "DSAGENT_SOKET" in lines[0] and "DSAGENT_SOCKET" in lines[0]


@pytest.mark.slow  # runs dsctl as a process
def test_the_variables_the_platform_gives_dsctl_are_accepted(tmp_path: Path) -> None:
    """The init-container's environment as the webhook writes it, and per-dataset options."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "DSAGENT_SOCKET": str(tmp_path / "none.sock"),
        "DSAGENT_TASK_ID": "6f1c2a4e-9b7d-4c3e-8a21-0d5e7f9a1b2c",
        "DSAGENT_STATUS_FILE": str(tmp_path / "status"),
        "DSAGENT_STORAGE_OPTIONS_IMAGENET": "{}",
        "DSAGENT_CAPACITY": "10Gi",  # an agent setting: kubectl exec into the agent's pod
    }
    answer = dsctl("ls", env=env)
    assert answer.returncode == 8, answer.stderr  # past the check: no agent answers there
    assert "DSAGENT_" not in answer.stderr.split("no dsagent is answering")[0]


def test_the_common_variables_are_known_to_the_platform() -> None:
    assert COMMON_VARIABLES <= known_names(platform_settings())


def test_the_progress_line_says_verifying_once_every_byte_is_in() -> None:
    dataset = {"name": "d", "state": "fetching", "sizeBytes": 1000, "bytesDone": 1000, "rateBytesPerSecond": 0,
               "etaSeconds": 0}  # fmt: skip
    line = describe({"task": "t", "state": "pending", "datasets": [dataset]})
    assert "verifying" in line and "eta" not in line
    line = describe({"task": "t", "state": "pending", "datasets": [{**dataset, "bytesDone": 500, "etaSeconds": 5}]})
    assert "eta 5s" in line and "verifying" not in line


def test_the_agent_says_what_it_serves_in_one_start_up_line(agent_factory: object) -> None:
    import time

    agent = agent_factory(tcp=True, env={"DSAGENT_CAPACITY": "2Gi"})  # type: ignore[operator]
    deadline = time.monotonic() + 10
    while "serving:" not in agent.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(line for line in agent.log.read_text().splitlines() if "dsagent" in line and "serving:" in line)
    assert f"root {agent.root}" in line and f"socket {agent.socket}" in line
    assert f"tcp 127.0.0.1:{agent.port}" in line and "capacity 2.15 GB" in line and "free of" in line
    assert "cluster mode off" in line
    from dsagent.format import native

    assert line.endswith(f"native loops {native.describe()}")  # on where built, else off and why


def test_the_start_up_line_says_when_dsagent_native_turns_the_native_loops_off(agent_factory: object) -> None:
    import time

    agent = agent_factory(env={"DSAGENT_NATIVE": "0"})  # type: ignore[operator]
    deadline = time.monotonic() + 10
    while "serving:" not in agent.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(line for line in agent.log.read_text().splitlines() if "dsagent" in line and "serving:" in line)
    assert line.endswith("native loops off (DSAGENT_NATIVE=0)")


def test_every_dsctl_command_that_prints_a_result_takes_output_json() -> None:
    import click

    from dsagent.cli import cli

    ctx = click.Context(cli)
    # these print no result: they exec the training command, or serve until stopped
    no_result = {"wait", "scheduler serve"}
    seen = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        subs = (
            [(f"{name} {s}", command.get_command(ctx, s)) for s in command.list_commands(ctx)]
            if isinstance(command, click.Group)
            else [(name, command)]
        )
        for full, sub in subs:
            if full in no_result:
                continue
            seen.append(full)
            options = {opt for p in sub.params for opt in getattr(p, "opts", [])}  # type: ignore[union-attr]
            assert {"-o", "--output"} <= options, f"dsctl {full} has no -o/--output"
    assert {"evict", "release", "operation", "plan", "topo show", "topo best"} <= set(seen)


def test_the_agents_own_settings_near_a_dsctl_name_are_not_typos() -> None:
    """An operator's shell in the agent's pod has every agent setting: ``DSAGENT_CSI_SOCKET``
    is close to ``DSAGENT_SOCKET`` but the agent's, so it passes; a real typo does not."""
    from dsagent.cli import refuse_unknown_environment
    from dsagent.errors import SettingsError

    refuse_unknown_environment({"DSAGENT_CSI_SOCKET": "/x", "DSAGENT_PROTOCOLS": "file", "DSAGENT_SOCKET": "/y"})
    import pytest

    with pytest.raises(SettingsError, match="DSAGENT_SOKET"):
        refuse_unknown_environment({"DSAGENT_SOKET": "/y"})
