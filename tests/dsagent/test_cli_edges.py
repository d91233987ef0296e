"""CLI edges: --version on both commands, a scheme-less --agent, the socket file removed on
SIGTERM and Ctrl-C, and dsctl finding an agent started with --root alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dsagent import __version__
from dsagent.api.client import agent_url
from dsagent.errors import InvalidInput
from tests.dsagent.harness import ADMIN_TOKEN, unix_socket_listening


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, env=env, check=False)


def test_both_commands_print_their_version() -> None:
    dsctl = run("-m", "dsagent.cli", "--version")
    dsagent = run("-m", "dsagent", "--version")
    assert dsctl.returncode == 0 and dsctl.stdout.strip() == f"dsctl, version {__version__}"
    assert dsagent.returncode == 0 and dsagent.stdout.strip() == f"dsagent, version {__version__}"


def test_agent_urls_without_a_scheme_mean_http() -> None:
    assert agent_url("127.0.0.1:17420") == "http://127.0.0.1:17420"
    assert agent_url("https://agent.example:7420") == "https://agent.example:7420"
    for bad in ("ftp://x:1", "http://[::1", "127.0.0.1:notaport"):
        with pytest.raises(InvalidInput, match="invalid agent URL"):
            agent_url(bad)


def test_dsctl_ls_takes_a_scheme_less_agent(agent_factory: Any) -> None:
    agent = agent_factory(tcp=True)
    listed = run("-m", "dsagent.cli", "ls", "--agent", f"127.0.0.1:{agent.port}", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["datasets"] == []
    bad = run("-m", "dsagent.cli", "ls", "--agent", "127.0.0.1:notaport")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "invalid agent URL" in bad.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_socket_file_is_removed_on_exit(agent_factory: Any, sig: signal.Signals) -> None:
    agent = agent_factory()
    assert agent.socket.exists()
    assert agent.proc is not None
    agent.proc.send_signal(sig)
    agent.proc.wait(timeout=30)
    assert not agent.socket.exists()


def test_dsctl_finds_the_socket_of_an_agent_started_with_root_alone(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAGENT_")}
    env.update(XDG_RUNTIME_DIR=str(tmp_path / "run"), DSAGENT_SWEEP_INTERVAL="3600", DSAGENT_ADMIN_TOKEN=ADMIN_TOKEN)
    root = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsagent", "serve", "--root", str(root)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not unix_socket_listening(root / "dsagent.sock"):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        pointer = tmp_path / "run" / "dsagent" / "socket"
        assert pointer.read_text().strip() == str(root / "dsagent.sock")
        listed = run("-m", "dsagent.cli", "ls", "-o", "json", env=env)
        assert listed.returncode == 0, listed.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert not pointer.exists() and not (root / "dsagent.sock").exists()
