"""The controller's calls to the agents go through one HTTP client, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dsagent.controller.agents import AgentHttp
from dsplatform.tenancy import ACTING_FOR_HEADER
from tools.support.harness import held_port


class _Agent(http.server.ThreadingHTTPServer):
    """Answers every request with what it was asked; records the client ports it saw."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ports: list[int] = []
        self.seen: list[dict[str, Any]] = []


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the agent's server

    def _answer(self) -> None:
        server: _Agent = self.server  # type: ignore[assignment]
        server.ports.append(self.client_address[1])
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        server.seen.append({"path": self.path, "body": body, "headers": dict(self.headers)})
        data = b"not json" if self.path == "/plain" else json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def agent() -> Iterator[_Agent]:
    server = _Agent()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _base(agent: _Agent) -> str:
    return f"http://127.0.0.1:{agent.server_address[1]}"


def test_calls_share_one_client_and_its_connection(agent: _Agent) -> None:
    calls = AgentHttp()
    try:
        for i in range(5):
            assert calls(_base(agent), "tok", "n1", "PUT", f"/v1/tasks/t{i}", {"i": i}, "ns/ds") == (
                200,
                {"path": f"/v1/tasks/t{i}"},
            )
    finally:
        calls.close()
    assert len(set(agent.ports)) == 1, "one connection kept alive for all five calls"
    first = agent.seen[0]
    assert first["body"] == {"i": 0}
    assert first["headers"]["Authorization"] == "Bearer tok"
    assert first["headers"][ACTING_FOR_HEADER] == "ns/ds"


def test_an_answer_is_hostile_input_and_no_token_no_dataset_no_headers(agent: _Agent) -> None:
    calls = AgentHttp()
    try:
        assert calls(_base(agent), None, "n1", "GET", "/plain", None, "") == (200, None)  # not JSON: no body
    finally:
        calls.close()
    assert "Authorization" not in agent.seen[0]["headers"] and ACTING_FOR_HEADER not in agent.seen[0]["headers"]


def test_no_agent_or_an_unreachable_one_is_none() -> None:
    calls = AgentHttp(timeout=2.0)
    # held, never listened on: nothing answers there, and no other server is given the port
    with held_port() as port:
        try:
            assert calls(None, "tok", "n1", "GET", "/v1/tasks", None, "") is None
            assert calls(f"http://127.0.0.1:{port}", "tok", "n1", "GET", "/v1/tasks", None, "") is None
        finally:
            calls.close()
