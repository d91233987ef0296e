"""CLI edges: --version on both commands, a scheme-less --agent, the socket file removed on
SIGTERM and Ctrl-C, and dsctl finding an agent started with --root alone."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dsagent import __version__
from dsagent.api.client import agent_url
from dsagent.errors import InvalidInput
from tools.support.harness import ADMIN_TOKEN, unix_socket_listening

pytestmark = pytest.mark.slow


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, env=env, check=False)


def test_both_commands_print_their_version() -> None:
    dsctl = run("-m", "dsagent.cli", "--version")
    dsagent = run("-m", "dsagent", "--version")
    from dsagent.format import native

    native_line = f"native loops: {native.describe()}"  # on where built, else off and why
    assert dsctl.returncode == 0 and dsctl.stdout.splitlines() == [f"dsctl, version {__version__}", native_line]
    assert dsagent.returncode == 0 and dsagent.stdout.splitlines() == [f"dsagent, version {__version__}", native_line]
    command = run("-m", "dsagent.cli", "version")  # the same, as a command
    assert command.returncode == 0 and command.stdout == dsctl.stdout
    off = run("-m", "dsagent.cli", "version", env={**os.environ, "DSAGENT_NATIVE": "0"})
    assert off.returncode == 0 and off.stdout.splitlines()[1].startswith("native loops: off")
    as_json = run("-m", "dsagent.cli", "version", "-o", "json", env={**os.environ, "DSAGENT_NATIVE": "0"})
    assert json.loads(as_json.stdout) == {"version": __version__, "nativeLoops": False, "nativeOff": "DSAGENT_NATIVE=0"}


def test_agent_urls_without_a_scheme_mean_http() -> None:
    assert agent_url("127.0.0.1:17420") == "http://127.0.0.1:17420"
    assert agent_url("https://agent.example:7420") == "https://agent.example:7420"
    # a port out of range was "no agent answering" (exit 8), not a bad URL (exit 2)
    for bad in ("ftp://x:1", "http://[::1", "127.0.0.1:notaport", "notahost:99999", "notahost:0"):
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


def _records(run_dir: Path) -> list[dict[str, str]]:
    folder = run_dir / "dsagent" / "agents"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def test_dsctl_finds_the_agent_started_with_root_alone_and_names_it(tmp_path: Path) -> None:
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
        # the agent binds its socket, then records it: both, or a fast dsctl finds no record
        while not (unix_socket_listening(root / "dsagent.sock") and _records(tmp_path / "run")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert _records(tmp_path / "run") == [{"root": str(root), "socket": str(root / "dsagent.sock")}]
        listed = run("-m", "dsagent.cli", "ls", "-o", "json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout)["agent"] == {"socket": str(root / "dsagent.sock"), "root": str(root)}
        text = run("-m", "dsagent.cli", "ls", env=env)
        assert text.stdout.strip().splitlines()[-1] == f"agent at {root / 'dsagent.sock'} (root {root})"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert _records(tmp_path / "run") == [] and not (root / "dsagent.sock").exists()


def test_with_two_agents_running_dsctl_refuses_to_guess_and_says_how_to_pick(tmp_path: Path) -> None:
    """The last agent to start took the one per-user record, and dsctl talked to it without
    saying so: an empty ls and "no dataset" for the other agent's data."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAGENT_")}
    env.update(XDG_RUNTIME_DIR=str(tmp_path / "run"), DSAGENT_SWEEP_INTERVAL="3600", DSAGENT_ADMIN_TOKEN=ADMIN_TOKEN)
    agents: list[subprocess.Popen[bytes]] = []

    def start(root: Path) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsagent", "serve", "--root", str(root)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        agents.append(proc)
        deadline = time.monotonic() + 60
        while not (serving(root / "dsagent.sock") and str(root) in {r["root"] for r in _records(tmp_path / "run")}):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        return proc

    def serving(path: Path) -> bool:
        """The agent answers HTTP (not only listens: it binds before its signal handlers are
        in place). A raw request on a socket closed here: httpcore leaks refused ones."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(5)
            try:
                probe.connect(str(path))
                probe.sendall(b"GET /healthz HTTP/1.0\r\nHost: agent\r\n\r\n")
                return probe.recv(12).startswith(b"HTTP/1.1 200")
            except OSError:
                return False

    first, second_root = tmp_path / "first", tmp_path / "second"
    try:
        start(first)
        second = start(second_root)
        guessed = run("-m", "dsagent.cli", "ls", env=env)
        assert guessed.returncode == 2 and guessed.stderr.count("\n") == 1, guessed.stderr
        assert "2 agents are running" in guessed.stderr
        assert f"DSAGENT_ROOT={first}" in guessed.stderr and f"DSAGENT_ROOT={second_root}" in guessed.stderr
        picked = run("-m", "dsagent.cli", "ls", "-o", "json", env={**env, "DSAGENT_ROOT": str(first)})
        assert picked.returncode == 0 and json.loads(picked.stdout)["agent"]["root"] == str(first)
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
        alone = run("-m", "dsagent.cli", "ls", "-o", "json", env=env)  # one left: found, and named
        assert alone.returncode == 0 and json.loads(alone.stdout)["agent"]["root"] == str(first)
    finally:
        for proc in agents:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert _records(tmp_path / "run") == [], "each agent removes its own record"


def one_line_error(result: subprocess.CompletedProcess[str], prefix: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("kind", ["missing parent", "regular file"])
def test_a_root_that_cannot_be_a_directory_is_one_line_and_exit_2(kind: str, tmp_path: Path) -> None:
    """`dsagent serve --root /proc/nope` and `--root <a file>` printed 35-line tracebacks."""
    root = Path("/proc/nope") if kind == "missing parent" else tmp_path / "afile"
    if kind == "regular file":
        root.write_text("x")
    result = run("-m", "dsagent", "serve", "--root", str(root), "--socket", str(tmp_path / "s.sock"))
    assert result.returncode == 2
    line = one_line_error(result, "dsagent: error: ")
    assert str(root) in line and "--root or DSAGENT_ROOT" in line


@pytest.mark.parametrize("kind", ["missing", "regular file"])
def test_a_local_source_that_is_not_a_directory_stops_the_agent_with_one_line(kind: str, tmp_path: Path) -> None:
    """The agent used to start and then refuse, at request time, every dataset under the
    mistyped directory as "outside the directories this agent may read"."""
    source = tmp_path / "nosrc"
    if kind == "regular file":
        source.write_text("x")
    root, sock = tmp_path / "root", tmp_path / "s.sock"
    result = run("-m", "dsagent", "serve", "--root", str(root), "--socket", str(sock), "--local-source", str(source))
    assert result.returncode == 2
    line = one_line_error(result, "dsagent: error: ")
    assert f"the local source {source}" in line and "DSAGENT_LOCAL_SOURCES" in line
    assert not sock.exists()


def test_the_extender_on_a_busy_port_is_one_line_and_exit_2() -> None:
    """`dsctl scheduler serve` on a busy port exited 3 ("not found") after uvicorn's log."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run("-m", "dsagent.cli", "scheduler", "serve", "--port", str(port))
    assert result.returncode == 2
    line = one_line_error(result, "dsctl: error: ")
    assert f"cannot listen on 127.0.0.1:{port}" in line and "DSEXT_PORT" in line
