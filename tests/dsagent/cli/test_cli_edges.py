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
    assert dsctl.returncode == 0 and dsctl.stdout.strip() == f"dsctl, version {__version__}"
    assert dsagent.returncode == 0 and dsagent.stdout.strip() == f"dsagent, version {__version__}"


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
        pointer = tmp_path / "run" / "dsagent" / "socket"
        # the agent binds its socket, then records it: both, or a fast dsctl finds no pointer
        while not (unix_socket_listening(root / "dsagent.sock") and pointer.exists()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert pointer.read_text().strip() == str(root / "dsagent.sock")
        listed = run("-m", "dsagent.cli", "ls", "-o", "json", env=env)
        assert listed.returncode == 0, listed.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert not pointer.exists() and not (root / "dsagent.sock").exists()


def test_a_second_agent_stopping_hands_the_pointer_back_to_the_first(tmp_path: Path) -> None:
    """Stopping a second agent deleted the first one's discovery file, and dsctl ls
    then said no agent was running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAGENT_")}
    env.update(XDG_RUNTIME_DIR=str(tmp_path / "run"), DSAGENT_SWEEP_INTERVAL="3600", DSAGENT_ADMIN_TOKEN=ADMIN_TOKEN)
    pointer = tmp_path / "run" / "dsagent" / "socket"
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
        while not serving(root / "dsagent.sock"):  # its SIGTERM handler is in place from here
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

    try:
        start(tmp_path / "first")
        second = start(tmp_path / "second")
        assert pointer.read_text().strip() == str(tmp_path / "second" / "dsagent.sock")
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
        assert pointer.read_text().strip() == str(tmp_path / "first" / "dsagent.sock")
        assert run("-m", "dsagent.cli", "ls", "-o", "json", env=env).returncode == 0
    finally:
        for proc in agents:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert not pointer.exists(), "the last agent to stop removes it"


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
