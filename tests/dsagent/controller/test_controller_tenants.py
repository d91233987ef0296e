"""Many teams, one cluster (docs/operator-guide/tenancy.md): the Dataset controller against the fake API
server with 40 nodes and a recording agent, tried as a hostile tenant would.

Every controller action is tried with two namespaces that share a Dataset name: each
admin-token request names the Dataset it acts for (``X-Dsagent-For``), a namespace's
cleanup evicts nothing of another's, its warm-up, copies, open tasks and bytes stay within
the limits whatever its spec says (a refusal is a ``Refused`` condition and an Event),
pack Jobs are per namespace, a stale node inventory is not used, and a failing or hanging
API server makes the controller back off, then recover.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsagent.policy import copies
from dsplatform.kubetime import format_time
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node, make_pod
from tools.support.harness import ADMIN_TOKEN, AgentProcess

NS = "dsplatform"
NODES = [f"gpu-{i:02d}" for i in range(40)]
NOW = 1_800_000_000.0
GIB = 1 << 30


@dataclass(frozen=True)
class Call:
    node: str
    method: str
    path: str
    body: Any
    acting_for: str | None


class RecordingAgent:
    """Every node's agent: records each request and answers as a fetching agent does."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def __call__(self, node: str, method: str, path: str, body: Any, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        acting_for = kwargs.get("acting_for", args[0] if args else None)
        self.calls.append(Call(node, method, path, body, acting_for))
        if method == "PUT":
            return 200, {"datasets": [{"state": "fetching", "bytesDone": 0, "sizeBytes": 1}]}
        if method == "POST":
            return 200, {"dryRun": False, "freedBytes": 0, "evicted": []}
        return 200, {"task": path.rsplit("/", 1)[-1], "released": True}

    def nodes(self, method: str, task: str) -> set[str]:
        return {c.node for c in self.calls if c.method == method and c.path == f"/v1/tasks/{task}"}


def inventory(node: str, datasets: dict[str, Any] | None = None, *, free: int = 80 * GIB) -> str:
    return json.dumps(
        {"version": 1, "node": node, "capacityBytes": 100 * GIB, "freeBytes": free, "datasets": datasets or {}}
    )


def agent_pod(node: str, ip: str = "127.0.0.1") -> dict[str, Any]:
    pod = make_pod(
        f"agent-{node}", namespace=NS, node_name=node, phase="Running", labels={"app.kubernetes.io/component": "agent"}
    )
    pod["status"]["podIP"] = ip
    return pod


def cluster(apiserver: FakeApiServer, nodes: list[str] = NODES, *, published: float = NOW) -> None:
    for node in nodes:
        annotations = {"dsagent.io/inventory": inventory(node), "dsagent.io/published-at": format_time(published)}
        apiserver.create(make_node(node, annotations=annotations))
        apiserver.create(agent_pod(node))


def dataset(namespace: str, name: str = "imagenet", *, bytes_: int = GIB, **spec: Any) -> dict[str, Any]:
    ds = make_dataset(name, namespace=namespace, source=f"s3://{namespace}-bucket/{name}")
    ds["spec"].update(spec)
    ds["status"] = {"digest": "a" * 32, "files": 10, "bytes": bytes_}
    return ds


def controller(api_client: Any, agent: Any, clock: Clock | None = None, **settings: Any) -> DatasetController:
    values: dict[str, Any] = {"namespace": NS, "identity": "c-1", "pack_image": "registry.example/dsp:1"}
    values.update(settings)
    return DatasetController(api_client, ControllerSettings(**values), clock=clock or Clock(NOW), agent_call=agent)


def status(apiserver: FakeApiServer, namespace: str, name: str = "imagenet") -> dict[str, Any]:
    return dict(apiserver.get("datasets", name, namespace)["status"])


def refused(apiserver: FakeApiServer, namespace: str, name: str = "imagenet") -> dict[str, Any] | None:
    for condition in status(apiserver, namespace, name).get("conditions") or []:
        if condition["type"] == "Refused":
            return dict(condition)
    return None


def events(apiserver: FakeApiServer, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in apiserver.list("events") if e["metadata"]["namespace"] == namespace and e["reason"] == reason]


# -- who did what: every request names its Dataset; a cleanup is its namespace's alone


def test_every_request_the_controller_makes_names_the_dataset_it_acts_for(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    cluster(apiserver)
    for namespace in ("team-a", "tenant-evil"):
        ds = dataset(namespace, warm={"nodes": 2}, replicas=2)
        ds["metadata"]["annotations"] = {"dsagent.io/cleanup": "go"}
        apiserver.create(ds)
    agent = RecordingAgent()
    ctl = controller(api_client, agent)
    ctl.reconcile_all()
    for namespace in ("team-a", "tenant-evil"):  # spec removed: the releases name it too
        apiserver.patch("datasets", "imagenet", {"spec": {"warm": None, "replicas": None}}, namespace=namespace)
    ctl.reconcile_all()
    assert agent.calls
    reads = [c for c in agent.calls if c.method == "GET"]  # the sweep of deleted Datasets' tasks: acts for none
    assert reads and all(c.path in ("/v1/tasks", "/v1/preparations") and c.acting_for == "" for c in reads)
    for call in (c for c in agent.calls if c.method != "GET"):
        task_namespace = call.path.split(".")[1] if call.path.startswith("/v1/tasks/") else None
        assert call.acting_for in ("team-a/imagenet", "tenant-evil/imagenet"), call
        if task_namespace is not None:
            assert call.acting_for == f"{task_namespace}/imagenet", call
    evictions = [c for c in agent.calls if c.method == "POST" and c.path == "/v1/evict"]
    assert {c.acting_for for c in evictions} == {"team-a/imagenet", "tenant-evil/imagenet"}
    assert len(evictions) == 2 * len(NODES)
    assert {c.acting_for for c in agent.calls if c.method == "DELETE"} == {"team-a/imagenet", "tenant-evil/imagenet"}
    for namespace in ("team-a", "tenant-evil"):  # each namespace's status is its own
        assert status(apiserver, namespace)["cleanup"]["request"] == "go"
        assert status(apiserver, namespace)["warm"]["state"] == "Off"


@pytest.mark.slow  # starts an agent process
def test_a_cleanup_evicts_nothing_another_namespace_cached_under_the_same_name(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    """The attack on a real agent: tenant-evil's Dataset ``imagenet`` annotated
    ``dsagent.io/cleanup`` made the controller evict team-a's unused copy on every node."""
    team_a = tmp_path / "nfs" / "team-a"
    evil = tmp_path / "nfs" / "evil"
    for root, seed in ((team_a, 1), (evil, 2)):
        root.mkdir(parents=True)
        for i in range(3):
            (root / f"f{i}.bin").write_bytes(bytes([seed, i]) * 5000)
    agent = AgentProcess(tmp_path / "agent", tcp=True, local_sources=(tmp_path / "nfs",)).start()
    try:
        assert agent.port is not None
        cluster(apiserver, ["gpu-1"])
        with httpx.Client(base_url=agent.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as op:
            # team-a's copy: cached by its warm-up, now unused; tenant-evil's beside it
            for namespace, source in (("team-a", team_a), ("tenant-evil", evil)):
                task = f"warm.{namespace}.imagenet"
                body = {"datasets": [{"name": "imagenet", "source": str(source)}]}
                header = {"X-Dsagent-For": f"{namespace}/imagenet"}
                assert op.put(f"/v1/tasks/{task}", params={"wait": 30}, json=body, headers=header).status_code == 200
                assert op.delete(f"/v1/tasks/{task}", headers=header).status_code == 200
            before = {v["digest"]: v["source"] for v in op.get("/v1/datasets/imagenet").json()["versions"]}
            assert len(before) == 2
            for namespace, source in (("team-a", team_a), ("tenant-evil", evil)):
                ds = make_dataset("imagenet", namespace=namespace, source=str(source))
                if namespace == "tenant-evil":
                    ds["metadata"]["annotations"] = {"dsagent.io/cleanup": "go"}
                apiserver.create(ds)
            settings = ControllerSettings(namespace=NS, identity="c-1", admin_token=ADMIN_TOKEN, agent_port=agent.port)
            DatasetController(api_client, settings, clock=Clock(NOW)).reconcile_all()
            after = {v["digest"]: v["source"] for v in op.get("/v1/datasets/imagenet").json()["versions"]}
        assert list(after.values()) == [str(team_a)]  # team-a's copy stays; tenant-evil's own went
        assert status(apiserver, "tenant-evil")["cleanup"]["evictedNodes"] == ["gpu-1"]
        assert "cleanup" not in status(apiserver, "team-a")
    finally:
        agent.stop()


# -- bounds: whatever the spec says, a namespace's pins stay within the limits


def test_an_unbounded_warm_up_is_held_to_the_limit_with_a_condition_and_an_event(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    cluster(apiserver)
    apiserver.create(dataset("tenant-evil", warm={"nodes": 1_000_000_000, "nodeSelector": {}}))
    apiserver.create(dataset("team-a", warm={"nodes": 2}))
    agent = RecordingAgent()
    ctl = controller(api_client, agent, warm_nodes_max=8)
    ctl.reconcile_all()
    ctl.reconcile_all()  # renewed each resync: still within the limit
    assert len(agent.nodes("PUT", "warm.tenant-evil.imagenet")) == 8
    assert len(agent.nodes("PUT", "warm.team-a.imagenet")) == 2
    condition = refused(apiserver, "tenant-evil")
    assert condition is not None and condition["status"] == "True" and condition["reason"] == "WarmNodesOverLimit"
    assert "8" in condition["message"]
    assert status(apiserver, "tenant-evil")["warm"]["desiredNodes"] == 8
    [event] = events(apiserver, "tenant-evil", "WarmNodesOverLimit")
    assert event["type"] == "Warning" and event["regarding"]["name"] == "imagenet"
    assert event["series"]["count"] == 2  # one Event, counted, not one per resync
    assert refused(apiserver, "team-a") is None and events(apiserver, "team-a", "WarmNodesOverLimit") == []
    # within the limit again: the condition clears
    apiserver.patch(
        "datasets", "imagenet", {"spec": {"warm": {"nodes": 3, "nodeSelector": None}}}, namespace="tenant-evil"
    )
    ctl.reconcile_all()
    condition = refused(apiserver, "tenant-evil")
    assert condition is not None and condition["status"] == "False"


@pytest.mark.parametrize("stripe", [{"member": 3}, "Auto", {"members": 0}])
def test_a_stripe_spec_the_controller_cannot_act_on_is_said_not_ignored(
    apiserver: FakeApiServer, api_client: Any, stripe: Any
) -> None:
    """A Dataset from before the CRD typed spec.stripe: striping stays off, and the Dataset says why."""
    cluster(apiserver)
    apiserver.create(dataset("team-a", stripe=stripe))
    controller(api_client, RecordingAgent()).reconcile_all()
    condition = refused(apiserver, "team-a")
    assert condition is not None and condition["status"] == "True" and condition["reason"] == "StripeInvalid"
    assert "auto" in condition["message"] and "members" in condition["message"]
    [event] = events(apiserver, "team-a", "StripeInvalid")
    assert event["type"] == "Warning" and event["regarding"]["name"] == "imagenet"
    assert "stripe" not in status(apiserver, "team-a")  # nothing striped


def test_a_selector_matching_every_node_is_held_to_the_limit(apiserver: FakeApiServer, api_client: Any) -> None:
    cluster(apiserver)
    apiserver.create(dataset("tenant-evil", warm={"nodeSelector": {"kubernetes.io/os": "linux"}}))
    for node in NODES:
        apiserver.patch("nodes", node, {"metadata": {"labels": {"kubernetes.io/os": "linux"}}})
    agent = RecordingAgent()
    controller(api_client, agent, warm_nodes_max=8).reconcile_all()
    assert len(agent.nodes("PUT", "warm.tenant-evil.imagenet")) == 8
    assert refused(apiserver, "tenant-evil")["reason"] == "WarmNodesOverLimit"  # type: ignore[index]


def test_ten_thousand_replicas_are_held_to_the_limit(apiserver: FakeApiServer, api_client: Any) -> None:
    cluster(apiserver)
    apiserver.create(dataset("tenant-evil", replicas=10000))
    apiserver.create(dataset("team-a", replicas=3))
    agent = RecordingAgent()
    controller(api_client, agent, replicas_max=8).reconcile_all()
    assert len(agent.nodes("PUT", "replica.tenant-evil.imagenet")) == 8
    assert len(agent.nodes("PUT", "replica.team-a.imagenet")) == 3
    assert status(apiserver, "tenant-evil")["replicas"]["target"] == 8
    assert refused(apiserver, "tenant-evil")["reason"] == "ReplicasOverLimit"  # type: ignore[index]
    assert events(apiserver, "tenant-evil", "ReplicasOverLimit")
    assert refused(apiserver, "team-a") is None


def test_a_namespace_never_pins_past_its_share_of_a_node(apiserver: FakeApiServer, api_client: Any) -> None:
    cluster(apiserver, NODES[:4])
    # 40 GiB each of a 100 GiB cache, share 0.5: no node may hold two of them
    apiserver.create(dataset("tenant-evil", "one", bytes_=40 * GIB, warm={"nodes": 3}))
    apiserver.create(dataset("tenant-evil", "two", bytes_=40 * GIB, warm={"nodes": 3}))
    apiserver.create(dataset("tenant-evil", "huge", bytes_=60 * GIB, warm={"nodes": 1}))
    apiserver.create(dataset("team-a", "one", bytes_=40 * GIB, warm={"nodes": 4}))  # its own share
    agent = RecordingAgent()
    controller(api_client, agent, namespace_share=0.5).reconcile_all()
    one = agent.nodes("PUT", "warm.tenant-evil.one")
    two = agent.nodes("PUT", "warm.tenant-evil.two")
    assert len(one) == 3 and not one & two and len(two) == 1  # 4 nodes: only one left for "two"
    assert agent.nodes("PUT", "warm.tenant-evil.huge") == set()
    assert refused(apiserver, "tenant-evil", "two")["reason"] == "NamespaceShare"  # type: ignore[index]
    assert refused(apiserver, "tenant-evil", "huge")["reason"] == "NamespaceShare"  # type: ignore[index]
    assert len(agent.nodes("PUT", "warm.team-a.one")) == 4


def test_a_namespaces_open_tasks_and_cluster_bytes_are_bounded(apiserver: FakeApiServer, api_client: Any) -> None:
    cluster(apiserver, NODES[:10])
    apiserver.create(dataset("tenant-evil", "x", warm={"nodes": 3}))
    apiserver.create(dataset("tenant-evil", "y", warm={"nodes": 3}, replicas=3))
    apiserver.create(dataset("team-b", "z", bytes_=30 * GIB, warm={"nodes": 5}))
    agent = RecordingAgent()
    controller(api_client, agent, namespace_tasks=4, namespace_bytes=100 * GIB).reconcile_all()
    evil = {(c.node, c.path) for c in agent.calls if c.method == "PUT" and ".tenant-evil." in c.path}
    assert len(evil) == 4
    assert refused(apiserver, "tenant-evil", "y")["reason"] == "NamespaceTasks"  # type: ignore[index]
    assert len(agent.nodes("PUT", "warm.team-b.z")) == 3  # 3 x 30 GiB within 100 GiB
    assert refused(apiserver, "team-b", "z")["reason"] == "NamespaceBytes"  # type: ignore[index]


# -- shared names: pack Jobs and status per namespace


def test_two_namespaces_sharing_a_dataset_name_and_source_get_their_own_pack_jobs(
    apiserver: FakeApiServer, api_client: Any, tmp_path: Path
) -> None:
    source = tmp_path / "shared"
    source.mkdir()
    (source / "a.bin").write_bytes(b"x" * 1000)
    for namespace in ("team-a", "tenant-evil"):
        ds = make_dataset("imagenet", namespace=namespace, source=str(source), bundles="s3://bundles/imagenet")
        ds["spec"]["pack"] = {"auto": True}
        apiserver.create(ds)
    controller(api_client, RecordingAgent()).reconcile_all()
    jobs = apiserver.list("jobs")
    assert len(jobs) == 2
    by_namespace = {j["metadata"]["labels"]["dsagent.io/dataset-namespace"]: j for j in jobs}
    assert set(by_namespace) == {"team-a", "tenant-evil"}
    for namespace, job in by_namespace.items():
        assert status(apiserver, namespace)["pack"]["job"] == job["metadata"]["name"]
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--publish") + 1] == namespace


# -- cluster-side faults: stale inventories, a failing or hanging API server


def test_a_stale_inventory_is_used_for_nothing(apiserver: FakeApiServer, api_client: Any) -> None:
    held = {"imagenet": {"digest": "a" * 32, "state": "ready"}}
    for node, published in (("gpu-1", NOW - 3600), ("gpu-2", NOW - 10)):  # gpu-1 would rank first
        annotations = {
            "dsagent.io/inventory": inventory(node, held),
            "dsagent.io/published-at": format_time(published),
        }
        apiserver.create(make_node(node, annotations=annotations))
        apiserver.create(agent_pod(node))
    apiserver.create(dataset("team-a", warm={"nodes": 1}))
    agent = RecordingAgent()
    ctl = controller(api_client, agent, inventory_max_age=300)
    fresh = ctl.fresh_inventories(apiserver.list("nodes"))
    assert set(fresh) == {"gpu-2"} and list(copies.count_copies(fresh.values()).values()) == [1]
    ctl.reconcile_all()
    assert status(apiserver, "team-a")["readyNodes"] == ["gpu-2"]
    assert agent.nodes("PUT", "warm.team-a.imagenet") == {"gpu-2"}  # the holder: by its fresh inventory


def test_the_controller_backs_off_while_the_api_server_fails_and_recovers(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    cluster(apiserver, NODES[:2])
    apiserver.create(dataset("team-a", warm={"nodes": 1}))
    agent = RecordingAgent()
    ctl = controller(api_client, agent, resync_s=10, api_timeout_s=1)
    assert ctl.step() == 10
    apiserver.fail(code=500)
    delays = [ctl.step() for _ in range(6)]
    assert delays == sorted(delays) and delays[0] > 10 and delays[-1] <= 300, delays
    apiserver.heal()
    assert ctl.step() == 10  # recovered: back to the resync
    assert status(apiserver, "team-a")["warm"]["desiredNodes"] == 1


def test_a_hanging_api_server_holds_a_pass_no_longer_than_the_request_timeout(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    cluster(apiserver, NODES[:2])
    ctl = controller(api_client, RecordingAgent(), resync_s=10, api_timeout_s=1)
    apiserver.hang()
    try:
        started = time.monotonic()
        delay = ctl.step()
        took = time.monotonic() - started
    finally:
        apiserver.heal()
    assert delay > 10 and took < 5, (delay, took)


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_a_share_outside_zero_to_one_is_a_settings_error(share: float) -> None:
    from dsagent.errors import SettingsError

    with pytest.raises(SettingsError, match="NAMESPACE_SHARE"):
        ControllerSettings.from_env({"DSAGENT_CONTROLLER_NAMESPACE_SHARE": str(share)})
