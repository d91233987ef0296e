"""The extender process exits soon after SIGTERM even while a client is
stalled mid-request (before, uvicorn waited for that request forever)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack

import pytest

from scheduler_plugin.__main__ import SHUTDOWN_GRACE_S
from tools.support.harness import held_port

pytestmark = pytest.mark.slow


def test_the_extender_exits_after_sigterm_with_a_request_stalled_mid_body() -> None:
    hold = ExitStack()
    port = hold.enter_context(held_port())  # nobody else's until the extender listens on it
    env = {**os.environ, "DSEXT_HOST": "127.0.0.1", "DSEXT_PORT": str(port)}
    process = subprocess.Popen(
        [sys.executable, "-m", "scheduler_plugin"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                idle = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "extender did not start"
                time.sleep(0.1)
        hold.close()
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(1024).startswith(b"HTTP/1.1 200")
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        held += [idle, stalled]
        time.sleep(0.5)  # let the server start reading the stalled body (not an assertion)
        process.terminate()
        # the grace period plus a generous margin for a loaded machine
        process.wait(SHUTDOWN_GRACE_S + 20)
    finally:
        hold.close()
        for sock in held:
            sock.close()
        if process.poll() is None:
            process.kill()
            process.wait()
