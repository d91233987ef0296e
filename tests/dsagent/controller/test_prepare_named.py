"""Next-job preparation as a default install runs it (``auto``, docs/design.md#next-job-preparation):
a running pod names the job that follows it on its node (``dsagent.io/next-job``), its
node's agent says so on the Node (``dsagent.io/follow-ups``), and the Dataset controller,
with its default settings, lists that namespace's pods only, prepares the follower's data on
that node's real agent (``dsagent serve`` over TCP) in phase 2 once the running job reports
fewer sub-tasks left than the preset count, and nothing for a pod no one names. When no pod
names a follower any more, the controller lists no pods and releases what it prepared."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.prepared import prepare_task_id
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsagent.errors import NotFound
from dsplatform.published import FOLLOW_UPS
from tests.clock import Clock
from tests.dsagent.controller.test_controller import NS, agent_pod, inventory, write_source
from tests.dsagent.controller.test_next_job_sources import owned
from tests.dsagent.controller.test_prepare_flow import packed_datasets
from tools.support.fake_apiserver import FakeApiServer, make_node, make_pod
from tools.support.harness import ADMIN_TOKEN, AgentProcess

pytestmark = pytest.mark.slow


def every_pod_lists(apiserver: FakeApiServer) -> list[Any]:
    """The cluster-wide pod lists (the agents' watches of their own node's pods aside)."""
    return [r for r in apiserver.requests_matching("GET", "/api/v1/pods") if "fieldSelector" not in r.query]


def test_a_default_controller_prepares_the_follower_a_running_pod_names_and_nothing_else(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    speech = write_source(tmp_path / "nfs" / "speech", files=4)
    vision = write_source(tmp_path / "nfs" / "vision", files=3)
    agent = AgentProcess(tmp_path / "agent", tcp=True, local_sources=(tmp_path / "nfs",)).start()
    clock = Clock()
    try:
        assert agent.port is not None
        annotations = {"dsagent.io/inventory": inventory("gpu-1", {}), "dsagent.io/free-gpus": "", FOLLOW_UPS: "ml"}
        apiserver.create(make_node("gpu-1", annotations=annotations))
        apiserver.create(agent_pod("gpu-1"))
        current = make_pod("train-a-0", namespace="ml", node_name="gpu-1", gpus=8, phase="Running")
        current["metadata"]["annotations"] = {"dsagent.io/next-job": "train-b", "dsagent.io/progress": "3/4"}
        apiserver.create(current)
        packed_datasets(apiserver, tmp_path / "nfs" / "store", {"speech": speech, "vision": vision})
        follower = owned(make_pod("train-b-0", namespace="ml", gpus=8), "Job", "train-b", "u-b")
        follower["metadata"]["annotations"] = {"dsagent.io/datasets": "speech"}
        follower_uid = apiserver.create(follower)["metadata"]["uid"]
        # a pod no running pod names: the default install predicts nothing for it
        apiserver.create(make_pod("w2", namespace="ml", gpus=8, annotations={"dsagent.io/datasets": "vision"}))
        settings = ControllerSettings(
            namespace=NS, identity="c-1", admin_token=ADMIN_TOKEN, agent_port=agent.port, copies_configmap=None
        )
        assert settings.prepare_enabled == "auto"  # the default, as the chart's
        ctl = DatasetController(api_client, settings, clock=clock)
        deadline = time.monotonic() + 60
        while True:
            ctl.reconcile_all()
            [entry] = apiserver.get("datasets", "speech", "ml")["status"]["preparation"]["pods"]
            if entry["state"] == "prepared" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # 1 of 4 sub-tasks left, fewer than the preset 2: phase 2 at once, on the naming pod's node
        assert (entry["pod"], entry["uid"], entry["node"], entry["phase"], entry["state"], entry["source"]) == (
            "ml/train-b-0",
            follower_uid,
            "gpu-1",
            2,
            "prepared",
            "annotation",
        )
        assert "preparation" not in apiserver.get("datasets", "vision", "ml")["status"]
        with agent.client() as client:
            assert client.get_task(prepare_task_id(follower_uid))["state"] == "ready"
            assert [p["task"] for p in client.preparations()] == [follower_uid]
        # the namespace's pods, never the cluster's
        assert apiserver.requests_matching("GET", "/api/v1/namespaces/ml/pods")
        assert not every_pod_lists(apiserver)
        # the running pod ends and its agent withdraws the annotation: the controller lists
        # no pod of ml any more, and releases the preparation
        apiserver.patch("nodes", "gpu-1", {"metadata": {"annotations": {FOLLOW_UPS: None}}})
        listed = len(apiserver.requests_matching("GET", "/api/v1/namespaces/ml/pods"))
        ctl.reconcile_all()
        assert apiserver.get("datasets", "speech", "ml")["status"]["preparation"]["pods"] == []
        with agent.client() as client:
            with pytest.raises(NotFound):
                client.get_task(prepare_task_id(follower_uid))
        ctl.reconcile_all()  # and from then on reads no pod for it
        assert len(apiserver.requests_matching("GET", "/api/v1/namespaces/ml/pods")) == listed
        assert not every_pod_lists(apiserver)
    finally:
        agent.stop()
