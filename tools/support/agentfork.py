"""A fork server for the agent tests: ``dsagent serve`` processes without an interpreter start each.

Who uses it: :class:`tools.support.harness.AgentProcess`. A fresh ``python -m dsagent serve``
spends about two CPU-seconds importing the agent before it serves; the suite starts well
over a hundred. This module, run as ``python -m tools.support.agentfork`` (one per pytest
worker, started on first use), imports the agent once and then forks one child per request.
Each child is a real process of its own (its pid, its memory, its signals; ``kill -9`` kills
it) that sets its environment and working directory, sends its output to its log file and
runs ``dsagent.cli.agent.main`` with its arguments, as ``python -m dsagent`` does.

Protocol: one JSON object per line on stdin (``args`` after ``-m dsagent``, ``env``,
``cwd``, ``log``), answered by the child's pid on stdout. This process reaps its children
and writes each one's exit status (``subprocess``'s convention: minus the signal number
when a signal ended it) to ``<log>.exit``, which :class:`ForkedProcess` reads. It exits when
stdin closes.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: What ``dsagent serve`` imports before and while it starts serving.
PRELOAD = ("dsagent.cli.agent", "uvicorn", "fastapi", "dsagent.api.app")


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a module the agent no longer has: the child imports what it needs
    if threading.active_count() != 1:  # fork() copies only this thread: refuse to serve
        raise SystemExit(f"agentfork: importing the agent started threads: {threading.enumerate()}")


def _child(request: dict[str, Any]) -> None:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # stdin from /dev/null, stdout and stderr to the log: the requests and replies pipes,
    # this server's fds 0 and 1, are closed by being replaced.
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    import importlib.util

    from dsagent.cli.agent import main

    spec = importlib.util.find_spec("dsagent.__main__")  # found, not run
    sys.argv = [str(spec.origin if spec and spec.origin else "dsagent"), *request["args"]]

    code = 0
    try:
        main(list(request["args"]))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        import logging

        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(code)


def _reap(logs: dict[int, str]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        log = logs.pop(pid, None)
        if log is not None:
            staged = f"{log}.exit.partial"
            Path(staged).write_text(str(code))
            os.replace(staged, f"{log}.exit")


def serve() -> None:
    _preload()
    requests_fd, replies_fd = sys.stdin.fileno(), sys.stdout.fileno()
    logs: dict[int, str] = {}
    pending = b""
    while True:
        ready, _, _ = select.select([requests_fd], [], [], 0.02)
        _reap(logs)
        if not ready:
            continue
        chunk = os.read(requests_fd, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            Path(f"{request['log']}.exit").unlink(missing_ok=True)
            pid = os.fork()
            if pid == 0:
                _child(request)
            logs[pid] = request["log"]
            os.write(replies_fd, f"{pid}\n".encode())


class ForkedProcess:
    """A child of the fork server, with the part of :class:`subprocess.Popen` the tests use."""

    def __init__(self, pid: int, log: Path) -> None:
        self.pid = pid
        self._exit = Path(f"{log}.exit")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self._exit.exists():
            self.returncode = int(self._exit.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"dsagent (pid {self.pid})", timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The fork server of this process, started on first use."""

    _lock = threading.Lock()
    _server: subprocess.Popen[bytes] | None = None

    @classmethod
    def spawn(cls, args: list[str], env: dict[str, str], log: Path) -> ForkedProcess:
        with cls._lock:
            server = cls._running()
            request = {"args": args, "env": env, "cwd": os.getcwd(), "log": str(log)}
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(request).encode() + b"\n")
            server.stdin.flush()
            reply = server.stdout.readline()
            if not reply:
                raise RuntimeError(f"the agent fork server exited with {server.wait()}")
            return ForkedProcess(int(reply), log)

    @classmethod
    def _running(cls) -> subprocess.Popen[bytes]:
        if cls._server is None or cls._server.poll() is not None:
            root = Path(__file__).resolve().parents[2]
            path = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
            cls._server = subprocess.Popen(
                [sys.executable, "-m", "tools.support.agentfork"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                cwd=root,
            )
            atexit.register(cls.close)
        return cls._server

    @classmethod
    def close(cls) -> None:
        with cls._lock:
            if cls._server is not None:
                assert cls._server.stdin is not None and cls._server.stdout is not None
                cls._server.stdin.close()
                cls._server.wait(timeout=30)
                cls._server.stdout.close()
                cls._server = None


if __name__ == "__main__":
    serve()
