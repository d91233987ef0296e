"""Hanging sources cannot wedge the agent for good. Readiness fails
while every worker thread is stuck; SIGTERM stops the agent within 10 s whatever its
threads are doing. (A FIFO source is refused without being opened:
``test_trust_boundary.py``.)

A real ``dsagent serve`` and a real TCP server on 127.0.0.1 that accepts connections and
never answers.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tools.support.harness import ADMIN_TOKEN


@pytest.fixture
def silent_server() -> Iterator[str]:
    """``http://127.0.0.1:PORT``: accepts every connection, reads, never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_readiness_fails_while_workers_hang_and_sigterm_stops_the_agent(agent_factory: Any, silent_server: str) -> None:
    # 1 fetch x 1 worker: 3 worker threads in all, each resolve below takes one for good
    agent = agent_factory(
        tcp=True,
        env={
            "DSAGENT_MAX_FETCHES": "1",
            "DSAGENT_FETCH_WORKERS": "1",
            "DSAGENT_STALL_TIMEOUT": "1s",
            "DSAGENT_SOURCE_TIMEOUT": "1h",
        },
    )
    with httpx.Client(base_url=agent.url, timeout=10, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        for i in range(6):
            dataset = {"name": f"hang{i}", "source": f"{silent_server}/src{i}", "bundles": f"{silent_server}/store{i}"}
            assert http.put(f"/v1/tasks/t{i}", json={"datasets": [dataset]}).status_code == 200
        deadline = time.monotonic() + 20
        while http.get("/readyz").status_code == 200:
            assert time.monotonic() < deadline, "readiness never noticed the stuck workers"
            time.sleep(0.2)
        assert http.get("/readyz").json()["status"] == "stalled"
        assert http.get("/healthz").status_code == 200  # alive, just not ready
    started = time.monotonic()
    code = agent.stop()
    took = time.monotonic() - started
    assert took < 10, f"SIGTERM took {took:.1f} s"
    assert code in (0, -15), code
