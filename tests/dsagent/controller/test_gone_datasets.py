"""A deleted Dataset's pins go within one pass: the Dataset controller against the fake API
server, with agents that hold tasks and preparations for Datasets that exist and for one
that was deleted, and with a real ``dsagent serve`` (docs/operator-guide/tenancy.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.orphans import RESYNC_PASSES
from dsagent.controller.reconcile import DatasetController
from dsagent.controller.warmup import warm_task_id
from dsagent.format.bundles.bundle import pack
from tests.clock import Clock
from tests.dsagent.controller.test_controller_tenants import NOW, agent_pod, cluster, dataset
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node
from tools.support.harness import ADMIN_TOKEN, AgentProcess

NS = "dsplatform"


def task(task_id: str, namespace: str | None, *names: str) -> dict[str, Any]:
    return {"task": task_id, "state": "ready", "namespace": namespace, "datasets": [{"name": n} for n in names]}


class HoldingAgent:
    """Every node's agent, holding what the controller (and a pod, and an operator) asked of it
    before team-a's Dataset was deleted; records each request."""

    TASKS = [
        task("warm.team-a.imagenet", "team-a", "imagenet"),
        task("replica.team-a.imagenet", "team-a", "imagenet"),
        task("prepare.0b5c9a3e-team-a-pod", "team-a", "imagenet"),  # a preparation's bulk fetch
        task("warm.team-b.imagenet", "team-b", "imagenet"),  # the same name in another namespace
        task("prepare.7d1f0c2a-team-b-pod", "team-b", "imagenet"),
        task("3f2a8c1e-5d6b-4e7f-9a0b-1c2d3e4f5a6b", None, "imagenet"),  # a pod's own task
        task("by-hand", None, "imagenet"),  # an operator's, naming no Dataset
        task("warm.not a namespace", "team-a", "imagenet"),  # another party's odd id
    ]
    PREPARATIONS = [
        {"task": "0b5c9a3e-team-a-pod", "namespace": "team-a", "requested": ["imagenet"]},
        {"task": "e4d3c2b1-team-a-pod", "namespace": "team-a", "requested": ["imagenet"]},  # phase 1
        {"task": "7d1f0c2a-team-b-pod", "namespace": "team-b", "requested": ["imagenet"]},
        {"task": "hand-made", "namespace": None, "requested": ["imagenet"]},
        "not an object",
    ]

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str]] = []

    def __call__(self, node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
        self.calls.append((node, method, path, acting_for))
        if (method, path) == ("GET", "/v1/tasks"):
            return 200, {"tasks": self.TASKS}
        if (method, path) == ("GET", "/v1/preparations"):
            return 200, {"preparations": self.PREPARATIONS}
        if method == "PUT":
            return 200, {"datasets": [{"state": "ready", "bytesDone": 1, "sizeBytes": 1}]}
        return 200, {"released": True}

    def deleted(self) -> set[tuple[str, str, str]]:
        return {(node, path, who) for node, method, path, who in self.calls if method == "DELETE"}


def test_what_agents_hold_for_a_deleted_dataset_is_released_within_one_pass(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    nodes = ["gpu-00", "gpu-01"]
    cluster(apiserver, nodes)
    apiserver.create(dataset("team-b"))  # team-b/imagenet exists; team-a/imagenet was deleted
    agent = HoldingAgent()
    settings = ControllerSettings(namespace=NS, identity="c-1", pack_image="registry.example/dsp:1")
    ctl = DatasetController(api_client, settings, clock=Clock(NOW), agent_call=agent)
    ctl.reconcile_all()
    who = "team-a/imagenet"
    assert agent.deleted() == {
        (node, path, who)
        for node in nodes
        for path in (
            "/v1/tasks/warm.team-a.imagenet",
            "/v1/tasks/replica.team-a.imagenet",
            "/v1/preparations/0b5c9a3e-team-a-pod",  # releases its prepare.<uid> task too
            "/v1/preparations/e4d3c2b1-team-a-pod",
        )
    }
    assert b'gone_dataset_releases_total{kind="warm"} 2.0' in ctl.metrics.render()
    # team-a's Dataset is back: nothing of it is released any more
    apiserver.create(dataset("team-a"))
    agent.calls.clear()
    ctl.reconcile_all()
    assert agent.deleted() == set()


@pytest.mark.slow  # starts an agent process
def test_a_deleted_datasets_warm_up_and_preparation_stop_pinning_on_a_real_agent(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    source = tmp_path / "nfs" / "speech"
    source.mkdir(parents=True)
    for i in range(3):
        (source / f"f{i}.bin").write_bytes(bytes([i]) * 5000)
    store = tmp_path / "nfs" / "store"
    pack(source, store, name="speech")
    agent = AgentProcess(tmp_path / "agent", tcp=True, local_sources=(tmp_path / "nfs",)).start()
    try:
        assert agent.port is not None
        apiserver.create(make_node("gpu-1"))
        apiserver.create(agent_pod("gpu-1"))
        ds = make_dataset("speech", namespace="ml", source=str(source), bundles=str(store))
        ds["spec"]["warm"] = {"nodes": 1}
        apiserver.create(ds)
        settings = ControllerSettings(
            namespace=NS,
            identity="c-1",
            pack_image="registry.example/dsp:1",
            admin_token=ADMIN_TOKEN,
            agent_port=agent.port,
        )
        ctl = DatasetController(api_client, settings, clock=Clock(NOW))
        deadline = time.monotonic() + 60
        ctl.reconcile_all()
        while apiserver.get("datasets", "speech", "ml")["status"]["warm"]["state"] != "Ready":
            assert time.monotonic() < deadline, "the warm-up never got ready"
            time.sleep(0.1)
            ctl.reconcile_all()
        headers = {"authorization": f"Bearer {ADMIN_TOKEN}", "X-Dsagent-For": "ml/speech"}
        with httpx.Client(base_url=agent.url, headers=headers, timeout=60) as op:
            # a next-job preparation for a pod of the Dataset, fetched (phase 2), as the controller asks
            body = {"datasets": [{"name": "speech", "source": str(source), "bundles": str(store)}], "phase": 2}
            assert op.put("/v1/preparations/5e6f7a8b-pod", json=body).status_code == 200
            ids = {t["task"] for t in op.get("/v1/tasks").json()["tasks"]}
            assert ids == {warm_task_id("ml", "speech"), "prepare.5e6f7a8b-pod"}
            assert op.get("/v1/datasets/speech").json()["versions"][0]["inUse"] is True
            apiserver.delete("datasets", "speech", "ml")
            ctl.reconcile_all()  # one pass
            assert op.get("/v1/tasks").json()["tasks"] == []
            assert op.get("/v1/preparations").json()["preparations"] == []
            version = op.get("/v1/datasets/speech").json()["versions"][0]
            assert version["inUse"] is False  # evictable now, not in 6 h
            evicted = op.post("/v1/evict", json={"mode": "names", "names": ["speech"]})  # no longer 409 in use
            assert evicted.status_code == 200 and [v["name"] for v in evicted.json()["evicted"]] == ["speech"]
    finally:
        agent.stop()
    audit = [line for line in agent.log.read_text().splitlines() if "audit action=release" in line]
    assert any("for=ml/speech task=warm.ml.speech" in line for line in audit), audit


def test_agents_are_asked_again_only_when_a_dataset_went_or_in_turn(apiserver: FakeApiServer, api_client: Any) -> None:
    """Every agent is asked on the first pass and on the pass after a Dataset went; between,
    only new agents, those whose answer failed, and one in RESYNC_PASSES in turn."""
    nodes = [f"gpu-{i:02d}" for i in range(40)]
    cluster(apiserver, nodes)
    for namespace in ("team-a", "team-b"):
        apiserver.create(dataset(namespace))
    agent = HoldingAgent()
    settings = ControllerSettings(namespace=NS, identity="c-1", pack_image="registry.example/dsp:1")
    ctl = DatasetController(api_client, settings, clock=Clock(NOW), agent_call=agent)

    def asked() -> set[str]:
        found = {node for node, method, path, _ in agent.calls if (method, path) == ("GET", "/v1/tasks")}
        agent.calls.clear()
        return found

    ctl.reconcile_all()
    assert asked() == set(nodes)  # the first pass: what went before is unknown
    turns = []
    for _ in range(RESYNC_PASSES):
        ctl.reconcile_all()
        turns.append(asked())
    assert all(len(t) < len(nodes) / 4 for t in turns)  # nothing went: a few in turn
    assert set().union(*turns) == set(nodes)  # each agent within RESYNC_PASSES passes
    apiserver.create(agent_pod("gpu-40"))  # a new agent: asked on its first pass
    apiserver.create(make_node("gpu-40"))
    ctl.reconcile_all()
    assert "gpu-40" in asked()
    apiserver.delete("datasets", "imagenet", "team-a")  # a Dataset went: every agent, at once
    ctl.reconcile_all()
    released = {node for node, path, who in agent.deleted() if path == "/v1/tasks/warm.team-a.imagenet"}
    assert asked() == set(nodes) | {"gpu-40"} == released


def test_an_agent_that_could_not_be_read_is_asked_again_and_a_new_leader_asks_all(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    nodes = ["gpu-00", "gpu-01", "gpu-02"]
    cluster(apiserver, nodes)
    apiserver.create(dataset("team-b"))
    down = {"gpu-01"}
    holding = HoldingAgent()
    seen: list[tuple[str, str, str]] = []

    def agent(node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any] | None:
        seen.append((node, method, path))
        return None if node in down else holding(node, method, path, body, who)

    settings = ControllerSettings(namespace=NS, identity="c-1", pack_image="registry.example/dsp:1")
    ctl = DatasetController(api_client, settings, clock=Clock(NOW), agent_call=agent)
    ctl.reconcile_all()
    assert {n for n, _, p in holding.deleted()} == {"gpu-00", "gpu-02"}  # team-a's pins: released where read
    down.clear()
    holding.calls.clear()
    ctl.reconcile_all()  # no Dataset went since: the agent that did not answer is asked again
    assert {n for n, _, _ in holding.deleted()} == {"gpu-01"}
    sweep = ctl.gone_sweep
    assert sweep.due(nodes, {("team-b", "imagenet")}) <= set(nodes) and len(sweep.due(nodes, set())) == 3
    sweep.forget()  # as when another replica led meanwhile
    assert sweep.due(nodes, {("team-b", "imagenet")}) == set(nodes)


def test_a_sweep_asks_agents_several_at_a_time_and_answers_as_one_after_another() -> None:
    """A pass that asks every agent (a Dataset went) makes two requests of each: one agent
    after another, 15,000 of them took minutes. They are asked AGENTS_AT_ONCE at a time; the
    releases, and the agents to ask again, are those a sequential sweep finds."""
    import threading

    from dsagent.controller.agents import AGENTS_AT_ONCE
    from dsagent.controller.orphans import release_gone

    lock, busy, peak = threading.Lock(), [0], [0]
    nodes = [f"n{i:03d}" for i in range(3 * AGENTS_AT_ONCE)]

    def agent_call(node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any] | None:
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        try:
            time.sleep(0.01)
            index = int(node[1:])
            if index % 7 == 0:
                return None  # unreachable: asked again next pass
            if method == "GET" and path == "/v1/tasks":
                tasks = [{"task": "warm.ml.gone", "datasets": []}, {"task": "warm.ml.kept", "datasets": []}]
                return 200, {"tasks": tasks}
            if method == "GET":
                return 200, {"preparations": []}
            return (500, {}) if index % 5 == 0 else (200, {})  # a release refused: asked again
        finally:
            with lock:
                busy[0] -= 1

    unfinished: set[str] = set()
    released = release_gone(agent_call, reversed(nodes), {("ml", "kept")}, unfinished=unfinished)
    assert 1 < peak[0] <= AGENTS_AT_ONCE
    readable = [n for n in nodes if int(n[1:]) % 7]
    assert released == [(n, "/v1/tasks/warm.ml.gone") for n in readable]  # in node order, only the gone one
    assert unfinished == {n for n in nodes if int(n[1:]) % 7 == 0 or int(n[1:]) % 5 == 0}
