"""The Dataset controller against the fake API server (real wire format: Nodes, Pods,
Datasets with their status subresource, Jobs, Leases) and, for warm-up and cleanup, a
real ``dsagent serve`` over TCP with its admin token."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.leader import LeaseElector
from dsagent.controller.packing import listing_fingerprint
from dsagent.controller.reconcile import DatasetController
from dsagent.controller.warmup import warm_task_id
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node, make_nodecache, make_pod
from tools.support.harness import ADMIN_TOKEN, AgentProcess

NS = "dsplatform"
DIGEST = "a" * 32


def inventory(node: str, datasets: dict[str, Any], free: int = 10 << 30) -> str:
    return json.dumps({"version": 1, "node": node, "capacityBytes": 100 << 30, "freeBytes": free, "datasets": datasets})


def agent_pod(node: str, ip: str = "127.0.0.1") -> dict[str, Any]:
    pod = make_pod(
        f"agent-{node}", namespace=NS, node_name=node, phase="Running", labels={"app.kubernetes.io/component": "agent"}
    )
    pod["status"]["podIP"] = ip
    return pod


def controller(api_client: Any, clock: Clock, **kwargs: Any) -> DatasetController:
    settings = ControllerSettings(
        namespace=NS,
        identity=kwargs.pop("identity", "c-1"),
        pack_image="registry.example/dsp:1",
        admin_token=kwargs.pop("admin_token", None),
        agent_port=kwargs.pop("agent_port", 7420),
    )
    return DatasetController(api_client, settings, clock=clock, **kwargs)


def write_source(root: Path, files: int = 3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"f{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    return root


def test_ready_nodes_come_from_inventories_and_hostile_ones_are_skipped(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    apiserver.create(
        make_node(
            "gpu-1",
            annotations={
                "dsagent.io/inventory": inventory("gpu-1", {"imagenet": {"digest": DIGEST, "state": "ready"}})
            },
        )
    )
    apiserver.create(
        make_node(
            "gpu-2",
            annotations={
                "dsagent.io/inventory": inventory(
                    "gpu-2",
                    {
                        "imagenet": {
                            "digest": "b" * 32,
                            "state": "ready",
                            "versions": [{"digest": DIGEST, "state": "ready"}, {"digest": "b" * 32, "state": "ready"}],
                        }
                    },
                )
            },
        )
    )
    apiserver.create(
        make_node(
            "gpu-3",
            annotations={
                "dsagent.io/inventory": inventory("gpu-3", {"imagenet": {"digest": DIGEST, "state": "fetching"}})
            },
        )
    )
    apiserver.create(make_node("gpu-4", annotations={"dsagent.io/inventory": "{not json"}))
    apiserver.create(make_node("gpu-5", annotations={"dsagent.io/inventory": json.dumps({"datasets": ["imagenet"]})}))
    apiserver.create(make_dataset("imagenet", namespace="ml", status={"digest": DIGEST, "files": 1, "bytes": 1}))
    controller(api_client, Clock()).reconcile_all()
    status = apiserver.get("datasets", "imagenet", "ml")["status"]
    assert status["readyNodes"] == ["gpu-1", "gpu-2"] and status["readyNodeCount"] == 2
    assert status["digest"] == DIGEST  # the packer's fields stay
    patches = apiserver.requests_matching("PATCH", "/apis/dsagent.io/v1alpha1/namespaces/ml/datasets/imagenet/status")
    controller(api_client, Clock()).reconcile_all()
    assert len(
        apiserver.requests_matching("PATCH", "/apis/dsagent.io/v1alpha1/namespaces/ml/datasets/imagenet/status")
    ) == len(patches)  # nothing changed: no write


def test_inventories_come_from_nodecaches_else_from_the_node_annotations_of_older_agents(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """The rolling upgrade (docs/operator-guide/upgrade.md#nodecache): a node with a NodeCache is
    read from it (a leftover annotation is ignored); a node of an older agent from its annotation."""
    ready = {"imagenet": {"digest": DIGEST, "state": "ready"}}
    clock = Clock()
    stamp = "2027-01-15T08:00:00Z"  # the clock's time, near enough for the staleness bound
    new = apiserver.create(make_node("new", annotations={"dsagent.io/inventory": inventory("new", {})}))
    apiserver.create(
        make_nodecache("new", inventory=inventory("new", ready), published_at=stamp, node_uid=new["metadata"]["uid"])
    )
    apiserver.create(make_node("old", annotations={"dsagent.io/inventory": inventory("old", ready)}))
    apiserver.create(make_node("emptied", annotations={"dsagent.io/inventory": inventory("emptied", ready)}))
    apiserver.create(make_nodecache("emptied", published_at=stamp))  # a stopped agent's: no inventory
    apiserver.create(make_dataset("imagenet", namespace="ml", status={"digest": DIGEST, "files": 1, "bytes": 1}))
    controller(api_client, clock).reconcile_all()
    assert apiserver.get("datasets", "imagenet", "ml")["status"]["readyNodes"] == ["new", "old"]
    # both lists from the API server's watch cache, not a read from etcd at every pass
    for path in ("/api/v1/nodes", "/apis/dsagent.io/v1alpha1/nodecaches"):
        (listed,) = apiserver.requests_matching("GET", path)
        assert listed.query.get("resourceVersion") == "0"
    # and the pods: the agents' (by their selector) and, for a Dataset that counts its
    # readers (replicas), every pod (the pending pods' list is bounded by a limit, which the
    # watch cache does not honour)
    coco = make_dataset("coco", namespace="ml")
    coco["spec"]["replicas"] = 2
    apiserver.create(coco)
    controller(api_client, clock).reconcile_all()
    pod_lists = [
        r for r in apiserver.requests_matching("GET") if r.path.endswith("/pods") and "fieldSelector" not in r.query
    ]
    assert {r.path for r in pod_lists} >= {"/api/v1/pods", f"/api/v1/namespaces/{NS}/pods"}
    assert all(r.query.get("resourceVersion") == "0" for r in pod_lists), [(r.path, r.query) for r in pod_lists]
    apiserver.delete("nodes", "new")  # its NodeCache goes with it (the owner reference)
    assert apiserver.get("nodecaches", "new") is None


def test_auto_pack_creates_one_job_per_source_listing(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    source = write_source(tmp_path / "src")
    ds = make_dataset("coco", namespace="ml", source=str(source), bundles="s3://bundles/coco")
    ds["spec"]["pack"] = {"auto": True, "maxFiles": 1000, "level": 3}
    apiserver.create(ds)
    clock = Clock()
    ctl = controller(api_client, clock)
    ctl.reconcile_all()
    [job] = apiserver.list("jobs")
    pack = apiserver.get("datasets", "coco", "ml")["status"]["pack"]
    assert pack["state"] == "Running" and pack["job"] == job["metadata"]["name"] and job["metadata"]["namespace"] == NS
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["dsctl"] and container["image"] == "registry.example/dsp:1"
    assert container["args"] == [
        "pack",
        "--name",
        "coco",
        "--to",
        "s3://bundles/coco",
        "--publish",
        "ml",
        "--max-files",
        "1000",
        "--level",
        "3",
        "--",
        str(source),
    ]
    ctl.reconcile_all()
    ctl2 = controller(api_client, clock, identity="c-2")  # a new leader sees the same listing: no second Job
    ctl2.reconcile_all()
    assert len(apiserver.list("jobs")) == 1
    apiserver.patch(
        "jobs",
        job["metadata"]["name"],
        {"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}},
        namespace=NS,
        subresource="status",
    )
    ctl.reconcile_all()
    assert apiserver.get("datasets", "coco", "ml")["status"]["pack"]["state"] == "Succeeded"
    ctl.reconcile_all()
    assert len(apiserver.list("jobs")) == 1
    (source / "f1.bin").write_bytes(b"relabelled")  # a changed size: a new listing
    ctl.reconcile_all()
    jobs = apiserver.list("jobs")
    assert len(jobs) == 2
    assert apiserver.get("datasets", "coco", "ml")["status"]["pack"]["state"] == "Running"
    new = [j for j in jobs if j["metadata"]["name"] != job["metadata"]["name"]][0]
    apiserver.patch(
        "jobs",
        new["metadata"]["name"],
        {
            "status": {
                "failed": 3,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                    }
                ],
            }
        },
        namespace=NS,
        subresource="status",
    )
    ctl.reconcile_all()
    pack = apiserver.get("datasets", "coco", "ml")["status"]["pack"]
    assert pack["state"] == "Failed" and "backoff limit" in pack["message"]
    ctl.reconcile_all()
    assert len(apiserver.list("jobs")) == 2  # a failed listing is not retried until the source changes


def test_a_dataset_without_auto_pack_gets_no_job(apiserver: FakeApiServer, api_client: Any, tmp_path: Path) -> None:
    ds = make_dataset("manual", namespace="ml", source=str(write_source(tmp_path / "s")), bundles="s3://b/m")
    ds["spec"]["pack"] = {"maxFiles": 10}
    apiserver.create(ds)
    controller(api_client, Clock()).reconcile_all()
    assert apiserver.list("jobs") == [] and "pack" not in apiserver.get("datasets", "manual", "ml")["status"]


def test_listing_fingerprints_change_with_size_mtime_and_membership(tmp_path: Path) -> None:
    source = write_source(tmp_path / "s")
    first = listing_fingerprint(str(source))
    assert listing_fingerprint(str(source)) == first
    (source / "new.bin").write_bytes(b"x")
    second = listing_fingerprint(str(source))
    assert second != first
    import os

    os.utime(source / "new.bin", (1, 1))
    assert listing_fingerprint(str(source)) != second


def test_one_leader_by_lease_and_takeover_after_expiry(apiserver: FakeApiServer, api_client: Any) -> None:
    clock = Clock()
    a = LeaseElector(api_client, namespace=NS, name="ctl", identity="a", duration_s=15, clock=clock)
    b = LeaseElector(api_client, namespace=NS, name="ctl", identity="b", duration_s=15, clock=clock)
    assert a.try_acquire() is True
    assert b.try_acquire() is False
    clock.now += 10
    assert a.try_acquire() is True  # renewed
    clock.now += 10
    assert b.try_acquire() is False  # renewed 10 s ago: still a's
    clock.now += 16
    assert b.try_acquire() is True  # a stopped renewing
    assert a.try_acquire() is False
    lease = apiserver.get("leases", "ctl", NS)
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1


@pytest.mark.slow
def test_warm_up_asks_real_agents_and_reports_only_what_is_ready(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    source = write_source(tmp_path / "nfs" / "speech", files=4)
    agent = AgentProcess(tmp_path / "agent", tcp=True, local_sources=(tmp_path / "nfs",)).start()
    try:
        assert agent.port is not None
        apiserver.create(make_node("gpu-1", annotations={"dsagent.io/inventory": inventory("gpu-1", {}, free=5 << 30)}))
        apiserver.create(make_node("gpu-2", labels={"pool": "a"}))  # no agent pod: never chosen
        apiserver.create(agent_pod("gpu-1"))
        ds = make_dataset("speech", namespace="ml", source=str(source))
        ds["spec"]["warm"] = {"nodes": 2}
        apiserver.create(ds)
        ctl = controller(api_client, Clock(), admin_token=ADMIN_TOKEN, agent_port=agent.port)
        deadline = time.monotonic() + 60
        while True:
            ctl.reconcile_all()
            warm = apiserver.get("datasets", "speech", "ml")["status"]["warm"]
            if warm["state"] == "Ready" or time.monotonic() > deadline:
                break
            assert warm["readyNodes"] < warm["desiredNodes"] or warm["bytesDone"] == warm["bytesWanted"]
            time.sleep(0.1)
        size = sum(p.stat().st_size for p in source.iterdir())
        assert warm["state"] == "Ready" and warm["desiredNodes"] == 1 and warm["readyNodes"] == 1
        assert warm["bytesDone"] == warm["bytesWanted"] == size
        assert [n["node"] for n in warm["nodes"]] == ["gpu-1"]
        with agent.client() as client:
            assert client.get_task(warm_task_id("ml", "speech"))["state"] == "ready"
            # cleanup while warm holds it: the agent keeps data in use
            apiserver.patch(
                "datasets", "speech", {"metadata": {"annotations": {"dsagent.io/cleanup": "1"}}}, namespace="ml"
            )
            ctl.reconcile_all()
            cleanup = apiserver.get("datasets", "speech", "ml")["status"]["cleanup"]
            assert cleanup["keptInUse"] == ["gpu-1"] and cleanup["evictedNodes"] == []
            assert [d["name"] for d in client.datasets()["datasets"]] == ["speech"]
            # warm-up off: the task is released; a new cleanup request evicts it
            apiserver.patch(
                "datasets",
                "speech",
                {"spec": {"warm": None}, "metadata": {"annotations": {"dsagent.io/cleanup": "2"}}},
                namespace="ml",
            )
            ctl.reconcile_all()
            assert apiserver.get("datasets", "speech", "ml")["status"]["warm"]["state"] == "Off"
            ctl.reconcile_all()
            cleanup = apiserver.get("datasets", "speech", "ml")["status"]["cleanup"]
            assert cleanup["request"] == "2" and cleanup["evictedNodes"] == ["gpu-1"], cleanup
            assert client.datasets()["datasets"] == []
    finally:
        agent.stop()


def test_warm_up_chooses_holders_first_then_free_space_and_waits_for_its_start_time(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    calls: list[tuple[str, str, str]] = []

    def fake_agent(node: str, method: str, path: str, body: Any, acting_for: str) -> tuple[int, Any]:
        if method != "GET":  # what the controller asks of the agents, not what it reads
            calls.append((node, method, path))
        return 200, {"datasets": [{"state": "fetching", "bytesDone": 10, "sizeBytes": 100}]}

    for name, inv in (
        ("n1", inventory("n1", {}, free=1 << 30)),
        ("n2", inventory("n2", {}, free=9 << 30)),
        ("n3", inventory("n3", {"big": {"digest": DIGEST, "state": "ready"}}, free=0)),
        ("n4", "garbage"),
    ):
        apiserver.create(make_node(name, annotations={"dsagent.io/inventory": inv}))
        apiserver.create(agent_pod(name))
    clock = Clock()
    ds = make_dataset("big", namespace="ml")
    ds["spec"]["warm"] = {"nodes": 2, "startTime": "2027-06-01T00:00:00Z"}
    apiserver.create(ds)
    ctl = controller(api_client, clock, agent_call=fake_agent)
    ctl.reconcile_all()
    assert apiserver.get("datasets", "big", "ml")["status"]["warm"]["state"] == "Waiting" and calls == []
    clock.now = 1_800_000_000.0 + 400 * 86400
    ctl.reconcile_all()
    warm = apiserver.get("datasets", "big", "ml")["status"]["warm"]
    assert [n["node"] for n in warm["nodes"]] == ["n2", "n3"]
    assert (warm["state"], warm["readyNodes"], warm["bytesDone"], warm["bytesWanted"]) == ("Warming", 0, 20, 200)
    apiserver.patch("datasets", "big", {"spec": {"warm": {"nodes": 1}}}, namespace="ml")
    calls.clear()
    ctl.reconcile_all()
    assert ("n2", "DELETE", f"/v1/tasks/{warm_task_id('ml', 'big')}") in calls  # no longer chosen: released
    assert [n["node"] for n in apiserver.get("datasets", "big", "ml")["status"]["warm"]["nodes"]] == ["n3"]


def test_hostile_dataset_fields_cannot_become_pack_flags(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    """The Job's dsctl parses a source that looks like a flag as the source, never as --publish."""
    import click

    from dsagent.cli.bundles import pack
    from dsagent.cli.group import cli

    ds = make_dataset("evil", namespace="ml", source="--publish=kube-system", bundles="--level=99")
    ds["spec"]["pack"] = {"auto": True, "level": True, "maxFiles": "1"}  # wrong types are ignored
    apiserver.create(ds)
    ctl = controller(api_client, Clock(), fingerprint=lambda url, options: "f" * 32)
    ctl.reconcile_all()
    [job] = apiserver.list("jobs")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["pack", "--name", "evil", "--to", "--level=99", "--publish", "ml", "--", "--publish=kube-system"]
    # how the Job's dsctl parses them: under the group's context (a context of its own would
    # leave the command's help option without -h for the rest of the process)
    parent = click.Context(cli, info_name="dsctl", **cli.context_settings)
    context = pack.make_context("pack", args[1:], parent=parent)
    assert context.params["source"] == "--publish=kube-system"
    assert context.params["publish_namespace"] == "ml" and context.params["store"] == "--level=99"
    assert context.params["level"] == 1


def _writing(r: Any) -> bool:
    return bool(r.method == "PATCH" and r.path.endswith("/status"))


def test_a_passs_status_writes_are_made_several_at_once_and_waited_for(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """Against a real API server each write is a round trip: a pass writes the Datasets'
    statuses on several threads while it goes on, and waits for all of them before it ends."""
    import threading

    from dsagent.controller.statuswrites import WRITERS

    names = [f"ds-{i:02d}" for i in range(2 * WRITERS)]
    for name in names:
        apiserver.create(make_dataset(name, namespace="ml", status={"digest": DIGEST, "files": 1, "bytes": 1}))
    ctl = controller(api_client, Clock())
    apiserver.hang(_writing)
    passing = threading.Thread(target=ctl.reconcile_all)
    passing.start()
    try:
        deadline = time.monotonic() + 30
        while len(apiserver.requests_matching("PATCH")) < WRITERS and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # a write past the bound would arrive now
        assert len([r for r in apiserver.requests if _writing(r)]) == WRITERS  # that many at once, no more
        assert passing.is_alive()  # the pass waits for its writes
    finally:
        apiserver.heal()
        passing.join(30)
    assert not passing.is_alive()
    assert all(apiserver.get("datasets", n, "ml")["status"]["readyNodeCount"] == 0 for n in names)


def test_a_status_write_that_fails_stops_no_other_and_is_counted(apiserver: FakeApiServer, api_client: Any) -> None:
    names = [f"ds-{i}" for i in range(4)]
    for name in names:
        apiserver.create(make_dataset(name, namespace="ml", status={"digest": DIGEST, "files": 1, "bytes": 1}))
    ctl = controller(api_client, Clock())
    apiserver.fail(lambda r: _writing(r) and "/datasets/ds-1/" in r.path, code=500)
    try:
        ctl.reconcile_all()
    finally:
        apiserver.heal()
    assert "readyNodeCount" not in apiserver.get("datasets", "ds-1", "ml")["status"]
    assert all(apiserver.get("datasets", n, "ml")["status"]["readyNodeCount"] == 0 for n in names if n != "ds-1")
    assert ctl.metrics.datasets.labels(result="error")._value.get() == 1
    assert ctl.metrics.datasets.labels(result="ok")._value.get() == 3
    ctl.reconcile_all()  # written at the next pass
    assert apiserver.get("datasets", "ds-1", "ml")["status"]["readyNodeCount"] == 0
