"""Stripe shares held and watched through a real agent's admin socket, as the controller does:
the helpers the multi-agent stripe tests share (``PUT /v1/stripes/<name>``, its status route)."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tools.support.harness import AgentProcess


def admin(agent: AgentProcess) -> httpx.Client:
    """A client on the agent's unix socket (admin rights, as the tests' agents run)."""
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(agent.socket)), base_url="http://agent", timeout=60)


def hold(agent: AgentProcess, name: str, store: str, members: list[str], peers: dict[str, str]) -> None:
    """Ask ``agent`` to hold its share of ``name`` in a group of ``members``."""
    with admin(agent) as client:
        answer = client.put(f"/v1/stripes/{name}", json={"store": store, "members": members, "peers": peers})
    assert answer.status_code == 200, answer.text


def share_status(agent: AgentProcess, name: str, digest: str) -> dict[str, Any]:
    with admin(agent) as client:
        return dict(client.get(f"/v1/stripes/{name}/{digest}").json())


def until_complete(agent: AgentProcess, name: str, digest: str, timeout: float = 60) -> dict[str, Any]:
    """The share's status once it is complete or failed (an assertion after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        status = share_status(agent, name, digest)
        if status["complete"] or status["error"]:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
