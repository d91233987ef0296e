"""A pass asks the agents of a Dataset's nodes at once, not one after another: with a round
trip of a few milliseconds per agent, a pass over a thousand Datasets asking two or more
nodes each spent seconds waiting, one answer at a time. Each test's fake agents wait at a
barrier for all the Dataset's nodes, so asking them one after another breaks it; the
answers still come back in the nodes' order."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dsagent.controller import agents
from dsagent.controller.striping import stripe_status

GB = 1 << 30
NODES = ("n1", "n2", "n3", "n4")


def _together(
    count: int, answer: Any, methods: frozenset[str] = frozenset({"PUT"})
) -> tuple[Any, list[tuple[str, str, str]]]:
    """An agent call whose requests of ``methods`` each wait until ``count`` of them are in
    flight (at most 5 s: then the barrier breaks and the call raises); others answer at once."""
    barrier = threading.Barrier(count, timeout=5)
    seen: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    def call(node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any] | None:
        with lock:
            seen.append((node, method, path))
        if method in methods:
            barrier.wait()
        return answer(node, method, path, body)

    return call, seen


def test_on_each_asks_every_node_at_once_and_answers_in_their_order() -> None:
    barrier = threading.Barrier(len(NODES), timeout=5)

    def call(node: str) -> str:
        barrier.wait()
        return node.upper()

    assert agents.on_each(call, list(reversed(NODES))) == [n.upper() for n in reversed(NODES)]
    assert agents.on_each(call, []) == []


def test_on_each_asks_a_single_node_without_a_thread() -> None:
    caller = []
    assert agents.on_each(lambda node: caller.append(threading.current_thread()) or node, ["n1"]) == ["n1"]
    assert caller == [threading.current_thread()]


def test_on_each_passes_an_agent_calls_error_on() -> None:
    def call(node: str) -> str:
        if node == "n2":
            raise ValueError("boom")
        return node

    with pytest.raises(ValueError, match="boom"):
        agents.on_each(call, list(NODES))


def test_a_warm_up_asks_its_nodes_at_once_and_reports_in_their_order() -> None:
    def answer(node: str, method: str, path: str, body: Any) -> tuple[int, Any]:
        if method == "DELETE":
            return 200, {}
        state = "ready" if node != "n3" else "fetching"
        return 200, {"datasets": [{"name": "imgs", "state": state, "sizeBytes": GB, "bytesDone": GB}]}

    call, seen = _together(len(NODES), answer)
    spec = {"source": "s3://data/imgs", "bundles": "s3://packs/imgs"}
    reports = agents.hold_on(call, "warm.ml.imgs", "ml/imgs", "imgs", spec, [], list(NODES))
    assert [r["node"] for r in reports] == list(NODES)
    assert [r["state"] for r in reports] == ["ready", "ready", "fetching", "ready"]
    # the nodes no longer chosen are released first, together as well
    call, seen = _together(3, answer, frozenset({"DELETE"}))
    reports = agents.hold_on(call, "warm.ml.imgs", "ml/imgs", "imgs", spec, list(NODES), ["n4"])
    assert [r["node"] for r in reports] == ["n4"]
    assert sorted(n for n, m, _ in seen[:3] if m == "DELETE") == ["n1", "n2", "n3"] and seen[3][:2] == ("n4", "PUT")


def test_a_stripe_groups_members_are_asked_at_once_and_reported_in_member_order() -> None:
    inventories = {n: {"freeBytes": 100 * GB, "capacityBytes": 100 * GB} for n in NODES}

    def answer(node: str, method: str, path: str, body: Any) -> tuple[int, Any] | None:
        if node == "n2":
            return None  # unreachable
        held = GB if node != "n4" else 0
        return 200, {"complete": node != "n4", "bytesHeld": held, "bytesOwned": GB, "digest": "b" * 32}

    call, _ = _together(len(NODES), answer)
    status = stripe_status(
        "big",
        {"stripe": {"members": len(NODES)}, "bundles": "s3://s/p"},
        {"bytes": 4 * GB, "digest": "b" * 32},
        inventories,
        agent_call=call,
        agent_urls={n: f"http://{n}" for n in NODES},
    )
    by_node = {r["node"]: r for r in status["nodes"]}
    assert set(by_node) == set(NODES)
    assert by_node["n2"]["state"] == "unreachable" and by_node["n4"]["state"] == "fetching"
    assert by_node["n1"]["state"] == "ready" and status["state"] == "Filling"
