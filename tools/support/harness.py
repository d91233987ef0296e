"""Real parts for the agent tests: a loopback HTTP server and a real ``dsagent serve``.

``LoopbackServer`` serves a directory over HTTP/1.1 on 127.0.0.1 with Range support (what
fsspec's http filesystem needs), counts requests per path, and can delay chosen paths to
make a source slow. ``AgentProcess`` runs ``dsagent serve`` in a process of its own on a
unix socket (and TCP when asked), and can stop it politely or with SIGKILL: forked from
this worker's agent fork server (``tools/support/agentfork.py``: the agent imported once,
not once per start), or, with ``fresh=True``, as ``python -m dsagent serve`` from scratch
(for tests that measure the process's own memory).

Who uses it: the agent's tests and the fault injection's kill points
(:func:`tools.support.faults.run_kill_point`, which ``tools/faults/sweep.py`` runs).
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dsagent.api.client import AgentClient
from dsagent.errors import AgentUnreachable
from tools.support.agentfork import ForkedProcess, ForkServer
from tools.support.ports import port_holder

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
#: The test and benchmark servers listen on loopback, which an agent fetches from for a
#: request only where the operator allows it (dsagent.format.egress): the allowance they give
#: the agents they start (DSAGENT_EGRESS_ALLOW) and build (Settings.egress_allow).
LOOPBACK = ("127.0.0.0/8", "::1")


class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_HEAD(self) -> None:
        self.server.count(self.command, self.path)
        super().do_HEAD()

    def do_GET(self) -> None:
        self.server.count(self.command, self.path)
        delay = self.server.delay_for(self.path)
        if delay:
            with self.server._lock:
                self.server.inflight += 1
                self.server.peak = max(self.server.peak, self.server.inflight)
            time.sleep(delay)
            with self.server._lock:
                self.server.inflight -= 1
        match = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if match is None or not path.is_file():
            super().do_GET()
            return
        data = path.read_bytes()
        start = int(match.group(1))
        end = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self.wfile.write(data[start : end + 1])


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, directory: Path, host: str = "127.0.0.1") -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.directory = directory
        self.requests: Counter[tuple[str, str]] = Counter()
        self.delays: list[tuple[Callable[[str], bool], float]] = []
        self.inflight = 0
        self.peak = 0  # most slowed-down requests served at once
        self._lock = threading.Lock()
        super().__init__((host, 0), lambda *a: _Handler(*a, directory=str(directory)))

    def count(self, method: str, path: str) -> None:
        with self._lock:
            self.requests[(method, path.split("?", 1)[0])] += 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients killed mid-response (kill -9 tests) are expected here

    def delay_for(self, path: str) -> float:
        return sum(seconds for match, seconds in self.delays if match(path))


class LoopbackServer:
    """A real HTTP server on 127.0.0.1 (or ``host``, e.g. ``::1``) serving ``directory``."""

    def __init__(self, directory: Path, host: str = "127.0.0.1") -> None:
        self._server = _Server(directory, host)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def gets(self, predicate: Callable[[str], bool] = lambda p: True) -> dict[str, int]:
        with self._server._lock:
            return {
                path: n for (method, path), n in self._server.requests.items() if method == "GET" and predicate(path)
            }

    def slow_down(self, predicate: Callable[[str], bool], seconds: float) -> None:
        self._server.delays.append((predicate, seconds))

    @property
    def peak_concurrency(self) -> int:
        return self._server.peak

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def eventually(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition") -> None:
    """Poll ``predicate`` every 50 ms until it is true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A TCP port kept from everyone else while the block runs, for servers that bind it
    later (agents on 127.0.0.2, 127.0.0.3, ... sharing one port, as pods do).

    A socket bound to the wildcard address and never listening holds the port on every
    address (:func:`tools.support.ports.port_holder`); the agent sets SO_REUSEADDR, so it
    binds beside it. A port only probed and let go could be taken between the probe and the agents'
    start by another test's outgoing connection from 127.0.0.2.
    """
    with port_holder() as holder:  # on the wildcard address: every address's port
        yield int(holder.getsockname()[1])


@contextlib.contextmanager
def held_ports(count: int) -> Iterator[list[int]]:
    """``count`` ports, each kept as :func:`held_port` keeps one, for agents that each listen
    on their own port and must know the others' before they start (peers that list each
    other). Ports only probed and let go were taken, before the agents bound them, by
    other tests' outgoing connections, whose ephemeral ports come from the same range."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(held_port()) for _ in range(count)]


def unix_socket_listening(path: Path) -> bool:
    """Whether something accepts connections on the unix socket ``path``.

    Probed with a socket we close ourselves: httpcore leaks the socket of a refused unix
    connection (the socket file exists before the agent listens), and the ResourceWarning
    it raises at garbage collection would fail whichever test happens to be running.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class AgentProcess:
    """``python -m dsagent serve`` on a unix socket (and TCP with ``tcp=True``)."""

    def __init__(
        self,
        root: Path,
        *,
        tcp: bool = False,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: dict[str, str] | None = None,
        local_sources: tuple[Path, ...] = (),
        fresh: bool = False,
    ) -> None:
        self.root = root
        self.fresh = fresh
        self.host = host  # another loopback address (127.0.0.2, ...): agents that share one port, as pods do
        self.socket = root.parent / f"{root.name}.sock"
        # a port this harness picks is kept from other tests until the agent first answers
        # (held_ports says why); one passed in was chosen beforehand: peers that list each other
        self._holding = contextlib.ExitStack()
        if tcp and port is None:
            port = self._holding.enter_context(held_port())
        self.port = port if tcp else None
        self.log = root.parent / f"{root.name}.log"
        self.env = {
            **os.environ,
            "DSAGENT_ADMIN_TOKEN": ADMIN_TOKEN,
            "DSAGENT_SWEEP_INTERVAL": "3600",
            "DSAGENT_EGRESS_ALLOW": ",".join(LOOPBACK),
            **(env or {}),
        }
        self.args = [
            sys.executable,
            "-m",
            "dsagent",
            "serve",
            "--root",
            str(root),
            "--socket",
            str(self.socket),
            "--log-level",
            "info",
        ]
        self.args += [arg for path in local_sources for arg in ("--local-source", str(path))]
        if self.port is not None:
            self.args += ["--listen", f"{host}:{self.port}"]
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None

    def start(self, timeout: float = 60.0) -> AgentProcess:
        self.socket.unlink(missing_ok=True)  # a killed agent's stale socket: wait for the new one
        if self.fresh:
            log = open(self.log, "ab")
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        else:
            self.proc = ForkServer.spawn(self.args[3:], self.env, self.log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dsagent exited with {self.proc.returncode}:\n{self.log.read_text()}")
            if not unix_socket_listening(self.socket):
                time.sleep(0.05)
                continue
            try:
                with self.client() as client:
                    if client.health():
                        self._holding.close()  # it listens on its port now
                        return self
            except AgentUnreachable:
                time.sleep(0.05)
        raise RuntimeError(f"dsagent did not answer within {timeout}s:\n{self.log.read_text()}")

    def client(self, *, tcp: bool = False, token: str | None = None, timeout: float = 60.0) -> AgentClient:
        if tcp:
            assert self.port is not None, "start the agent with tcp=True"
            return AgentClient(url=self.url, token=token, timeout=timeout)
        return AgentClient(socket_path=self.socket, timeout=timeout)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        self._holding.close()
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


def wait_ready(client: AgentClient, task_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """Poll a task until it leaves ``pending``; returns the record."""
    deadline = time.monotonic() + timeout
    while True:
        record = client.get_task(task_id)
        if record["state"] != "pending" or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


def allocated(size_bytes: int, files: int, root: Path) -> int:
    """The disk a version of ``files`` files and ``size_bytes`` bytes counts against the
    cache's capacity (the agent's own rule, ``dsagent.cache.layout.allocated``) on the
    filesystem holding ``root``, or its nearest existing parent: a cache root not yet
    created lies on it too. Tests size their capacities with it, in the agent's units."""
    from dsagent.cache import layout

    while not root.exists():
        root = root.parent
    return layout.allocated(size_bytes, files, layout.block_size_of(root))


#: Runs its arguments and prints their exit status and peak RSS (KiB) on its last line. The
#: measured command must be started from a small process: a child spawned straight from a
#: pytest worker (vfork/posix_spawn) keeps the worker's RSS as its ``ru_maxrss`` across exec.
_MEASURE = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
    "print(f'\\n{code} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}')"
)


def run_measured(args: list[str]) -> tuple[int, int, str]:
    """Run ``args``; its exit status, its peak RSS in bytes (the kernel's ``wait4`` figure),
    and its output."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300
    )
    output = proc.stdout.decode(errors="replace")
    body, _, last = output.rstrip("\n").rpartition("\n")
    code, peak_kib = (int(x) for x in last.split())
    return code, peak_kib * 1024, body
