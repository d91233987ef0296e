"""Next-job preparation end to end (docs/design.md#next-job-preparation): the Dataset controller
on the fake API server predicts where waiting pods start from the running pods' declared
durations, puts each on a real agent (``dsagent serve`` over TCP, admin token) as
``/v1/preparations/<uid>``: phase 1 reserves space there, phase 2 fetches; the fetched copy
survives an agent restart, and the pod's own request takes the preparation over."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.prepared import prepare_task_id
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.podfacts import expected_end, waiting_pods
from dsagent.controller.reconcile import DatasetController
from dsagent.errors import NotFound
from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import read_manifest
from dsagent.policy.preparation import Thresholds
from dsplatform.kubetime import format_time
from tests.clock import Clock
from tests.dsagent.controller.test_controller import NS, agent_pod, inventory, write_source
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node, make_pod
from tools.support.harness import ADMIN_TOKEN, AgentProcess

pytestmark = pytest.mark.slow

DIGEST = "a" * 32
PRESETS = Thresholds(window_s=1800, fetch_lead_s=600, reserve_fraction=0.5, fill_fraction=0.9)


def iso(t: float) -> str:
    return format_time(t)


def running_pod(name: str, started: float, duration: str, gpus: int = 4) -> dict[str, Any]:
    pod = make_pod(name, namespace="ml", node_name="gpu-1", gpus=gpus, phase="Running")
    pod["metadata"]["annotations"] = {"dsagent.io/duration": duration}
    pod["status"]["startTime"] = iso(started)
    return pod


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def packed_datasets(apiserver: FakeApiServer, store: Path, sources: dict[str, Path]) -> None:
    """Each source packed into ``store`` and its Dataset created in ``ml``, with its packed status."""
    for name, source in sources.items():
        pack(source, store, name=name, max_files=2)
        manifest = read_manifest(str(store), name)
        status = {"digest": manifest.digest, "bytes": manifest.total_bytes}
        apiserver.create(make_dataset(name, namespace="ml", source=str(source), bundles=str(store), status=status))


def ctl_for(api_client: Any, clock: Clock, port: int) -> DatasetController:
    settings = ControllerSettings(
        namespace=NS,
        identity="c-1",
        admin_token=ADMIN_TOKEN,
        agent_port=port,
        prepare=PRESETS,
        copies_configmap=None,
        prepare_enabled="on",
    )
    return DatasetController(api_client, settings, clock=clock)


def test_the_controller_prepares_the_next_pods_data_on_its_node_and_releases_it_at_bind(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    speech = write_source(tmp_path / "nfs" / "speech", files=4)
    vision = write_source(tmp_path / "nfs" / "vision", files=3)
    root = tmp_path / "agent"
    agent = AgentProcess(root, tcp=True, local_sources=(tmp_path / "nfs",)).start()
    clock = Clock()
    now = clock.now
    try:
        assert agent.port is not None
        node = make_node(
            "gpu-1", annotations={"dsagent.io/inventory": inventory("gpu-1", {}), "dsagent.io/free-gpus": ""}
        )
        apiserver.create(node)
        apiserver.create(agent_pod("gpu-1"))
        # two running pods of 4 GPUs: one ends in 500 s, the other in 1,500 s
        apiserver.create(running_pod("ending-soon", now - 1000, "1500s"))
        apiserver.create(running_pod("ending-later", now - 100, "1600s"))
        store = tmp_path / "nfs" / "store"
        packed_datasets(apiserver, store, {"speech": speech, "vision": vision})
        waiting = {}
        for name, dataset in (("w1", "speech"), ("w2", "vision")):
            pod = make_pod(name, namespace="ml", gpus=4, annotations={"dsagent.io/datasets": dataset})
            waiting[name] = apiserver.create(pod)["metadata"]["uid"]
        ctl = ctl_for(api_client, clock, agent.port)
        deadline = time.monotonic() + 60
        while True:
            ctl.reconcile_all()
            speech_status = apiserver.get("datasets", "speech", "ml")["status"]["preparation"]
            if speech_status["pods"][0]["state"] == "prepared" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        [entry] = speech_status["pods"]
        assert (entry["pod"], entry["uid"], entry["node"], entry["phase"], entry["state"]) == (
            "ml/w1",
            waiting["w1"],
            "gpu-1",
            2,
            "prepared",
        )
        assert entry["source"] == "prediction"  # no queue system, no annotation: the replay
        # w2 starts in 1,500 s: beyond the 600 s lead, so phase 1: space reserved on the node, no data
        [reserved] = apiserver.get("datasets", "vision", "ml")["status"]["preparation"]["pods"]
        assert (reserved["uid"], reserved["phase"], reserved["state"]) == (waiting["w2"], 1, "reserved")
        with agent.client() as client:
            assert client.get_task(prepare_task_id(waiting["w1"]))["state"] == "ready"
            assert [d["name"] for d in client.datasets()["datasets"]] == ["speech"]
            on_node = {p["task"]: p for p in client.preparations()}
            assert on_node[waiting["w2"]]["reservedBytes"] > 0 and on_node[waiting["w2"]]["phase"] == 1
        notes = [e.get("note", "") for e in apiserver.list("events") if e.get("reason") == "Preparing"]
        assert any("speech prepared on node gpu-1: phase 2" in n and "predicted" in n for n in notes)
        # the agent restarts: the task and its data survive, the next pass finds them ready
        agent.stop()
        agent = AgentProcess(root, tcp=True, port=agent.port, local_sources=(tmp_path / "nfs",)).start()
        ctl.reconcile_all()
        assert apiserver.get("datasets", "speech", "ml")["status"]["preparation"]["pods"][0]["state"] == "prepared"
        # w1 is bound to the node; its own request (sidecar, init-container or CSI publish
        # send the same) finds the prepared copy: a hit, no second fetch
        apiserver.patch("pods", "w1", {"spec": {"nodeName": "gpu-1"}}, namespace="ml")
        with agent.client() as client:
            hits_before = _counter(client.metrics(), "dsplatform_agent_cache_hits_total")
            own = client.submit_task(
                waiting["w1"], [{"name": "speech", "source": str(speech), "bundles": str(store)}], wait=30
            )
            assert own["datasets"][0]["state"] == "ready"
            assert _counter(client.metrics(), "dsplatform_agent_cache_hits_total") == hits_before + 1
            assert _counter(client.metrics(), "dsplatform_agent_cache_misses_total") == 0  # no fetch since the restart
        # ... and the preparation is handed over (the agent) and dropped from the plan (the controller)
        ctl.reconcile_all()
        assert apiserver.get("datasets", "speech", "ml")["status"]["preparation"] == {
            "reservedBytes": 0,
            "fetchingBytes": 0,
            "pods": [],
        }
        with agent.client() as client:
            with pytest.raises(NotFound):
                client.get_task(prepare_task_id(waiting["w1"]))
        assert ctl.metrics.preparation_releases._value.get() == 1
    finally:
        agent.stop()


def test_expected_ends_come_from_the_declared_duration_or_the_time_model() -> None:
    started = 1_800_000_000.0
    pod = running_pod("p", started, "2h")
    assert expected_end(pod) == pytest.approx(started + 7200)
    pod["metadata"]["annotations"] = {
        "dsagent.io/steps": "8000",
        "dsagent.io/step-seconds": "0.5",
        "dsagent.io/gradient-bytes": "1",
    }
    # 8,000 one-GPU steps on 4 GPUs: 2,000 steps of 0.5 s (+ a negligible 1-byte allreduce)
    assert expected_end(pod) == pytest.approx(started + 1000, rel=1e-3)
    for hostile in ({"dsagent.io/duration": "forever"}, {"dsagent.io/duration": "-5s"}, {}):
        pod["metadata"]["annotations"] = hostile
        assert expected_end(pod) is None


def test_waiting_pods_need_packed_datasets_and_gpus_and_queue_by_creation() -> None:
    datasets = {
        ("ml", "packed"): make_dataset("packed", namespace="ml", status={"digest": DIGEST, "bytes": 10}),
        ("ml", "unpacked"): make_dataset("unpacked", namespace="ml"),
    }
    pods = []
    for name, annotation, gpus, created in (
        ("late", "packed", 1, "2027-01-01T00:00:02Z"),
        ("early", "packed", 2, "2027-01-01T00:00:01Z"),
        ("no-gpus", "packed", 0, "2027-01-01T00:00:00Z"),
        ("not-packed", "unpacked", 1, "2027-01-01T00:00:00Z"),
        ("garbage", "[{", 1, "2027-01-01T00:00:00Z"),
    ):
        pod = make_pod(name, namespace="ml", gpus=gpus, annotations={"dsagent.io/datasets": annotation})
        pod["metadata"].update(uid=f"uid-{name}", creationTimestamp=created)
        pods.append(pod)
    found = waiting_pods(pods, datasets)
    assert [(w.key, w.gpus, [x.name for x in w.datasets]) for w, _ in found] == [
        ("uid-early", 2, ["packed"]),
        ("uid-late", 1, ["packed"]),
    ]


def test_free_gpus_count_a_node_with_only_class_resources_by_the_platform_rule() -> None:
    # prepare's own reader saw only nvidia.com/gpu, read with int(): a node advertising its
    # GPUs as RoCE classes (and gpu-all) had 0 free GPUs, so it was never prepared for
    from dsagent.controller.podfacts import free_gpus

    node = {
        "metadata": {"name": "n1"},
        "status": {
            "allocatable": {
                "dsagent.io/gpu-roce0": "4",
                "dsagent.io/gpu-roce1": "4",
                "dsagent.io/gpu-roce0-1": "8",
                "dsagent.io/gpu-all": "8",
            }
        },
    }
    pod = {
        "metadata": {"name": "p", "namespace": "d", "uid": "u"},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"dsagent.io/gpu-roce0": "2"}}}]},
        "status": {"phase": "Running"},
    }
    assert free_gpus([node], [pod]) == {"n1": 6}
    node["status"]["allocatable"] = {"nvidia.com/gpu": "4000m"}  # a quantity, not an int() string
    assert free_gpus([node], []) == {"n1": 4}
