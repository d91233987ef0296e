"""What a Dataset controller pass reads, and what it keeps from one pass to the next
(dsagent/controller/inventories.py, passheap.py, agents.agents_among): the same answers as
reading everything again, with fewer requests and the collector kept off what was read."""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest

from dsagent.controller import agents, cachestate
from dsagent.controller.inventories import InventoryReader
from dsagent.policy import copies
from tests.clock import Clock
from tests.dsagent.controller.test_controller import NS, agent_pod, controller, inventory
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node, make_pod

DIGESTS = ["a" * 32, "b" * 32, "c" * 32]
NAMES = ["imagenet", "coco", "speech", "wiki"]


def random_inventory(rng: random.Random) -> dict[str, Any]:
    """An inventory with a bit of everything: versions, stripe shares, every state, and
    hostile fields (an entry that is not an object, a digest that is not a string)."""
    datasets: dict[str, Any] = {}
    for name in rng.sample(NAMES, rng.randint(0, len(NAMES))):
        roll = rng.random()
        if roll < 0.1:
            datasets[name] = "not an object"
            continue
        entry: dict[str, Any] = {
            "digest": rng.choice(DIGESTS) if roll > 0.2 else 7,
            "state": rng.choice(["ready", "fetching", "failed", "evicting"]),
            "sizeBytes": rng.choice([1000, -1, "big"]),
            "heldBytes": rng.choice([10, 5000]),
        }
        if rng.random() < 0.4:
            entry["versions"] = [{"digest": rng.choice(DIGESTS), "state": rng.choice(["ready", "fetching"])}, "junk"]
        datasets[name] = entry
    doc: dict[str, Any] = {"datasets": datasets}
    if rng.random() < 0.4:
        name = rng.choice(NAMES)
        doc["stripes"] = {name: {"digest": rng.choice(DIGESTS), "sizeBytes": 4000, "heldBytes": 1000}}
    return doc


def test_the_index_answers_as_every_inventory_read_again_while_they_change() -> None:
    rng = random.Random(7)
    reader = InventoryReader()
    inventories = {f"n{i}": random_inventory(rng) for i in range(40)}
    for _ in range(12):
        reader.next_pass()
        index = reader.index(inventories)
        for name in [*NAMES, "absent"]:
            listed = {n for n, inv in inventories.items() if name in (inv.get("datasets") or {})}
            listed |= {n for n, inv in inventories.items() if name in (inv.get("stripes") or {})}
            assert set(index.listing(name)) == listed
            for digest in [*DIGESTS, None, ""]:
                assert index.holdings(name, digest) == cachestate.holdings(inventories, name, digest)
        assert all(reader.held_copies(inv) == copies.held_copies(inv) for inv in inventories.values())
        # the next pass: some inventories change (new objects, as a new text parses to), some
        # nodes go, some come; the others are the same objects
        inventories = {n: inv for n, inv in inventories.items() if rng.random() > 0.1}
        for node in rng.sample(sorted(inventories), 5):
            inventories[node] = random_inventory(rng)
        for _ in range(3):
            inventories[f"m{rng.randint(0, 1000)}"] = random_inventory(rng)


def test_keepers_are_those_of_the_holders_now() -> None:
    reader = InventoryReader()
    version = ("imagenet", DIGESTS[0])
    first = reader.keeper(version, ["n1", "n2", "n3"])
    assert first == copies.keeper(f"imagenet@{DIGESTS[0]}", ["n1", "n2", "n3"])
    reader.next_pass()
    assert reader.keeper(version, ["n1", "n2", "n3"]) == first
    others = ["n1", "n4"] if first != "n4" else ["n1", "n5"]
    reader.next_pass()
    assert reader.keeper(version, others) == copies.keeper(f"imagenet@{DIGESTS[0]}", others)


def agent_nodes(apiserver: FakeApiServer) -> None:
    for node in ("gpu-1", "gpu-2"):
        apiserver.create(
            make_node(node, annotations={"dsagent.io/inventory": inventory(node, {}), "dsagent.io/free-gpus": "0,1"})
        )
        apiserver.create(agent_pod(node))
    other = agent_pod("gpu-3")
    other["metadata"]["namespace"] = "elsewhere"  # another namespace's pod with the label: no agent of ours
    apiserver.create(other)
    apiserver.create(make_pod("trainer", namespace=NS, node_name="gpu-2", phase="Running"))  # no agent label


def test_a_pass_that_reads_every_pod_finds_the_agents_among_them(apiserver: FakeApiServer, api_client: Any) -> None:
    agent_nodes(apiserver)
    ds = make_dataset("speech", namespace="ml", status={"digest": DIGESTS[0], "files": 1, "bytes": 1000})
    ds["spec"]["replicas"] = 1  # replicas read every pod (the demand)
    apiserver.create(ds)
    asked: list[str] = []

    def agent_call(node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any]:
        asked.append(node)
        return 200, {"datasets": [{"name": "speech", "state": "fetching", "sizeBytes": 1000, "bytesDone": 0}]}

    controller(api_client, Clock(), agent_call=agent_call).reconcile_all()
    every_pod = [r for r in apiserver.requests_matching("GET", "/api/v1/pods") if not r.query.get("fieldSelector")]
    assert len(every_pod) == 1
    assert not apiserver.requests_matching("GET", f"/api/v1/namespaces/{NS}/pods")
    replicas = apiserver.get("datasets", "speech", "ml")["status"]["replicas"]
    assert [n["node"] for n in replicas["nodes"]] and set(asked) <= {"gpu-1", "gpu-2"}


def test_a_pass_that_reads_no_pod_asks_for_the_agents_alone(apiserver: FakeApiServer, api_client: Any) -> None:
    agent_nodes(apiserver)
    apiserver.create(make_dataset("speech", namespace="ml", status={"digest": DIGESTS[0], "files": 1, "bytes": 1}))
    controller(api_client, Clock()).reconcile_all()
    assert len(apiserver.requests_matching("GET", f"/api/v1/namespaces/{NS}/pods")) == 1
    assert not [r for r in apiserver.requests_matching("GET", "/api/v1/pods") if not r.query.get("fieldSelector")]


@pytest.mark.parametrize(
    "selector",
    [
        "app.kubernetes.io/component=agent",
        "app.kubernetes.io/component in (agent, other)",
        "app.kubernetes.io/component!=agent",
        "!app.kubernetes.io/component",
        "",
    ],
)
def test_agents_among_every_pod_are_those_the_api_server_selects(
    apiserver: FakeApiServer, api_client: Any, selector: str
) -> None:
    from kubernetes.client import CoreV1Api

    agent_nodes(apiserver)
    core = CoreV1Api(api_client)
    every_pod = agents.raw(core.list_pod_for_all_namespaces)["items"]
    assert agents.agents_among(every_pod, NS, selector, 7420) == agents.find_agents(core, NS, selector, 7420)


def test_the_collector_runs_and_nothing_stays_frozen_after_a_pass(apiserver: FakeApiServer, api_client: Any) -> None:
    agent_nodes(apiserver)
    ds = make_dataset("speech", namespace="ml", status={"digest": DIGESTS[0], "files": 1, "bytes": 1000})
    ds["spec"]["warm"] = {"nodes": 1}
    apiserver.create(ds)
    during: list[tuple[bool, int]] = []

    def agent_call(node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any]:
        during.append((gc.isenabled(), gc.get_freeze_count()))
        return 200, {"datasets": [{"name": "speech", "state": "ready", "sizeBytes": 1000, "bytesDone": 1000}]}

    ctl = controller(api_client, Clock(), agent_call=agent_call)
    ctl.reconcile_all()
    # while the agents were asked: the collector ran, over what the pass made since it read
    assert during and all(enabled and frozen > 0 for enabled, frozen in during)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    apiserver.fail(lambda r: r.path.startswith("/apis/dsagent.io/v1alpha1/datasets"))
    with pytest.raises(Exception):  # noqa: B017, PT011 - the pass fails, however the client says it
        ctl.reconcile_all()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_once_its_node_watch_has_listed_a_pass_lists_no_node_and_reads_each_change(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """The Nodes and NodeCaches kept by list+watch (dsagent/kube/nodewatch.py): a pass reads
    them from the watch, as a pass that lists them would (the same status), and a change made
    between two passes is in the second."""
    from tools.support.fake_apiserver import make_nodecache

    ready = {"imagenet": {"digest": DIGESTS[0], "state": "ready"}}
    stamp = "2027-01-15T08:00:00Z"  # the test clock's time, near enough for the staleness bound
    for name in ("a", "b", "c"):
        node = apiserver.create(make_node(name, annotations={"dsagent.io/inventory": inventory(name, {})}))
        held = ready if name != "c" else {}
        cache = make_nodecache(
            name, inventory=inventory(name, held), published_at=stamp, node_uid=node["metadata"]["uid"]
        )
        apiserver.create(cache)
    apiserver.create(make_dataset("imagenet", namespace="ml", status={"digest": DIGESTS[0], "files": 1, "bytes": 1}))
    clock = Clock()
    listing = controller(api_client, clock)
    assert listing.node_watch is not None  # on by default, started by the process
    listing.reconcile_all()
    listed_status = apiserver.get("datasets", "imagenet", "ml")["status"]
    assert listed_status["readyNodes"] == ["a", "b"]
    watching = controller(api_client, clock)
    watch = watching.node_watch
    assert watch is not None
    watch.start()
    try:
        assert watch.wait_synced(10)
        paths = ("/api/v1/nodes", "/apis/dsagent.io/v1alpha1/nodecaches")

        def lists() -> int:
            return sum(len(apiserver.requests_matching("GET", path, watch=False)) for path in paths)

        listed = lists()
        watching.reconcile_all()
        assert apiserver.get("datasets", "imagenet", "ml")["status"]["readyNodes"] == listed_status["readyNodes"]
        apiserver.patch("nodecaches", "c", {"status": {"inventory": inventory("c", ready)}})

        def c_holds() -> bool:
            (c,) = [n for n in watch.nodes() if n["metadata"]["name"] == "c"]
            return "imagenet" in c["metadata"]["annotations"]["dsagent.io/inventory"]

        apiserver.wait_for(c_holds, what="the changed NodeCache in the watch")
        watching.reconcile_all()
        assert apiserver.get("datasets", "imagenet", "ml")["status"]["readyNodes"] == ["a", "b", "c"]
        assert lists() == listed  # neither listed since the watch listed them
        reads = watching.metrics.node_reads.counter
        assert (reads.labels(source="watch")._value.get(), reads.labels(source="list")._value.get()) == (2, 0)
        assert listing.metrics.node_reads.counter.labels(source="list")._value.get() == 1
    finally:
        watch.stop()


def test_the_first_pass_that_reads_every_pod_starts_their_watch_and_no_pass_lists_them(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """Every pod kept by list+watch (dsagent/kube/podswatch.py), started by the first pass
    that reads them all (a replicated Dataset counts its readers), which reads its first
    list: every pass reads the watch, as a pass that lists them would, with each change
    made between two passes."""
    agent_nodes(apiserver)
    ds = make_dataset("speech", namespace="ml", status={"digest": DIGESTS[0], "files": 1, "bytes": 1000})
    ds["spec"]["replicas"] = "auto"
    apiserver.create(ds)
    apiserver.create(make_pod("reader-1", namespace="ml", annotations={"dsagent.io/datasets": "speech"}))
    ctl = controller(api_client, Clock())
    watch = ctl.pods.watch
    assert watch is not None and not watch.started  # on by default, started by the first pass that needs it
    ctl.pods.start_watch = True
    try:
        ctl.reconcile_all()  # starts the watch, and reads its first list
        assert watch.started and watch.synced
        assert apiserver.get("datasets", "speech", "ml")["status"]["replicas"]["demand"] == 1

        def lists() -> int:
            return len(
                [
                    r
                    for r in apiserver.requests_matching("GET", "/api/v1/pods", watch=False)
                    if not r.query.get("fieldSelector")
                ]
            )

        listed = lists()
        apiserver.create(make_pod("reader-2", namespace="ml", annotations={"dsagent.io/datasets": "speech"}))
        apiserver.wait_for(lambda: len(watch.pods()) == 6, what="the new pod in the watch")
        ctl.reconcile_all()
        assert apiserver.get("datasets", "speech", "ml")["status"]["replicas"]["demand"] == 2
        apiserver.delete("pods", "reader-1", namespace="ml")
        apiserver.wait_for(lambda: len(watch.pods()) == 5, what="the deleted pod gone from the watch")
        ctl.reconcile_all()
        assert apiserver.get("datasets", "speech", "ml")["status"]["replicas"]["demand"] == 1
        assert lists() == listed  # none listed since the watch listed them
        reads = ctl.metrics.pod_reads.counter
        assert (reads.labels(source="list")._value.get(), reads.labels(source="watch")._value.get()) == (0, 3)
    finally:
        watch.stop()


def test_a_watched_pod_keeps_what_the_controller_reads_and_drops_the_rest() -> None:
    from dsagent.kube.podswatch import slim

    pod = make_pod("p", namespace="ml", node_name="gpu-1", gpus=2, annotations={"dsagent.io/datasets": "d"})
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{" + "x" * 5000 + "}"
    pod["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "train", "uid": "u", "controller": True}]
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod["spec"]["schedulingGates"] = [{"name": "dsagent.io/deadline-plan"}]
    pod["spec"]["initContainers"] = [{"name": "dsctl", "image": "x", "restartPolicy": "Always", "resources": {}}]
    pod["status"].update(containerStatuses=[{"name": "train", "ready": True}], podIP="10.0.0.1", startTime="t")
    kept = slim(pod)
    assert set(kept["metadata"]) >= {"name", "namespace", "annotations", "ownerReferences"}
    assert "managedFields" not in kept["metadata"] and "volumes" not in kept["spec"]
    assert kept["metadata"]["annotations"] == {"dsagent.io/datasets": "d"}  # kubectl's copy of the pod dropped
    assert kept["spec"]["containers"] == [{"name": "train", "resources": pod["spec"]["containers"][0]["resources"]}]
    assert kept["spec"]["initContainers"] == [{"name": "dsctl", "restartPolicy": "Always", "resources": {}}]
    assert kept["spec"]["nodeName"] == "gpu-1" and kept["spec"]["schedulingGates"] == pod["spec"]["schedulingGates"]
    assert kept["status"] == {"phase": "Pending", "podIP": "10.0.0.1", "startTime": "t"}
    assert "managedFields" in pod["metadata"] and "command" in pod["spec"]["containers"][0]  # the pod as sent
    assert slim("not a pod") == "not a pod"
    # what the controller reads of it is the same
    from dsagent.controller import podfacts
    from dsplatform.gpus import pod_gpus

    assert pod_gpus(kept["spec"]) == pod_gpus(pod["spec"]) == 2
    assert podfacts.pods_by_dataset([kept]).keys() == podfacts.pods_by_dataset([pod]).keys()


def test_the_controller_process_lets_its_first_pass_that_reads_every_pod_start_their_watch(
    apiserver: FakeApiServer, api_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from dsagent.controller import process
    from dsagent.controller.reconcile import DatasetController
    from dsagent.kube import apiclient

    started: list[Any] = []
    monkeypatch.setattr(apiclient, "load", lambda: api_client)
    monkeypatch.setattr(DatasetController, "run_forever", lambda self: started.append(self))
    for name in list(os.environ):
        if name.startswith("DSAGENT_CONTROLLER_"):
            monkeypatch.delenv(name)
    process._run_controller()
    (ctl,) = started
    try:
        assert ctl.pods.watch is not None and ctl.pods.start_watch and not ctl.pods.watch.started
    finally:
        if ctl.node_watch is not None:
            ctl.node_watch.stop()


def test_a_pods_dataset_names_are_parsed_once_per_text_and_a_long_text_is_never_kept() -> None:
    from dsagent.controller import podfacts

    def pod(text: str) -> dict[str, Any]:
        return make_pod("p", namespace="ml", annotations={"dsagent.io/datasets": text})

    podfacts._names_of_known.cache_clear()
    job = [pod("imagenet,coco") for _ in range(50)]  # a job's pods: one text
    assert {podfacts.dataset_names(p) for p in job} == {("imagenet", "coco")}
    info = podfacts._names_of_known.cache_info()
    assert (info.misses, info.hits) == (1, 49)
    long = ",".join(f"d{i}" for i in range(1000))  # 5.9 kB: parsed each time, never held
    assert podfacts.dataset_names(pod(long)) == tuple(f"d{i}" for i in range(1000))
    assert podfacts._names_of_known.cache_info().currsize == 1
    assert podfacts.dataset_names(pod("x" * (64 * 1024 + 1))) == ()  # past the bound: not read at all
