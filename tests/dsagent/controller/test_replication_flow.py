"""Replication of hot data end to end (docs/design.md#replication): the Dataset controller on
the fake API server sets a target of copies from the pending and recent pods naming a
Dataset with ``spec.replicas: auto``, has a real agent (``dsagent serve`` over TCP) hold one,
reports target and actual copies in the status, and releases copies as the demand falls."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsagent.errors import NotFound
from tests.clock import Clock
from tests.dsagent.controller.test_controller import NS, agent_pod, inventory, write_source
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node, make_pod
from tools.support.harness import ADMIN_TOKEN, AgentProcess

pytestmark = pytest.mark.slow

TASK = "replica.ml.speech"


def test_auto_replicas_follow_the_demand_on_nodes_with_room_and_free_gpus(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    source = write_source(tmp_path / "nfs" / "speech", files=4)
    agent = AgentProcess(tmp_path / "agent", tcp=True, local_sources=(tmp_path / "nfs",)).start()
    try:
        assert agent.port is not None
        for name, gpus in (("gpu-1", "0,1"), ("gpu-2", ""), ("gpu-3", "5")):
            annotations = {"dsagent.io/inventory": inventory(name, {}, free=10 << 30), "dsagent.io/free-gpus": gpus}
            apiserver.create(make_node(name, annotations=annotations))
            apiserver.create(agent_pod(name))
        ds = make_dataset("speech", namespace="ml", source=str(source))
        ds["spec"]["replicas"] = "auto"
        apiserver.create(ds)
        for pod in ("p1", "p2"):
            apiserver.create(make_pod(pod, namespace="ml", gpus=1, annotations={"dsagent.io/datasets": "speech"}))
        settings = ControllerSettings(namespace=NS, identity="c-1", admin_token=ADMIN_TOKEN, agent_port=agent.port)
        ctl = DatasetController(api_client, settings, clock=Clock())
        real = ctl.agent_call
        others: list[tuple[str, str, str]] = []

        def route(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any] | None:
            if node == "gpu-1":
                return real(node, method, path, body, acting_for)
            others.append((node, method, path))
            return 200, {"datasets": [{"state": "fetching", "bytesDone": 0, "sizeBytes": 1}]}

        ctl.agent_call = route
        deadline = time.monotonic() + 60
        while True:
            ctl.reconcile_all()
            replicas = apiserver.get("datasets", "speech", "ml")["status"]["replicas"]
            states = {n["node"]: n["state"] for n in replicas["nodes"]}
            if states.get("gpu-1") == "ready" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # two pending pods: two copies, on the nodes with free GPUs (gpu-2 has none)
        assert (replicas["mode"], replicas["demand"], replicas["target"], replicas["desiredNodes"]) == ("auto", 2, 2, 2)
        assert states == {"gpu-1": "ready", "gpu-3": "fetching"} and replicas["actual"] == 0
        assert ("gpu-3", "PUT", f"/v1/tasks/{TASK}") in others
        # the copy on gpu-1 shows in its inventory: actual copies 1
        with agent.client() as client:
            [version] = client.datasets()["datasets"]
        held = {"speech": {"digest": version["digest"], "state": "ready"}}
        apiserver.patch(
            "nodes", "gpu-1", {"metadata": {"annotations": {"dsagent.io/inventory": inventory("gpu-1", held)}}}
        )
        apiserver.patch(
            "datasets", "speech", {"status": {"digest": version["digest"]}}, namespace="ml", subresource="status"
        )
        # demand falls to one: the holder stays, gpu-3 is released
        apiserver.delete("pods", "p2", "ml")
        others.clear()
        ctl.reconcile_all()
        replicas = apiserver.get("datasets", "speech", "ml")["status"]["replicas"]
        assert (replicas["demand"], replicas["target"], replicas["actual"]) == (1, 1, 1)
        assert [n["node"] for n in replicas["nodes"]] == ["gpu-1"]
        assert ("gpu-3", "DELETE", f"/v1/tasks/{TASK}") in others
        # no demand: no copy held by replication; the data stays, evictable
        apiserver.delete("pods", "p1", "ml")
        ctl.reconcile_all()
        replicas = apiserver.get("datasets", "speech", "ml")["status"]["replicas"]
        assert (replicas["target"], replicas["nodes"]) == (0, [])
        with agent.client() as client:
            with pytest.raises(NotFound):
                client.get_task(TASK)
            assert [d["name"] for d in client.datasets()["datasets"]] == ["speech"]
        # a fixed number ignores the demand; removing spec.replicas switches it off
        apiserver.patch("datasets", "speech", {"spec": {"replicas": 1}}, namespace="ml")
        ctl.reconcile_all()
        assert apiserver.get("datasets", "speech", "ml")["status"]["replicas"]["target"] == 1
        apiserver.patch("datasets", "speech", {"spec": {"replicas": None}}, namespace="ml")
        ctl.reconcile_all()
        assert apiserver.get("datasets", "speech", "ml")["status"]["replicas"]["mode"] == "off"
        assert json.dumps(apiserver.get("datasets", "speech", "ml")["status"]["replicas"]["nodes"]) == "[]"
    finally:
        agent.stop()
