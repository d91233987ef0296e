"""A pass sends the renewals it repeats together at its start (dsagent.controller.agents.PassCalls,
dsagent.controller.warmup.renewals): with a node's round trip per call, the Datasets reconciled
one after another no longer wait it out in turn, and the status is what asking in turn made."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from dsagent.controller.agents import PassCalls
from dsagent.controller.striping import share_renewals
from dsagent.controller.warmup import renewals, replica_task_id, warm_task_id
from tests.clock import Clock
from tests.dsagent.controller.test_controller import agent_pod, controller, inventory
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node

ROUND_TRIP = 0.03


class Agents:
    """Agents answering each call one round trip later, counting the calls in flight."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str, Any, str]] = []
        self.in_flight = self.most = 0
        self._lock = threading.Lock()

    @property
    def calls(self) -> list[tuple[str, str, str, str]]:
        """Each request as (node, method, path, acting-for)."""
        return [(node, method, path, who) for node, method, path, _, who in self.requests]

    def puts(self) -> list[tuple[str, str]]:
        """Each PUT as (node, its body as JSON), sorted."""
        return sorted((r[0], json.dumps(r[3], sort_keys=True)) for r in self.requests if r[1] == "PUT")

    def clear(self) -> None:
        self.requests.clear()
        self.most = 0

    def __call__(self, node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((node, method, path, body, who))
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        time.sleep(ROUND_TRIP)
        with self._lock:
            self.in_flight -= 1
        done = 100 if node.endswith("1") else 40  # each node its own answer
        return 200, {
            "datasets": [{"state": "ready" if done == 100 else "fetching", "bytesDone": done, "sizeBytes": 100}]
        }


def _settled_pass(
    apiserver: FakeApiServer, ctl: Any, agents: Agents, field: str, names: list[str]
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, str]]]:
    """A first pass, which chooses the nodes (asked Dataset by Dataset), then a settled one:
    each Dataset's ``status.<field>`` after each and the first pass's PUTs
    (:meth:`Agents.puts`); ``agents`` then holds the second pass's calls alone."""

    def statuses() -> dict[str, Any]:
        return {name: apiserver.get("datasets", name, "ml")["status"][field] for name in names}

    ctl.reconcile_all()
    first, asked_first = statuses(), agents.puts()
    agents.clear()
    ctl.reconcile_all()
    return first, statuses(), asked_first


def _nodes(apiserver: FakeApiServer, free: int) -> None:
    """Four agent nodes, each with ``free`` bytes of cache."""
    for i in range(4):
        node = f"n{i}"
        apiserver.create(make_node(node, annotations={"dsagent.io/inventory": inventory(node, {}, free=free)}))
        apiserver.create(agent_pod(node))


def _cluster(apiserver: FakeApiServer, datasets: int) -> None:
    _nodes(apiserver, 50 << 30)
    for i in range(datasets):
        ds = make_dataset(f"d{i}", namespace="ml")
        ds["spec"]["warm"] = {"nodes": 2}
        apiserver.create(ds)


def test_a_settled_pass_sends_its_renewals_together_and_reports_what_each_node_said(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    _cluster(apiserver, 12)
    agents = Agents()
    ctl = controller(api_client, Clock(), agent_call=agents)
    first, again, _ = _settled_pass(apiserver, ctl, agents, "warm", [f"d{i}" for i in range(12)])
    puts = [c for c in agents.calls if c[1] == "PUT"]
    assert len(puts) == 24 and len(set(puts)) == 24  # each Dataset's two nodes, once each
    assert agents.most > 2  # several Datasets' nodes at once: not one Dataset's round trip after another
    assert again == first  # the same nodes, states and bytes as asking in turn


def test_a_call_the_pass_makes_differently_goes_to_the_agent() -> None:
    agents = Agents()
    calls = PassCalls(agents)
    calls.send([("n1", "PUT", "/v1/tasks/t", {"datasets": [1]}, "ml/a")])
    assert len(agents.calls) == 1
    assert calls("n1", "PUT", "/v1/tasks/t", {"datasets": [1]}, "ml/a") == agents("n1", "GET", "", None, "")
    assert len(agents.calls) == 2  # the answer sent first, handed over: no second request (one GET above)
    calls("n1", "PUT", "/v1/tasks/t", {"datasets": [1]}, "ml/a")  # the same request again: asked
    calls("n1", "PUT", "/v1/tasks/t", {"datasets": [2]}, "ml/a")  # another body: asked
    calls("n1", "PUT", "/v1/tasks/t", {"datasets": [1]}, "ml/b")  # for another Dataset: asked
    assert len(agents.calls) == 5


def test_renewals_are_the_kept_nodes_of_fields_still_there_on_agent_nodes_only() -> None:
    now = 1_800_000_000.0
    warm = make_dataset("a", namespace="ml")
    warm["spec"]["warm"] = {"nodes": 2}
    warm["status"] = {"warm": {"nodes": [{"node": "n1"}, {"node": "gone"}, "junk"]}}
    later = make_dataset("b", namespace="ml")
    later["spec"]["warm"] = {"nodes": 1, "startTime": "2099-01-01T00:00:00Z"}  # waits: its pass releases
    later["status"] = {"warm": {"nodes": [{"node": "n1"}]}}
    dropped = make_dataset("c", namespace="ml")  # spec.replicas removed: its pass releases
    dropped["status"] = {"replicas": {"nodes": [{"node": "n2"}]}}
    copies = make_dataset("d", namespace="ml")
    copies["spec"]["replicas"] = 2
    copies["status"] = {"replicas": {"nodes": [{"node": "n2"}, {"node": "n1"}]}, "warm": {"nodes": [{"node": "n3"}]}}
    out = renewals([warm, later, dropped, copies, {"metadata": "junk"}], {"n1", "n2", "n3"}, now)
    assert [(node, path, who) for node, _, path, _, who in out] == [
        ("n1", f"/v1/tasks/{warm_task_id('ml', 'a')}", "ml/a"),
        ("n2", f"/v1/tasks/{replica_task_id('ml', 'd')}", "ml/d"),
        ("n1", f"/v1/tasks/{replica_task_id('ml', 'd')}", "ml/d"),
    ]
    assert all(method == "PUT" and body["datasets"][0]["name"] in ("a", "d") for _, method, _, body, _ in out)


class StripeAgents(Agents):
    """Agents holding every share they are asked for, one round trip later."""

    def __call__(self, node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any]:
        super().__call__(node, method, path, body, who)
        if method == "PUT" and path.startswith("/v1/stripes/"):
            return 200, {"complete": True, "bytesHeld": 10 << 30, "bytesOwned": 10 << 30}
        return 200, {}


def _striped(apiserver: FakeApiServer, datasets: int) -> None:
    _nodes(apiserver, 90 << 30)
    for i in range(datasets):
        ds = make_dataset(
            f"s{i}", namespace="ml", bundles="s3://store/packs", status={"digest": "b" * 32, "bytes": 150 << 30}
        )
        ds["spec"]["stripe"] = "auto"
        apiserver.create(ds)


def test_a_settled_pass_renews_its_stripe_groups_together_with_the_same_requests(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    _striped(apiserver, 8)
    agents = StripeAgents()
    ctl = controller(api_client, Clock(), agent_call=agents)
    first, again, asked_first = _settled_pass(apiserver, ctl, agents, "stripe", [f"s{i}" for i in range(8)])
    puts = [c for c in agents.calls if c[1] == "PUT"]
    assert len(puts) == len(set(puts)) == sum(first[f"s{i}"]["members"] for i in range(8))  # each member, once
    assert agents.most > 4  # several Datasets' members at once: not one group's round trip after another
    assert agents.puts() == asked_first  # the very requests a pass asking in turn sends
    assert again == first


def test_share_renewals_are_the_holding_members_of_settled_groups_only() -> None:
    agent_urls = {n: f"http://{n}:7420" for n in ("n1", "n2", "n3")}

    def striped(name: str, nodes: list[Any], **stripe: Any) -> dict[str, Any]:
        ds = make_dataset(name, namespace="ml", bundles="s3://store/packs", status={"digest": "b" * 32, "bytes": 100})
        ds["spec"]["stripe"] = "auto"
        ds["status"]["stripe"] = {"nodes": nodes, **stripe}
        return ds

    settled = striped(
        "a",
        [
            {"node": "n1", "state": "ready", "holding": "whole"},
            {"node": "n2", "state": "failed"},  # refused: asking again could make room for nothing
            {"node": "n3", "state": "onDemand", "share": False},
        ],
    )
    draining = striped("b", [{"node": "n1", "state": "ready"}], drain={"state": "Moving"})
    gone = striped("c", [{"node": "n1", "state": "ready"}, {"node": "n9", "state": "ready"}])  # n9: no agent
    off = striped("d", [{"node": "n1", "state": "ready"}])
    off["spec"].pop("stripe")  # its pass releases the shares
    out = share_renewals([settled, draining, gone, off, {"metadata": "junk"}], {}, agent_urls)
    assert [(node, method, path, who) for node, method, path, _, who in out] == [
        ("n1", "PUT", "/v1/stripes/a", "ml/a"),
        ("n3", "PUT", "/v1/stripes/a", "ml/a"),
    ]
    whole, shareless = out[0][3], out[1][3]
    assert whole["members"] == ["n1", "n2", "n3"] and whole["whole"] is True and whole["noShare"] == ["n3"]
    assert "whole" not in shareless and whole["peers"] == {n: agent_urls[n] for n in ("n1", "n2", "n3")}
