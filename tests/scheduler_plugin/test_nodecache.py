"""nodeCacheCapable mode: names-only requests served from a watch-backed Node/Pod cache,
kept with the official kubernetes client against the fake API server over real HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dsplatform import kubetime
from scheduler_plugin.app import ExtenderApp
from scheduler_plugin.framework import Framework
from scheduler_plugin.nodecache import NodeCache
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import (
    args_body,
    holding,
    inventory_json,
    node,
    pod,
    topology_json,
)
from scheduler_plugin.view import View
from scheduling.nodeinfo import NodeReader
from tests.scheduler_plugin.server import serving
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_pod

TOPO = topology_json()
IMAGENET = [{"name": "imagenet", "source": "s3://datasets/imagenet", "digest": "a" * 32}]


def api_node(name: str, **kwargs: Any) -> dict[str, Any]:
    obj = node(name, **kwargs)
    del obj["metadata"]["resourceVersion"]
    return {"kind": "Node", "apiVersion": "v1", **obj}


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.create(
            api_node(
                "holds",
                inventory=inventory_json(datasets={"imagenet": holding()}),
                topology=TOPO,
                free_gpus=[4, 5, 6, 7],
            )
        )
        server.create(api_node("empty", inventory=inventory_json(), topology=TOPO, free_gpus=[0, 1, 2, 3]))
        server.create(api_node("unannotated", topology=TOPO, gpus=8))
        yield server


@pytest.fixture
def extender(apiserver: FakeApiServer) -> Iterator[tuple[httpx.Client, NodeCache]]:
    settings = Settings(watch=True)
    reader = NodeReader()
    api_client = apiserver.api_client()
    cache = NodeCache(
        api_client,
        reader,
        gpu_resource=settings.gpu_resource,
        roce_prefix=settings.roce_resource_prefix,
        retry_s=0.05,
        watch_timeout_s=30,
    )
    app = ExtenderApp(settings, view=View(reader, cache), framework=Framework(settings))
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert cache.wait_synced(10)
        yield http, cache
    api_client.close()


def names_body(names: list[str], **pod_kwargs: Any) -> bytes:
    pod_kwargs.setdefault("namespace", "default")
    return args_body(pod(**pod_kwargs), [{"metadata": {"name": n}} for n in names], node_cache_capable=True)


def scores(http: httpx.Client, body: bytes, verb: str = "prioritize") -> dict[str, int]:
    return {h["Host"]: h["Score"] for h in http.post(f"/{verb}", content=body).json()}


def test_names_only_requests_are_scored_from_the_cache(extender: tuple[httpx.Client, NodeCache]) -> None:
    http, _ = extender
    body = names_body(["holds", "empty", "unannotated"], datasets=IMAGENET, gpus=2)
    assert json.loads(body)["Nodes"] is None
    assert scores(http, body, "prioritize/dataset") == {"holds": 10, "empty": 0, "unannotated": 0}
    combined = scores(http, body)
    assert combined["holds"] == 10 and combined["empty"] < 10


def test_filter_answers_with_node_names_and_passes_unknown_nodes(extender: tuple[httpx.Client, NodeCache]) -> None:
    http, _ = extender
    result = http.post("/filter", content=names_body(["holds", "nobody-knows", "empty"], gpus=5)).json()
    assert result["Nodes"] is None and result["Error"] == ""
    assert result["NodeNames"] == ["nobody-knows"]
    assert set(result["FailedNodes"]) == {"holds", "empty"}
    assert scores(http, names_body(["nobody-knows"], gpus=1)) == {"nobody-knows": 0}


def test_node_changes_arrive_through_the_watch(
    apiserver: FakeApiServer, extender: tuple[httpx.Client, NodeCache]
) -> None:
    http, cache = extender
    apiserver.patch(
        "nodes",
        "empty",
        {"metadata": {"annotations": {"dsagent.io/inventory": inventory_json(datasets={"imagenet": holding()})}}},
    )
    apiserver.wait_for(
        lambda: (
            (f := cache.facts("empty")) is not None and f.inventory is not None and "imagenet" in f.inventory.datasets
        ),
        what="the patched node in the cache",
    )
    assert scores(http, names_body(["holds", "empty"], datasets=IMAGENET), "prioritize/dataset") == {
        "holds": 10,
        "empty": 10,
    }
    apiserver.delete("nodes", "holds")
    apiserver.wait_for(lambda: cache.facts("holds") is None, what="the deleted node gone")


def test_pods_bound_to_a_node_use_up_its_unpublished_gpus(
    apiserver: FakeApiServer, extender: tuple[httpx.Client, NodeCache]
) -> None:
    http, cache = extender
    apiserver.create(make_pod("running", node_name="unannotated", gpus=6, phase="Running"))
    apiserver.create(make_pod("finished", node_name="unannotated", gpus=2, phase="Succeeded"))
    apiserver.wait_for(lambda: cache.facts("unannotated").free_count == 2, what="6 GPUs in use")  # type: ignore[union-attr]
    result = http.post("/filter", content=names_body(["unannotated"], gpus=4)).json()
    assert result["FailedNodes"] == {"unannotated": "2 free GPUs, pod needs 4"}
    apiserver.delete("pods", "running", "default")
    apiserver.wait_for(lambda: cache.facts("unannotated").free_count == 8, what="GPUs freed")  # type: ignore[union-attr]


def test_an_expired_watch_relists_and_keeps_up(
    apiserver: FakeApiServer, extender: tuple[httpx.Client, NodeCache]
) -> None:
    _, cache = extender
    lists_before = len([r for r in apiserver.requests_matching("GET", "/api/v1/nodes", watch=False)])
    apiserver.compact()
    apiserver.close_watches()
    apiserver.wait_for(
        lambda: len(apiserver.requests_matching("GET", "/api/v1/nodes", watch=False)) > lists_before,
        what="a new list after 410 Gone",
    )
    apiserver.create(api_node("newcomer", topology=TOPO, free_gpus=[0]))
    apiserver.wait_for(lambda: cache.facts("newcomer") is not None, what="the new node")
    watches = apiserver.requests_matching("GET", "/api/v1/nodes", watch=True)
    assert all(w.query.get("allowWatchBookmarks") == "true" for w in watches)


def test_the_cache_survives_an_api_server_restart(
    apiserver: FakeApiServer, extender: tuple[httpx.Client, NodeCache]
) -> None:
    _, cache = extender
    apiserver.restart()
    apiserver.create(api_node("after-restart", topology=TOPO, free_gpus=[1]))
    apiserver.wait_for(
        lambda: cache.facts("after-restart") is not None, timeout=15, what="the node created after restart"
    )


def test_roce_class_endpoint_counts_every_cached_node(extender: tuple[httpx.Client, NodeCache]) -> None:
    http, _ = extender
    answer = http.get("/v1/roce-class", params={"gpus": 4}).json()
    assert answer["source"] == "watch" and answer["nodes"] == 3
    assert answer["votes"] == {"gpu-roce1": 2, "gpu-roce2": 2} and answer["class"] == "gpu-roce1"


def test_before_the_first_list_filter_passes_every_node_and_prioritize_scores_zero(apiserver: FakeApiServer) -> None:
    settings = Settings(watch=True)
    reader = NodeReader()
    api_client = apiserver.api_client()
    cache = NodeCache(api_client, reader, gpu_resource=settings.gpu_resource, roce_prefix=settings.roce_resource_prefix)
    app = ExtenderApp(settings, view=View(reader, cache), framework=Framework(settings))  # cache never started
    assert not app.view.ready
    body = names_body(["holds", "empty"], gpus=64)
    result = json.loads(app.filter(body))
    assert result["NodeNames"] == ["holds", "empty"] and result["Error"] == ""
    assert json.loads(app.prioritize(body)) == [{"Host": "holds", "Score": 0}, {"Host": "empty", "Score": 0}]
    api_client.close()


def test_unpinned_datasets_are_current_only_at_their_dataset_resources_digest(
    apiserver: FakeApiServer, extender: tuple[httpx.Client, NodeCache]
) -> None:
    http, cache = extender
    apiserver.create(
        api_node(
            "stale", inventory=inventory_json(datasets={"imagenet": holding("b" * 32)}), topology=TOPO, free_gpus=[0]
        )
    )
    apiserver.wait_for(lambda: cache.facts("stale") is not None, what="the stale node")
    body = args_body(
        pod(namespace="default", datasets="imagenet"),
        [{"metadata": {"name": n}} for n in ("holds", "stale")],
        node_cache_capable=True,
    )
    # No Dataset resource yet: any ready copy counts.
    assert scores(http, body, "prioritize/dataset") == {"holds": 10, "stale": 10}
    apiserver.create(make_dataset("imagenet", status={"digest": "a" * 32, "files": 10, "bytes": 3 << 40}))
    apiserver.wait_for(lambda: ("default", "imagenet") in cache.current_datasets(), what="the Dataset")
    assert scores(http, body, "prioritize/dataset") == {"holds": 10, "stale": 0}
    # Its published size (3 TiB) exceeds the 2000 GiB caches of nodes that do not hold it.
    result = http.post("/filter", content=names_body(["holds", "empty"], datasets="imagenet")).json()
    assert (
        result["NodeNames"] == ["holds"]
        and "larger than the node's whole cache" in result["FailedAndUnresolvableNodes"]["empty"]
    )


def test_each_full_list_of_nodes_pods_and_nodecaches_is_reported(apiserver: FakeApiServer) -> None:
    listed: list[int] = []
    api_client = apiserver.api_client()
    cache = NodeCache(
        api_client,
        NodeReader(),
        gpu_resource="nvidia.com/gpu",
        roce_prefix="dsagent.io/gpu-roce",
        retry_s=0.05,
        watch_timeout_s=30,
        on_listed=lambda: listed.append(len(cache.all())),
    )
    cache.start()
    try:
        assert cache.wait_synced(10)
        deadline = time.monotonic() + 10  # reported just after the synced flags are set
        while len(listed) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(listed) == 3 and 3 in listed  # nodes, pods and NodeCaches, in any order
    finally:
        cache.stop()
        api_client.close()


def test_the_view_finds_any_cached_node_by_name_for_the_stripe_peer_credit(
    extender: tuple[httpx.Client, NodeCache],
) -> None:
    _, cache = extender
    view = View(NodeReader(), cache)
    found = view.node("holds")
    assert found is not None and found.name == "holds"
    assert view.node("nobody-knows") is None
    assert View(NodeReader(), None).node("holds") is None  # no watch cache: only the candidates are known


def test_a_nodecache_replaces_its_node_s_annotations_and_its_changes_arrive_through_the_watch(
    apiserver: FakeApiServer, extender: tuple[httpx.Client, NodeCache]
) -> None:
    """The rolling upgrade (docs/operator-guide/upgrade.md#nodecache): "holds" is an older
    agent's node (its annotation is read); once "empty" has a NodeCache, that is read instead
    of its annotation; a change of it alone (the Node unchanged) reaches the scores."""
    from tools.support.fake_apiserver import make_nodecache

    http, cache = extender
    uid = (apiserver.get("nodes", "empty") or {})["metadata"]["uid"]
    apiserver.create(make_nodecache("empty", inventory=inventory_json(datasets={"imagenet": holding()}), node_uid=uid))

    def empty_holds(expected: bool) -> bool:
        facts = cache.facts("empty")
        return (
            facts is not None and facts.inventory is not None and ("imagenet" in facts.inventory.datasets) is expected
        )

    apiserver.wait_for(lambda: empty_holds(True), what="the NodeCache in the cache")
    body = names_body(["holds", "empty"], datasets=IMAGENET)
    assert scores(http, body, "prioritize/dataset") == {"holds": 10, "empty": 10}
    apiserver.patch("nodecaches", "empty", {"status": {"inventory": inventory_json()}})
    apiserver.wait_for(lambda: empty_holds(False), what="the changed NodeCache in the cache")
    assert scores(http, body, "prioritize/dataset") == {"holds": 10, "empty": 0}
    assert cache.state("empty") is not None and cache.state("holds") is None
    apiserver.delete("nodes", "empty")  # the NodeCache goes with its Node
    apiserver.wait_for(lambda: cache.facts("empty") is None and cache.state("empty") is None, what="both gone")


def test_whole_nodes_are_kept_for_the_multi_worker_jobs_kube_scheduler_could_not_place(
    apiserver: FakeApiServer, extender: tuple[httpx.Client, NodeCache]
) -> None:
    http, cache = extender
    wide = {"labels": {"dsagent.io/job": "wide"}, "annotations": {"dsagent.io/workers": "3"}}
    for i in range(2):
        apiserver.create(make_pod(f"wide-{i}", gpus=8, **wide))  # type: ignore[arg-type]
    # a single-worker pod kube-scheduler could not place keeps nothing: only wide jobs wait whole
    apiserver.create(make_pod("solo", gpus=8))
    unschedulable = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    for name in ("wide-1", "solo"):
        apiserver.patch("pods", name, {"status": unschedulable}, "default", subresource="status")
    apiserver.wait_for(lambda: bool(cache.waiting().jobs), what="the unplaced wide job in the cache")
    assert set(cache.waiting().jobs) == {"default/wide"} and cache.waiting().jobs["default/wide"][0] == 8
    assert "dsplatform_extender_waiting_jobs 1.0" in http.get("/metrics").text

    later = pod("small-0", namespace="default", gpus=2)
    later["metadata"]["creationTimestamp"] = kubetime.format_time(time.time() + 3600)  # queued behind it
    body = args_body(later, [{"metadata": {"name": n}} for n in ("holds", "unannotated")], node_cache_capable=True)
    result = http.post("/filter", content=body).json()
    assert result["NodeNames"] == ["holds"]  # GPUs in use there; "unannotated" has all 8 free
    assert result["FailedNodes"]["unannotated"].startswith("node kept whole")
    # a pod queued ahead of the wide job is not held back
    earlier = pod("small-1", namespace="default", gpus=2)
    earlier["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    body = args_body(earlier, [{"metadata": {"name": n}} for n in ("holds", "unannotated")], node_cache_capable=True)
    assert http.post("/filter", content=body).json()["NodeNames"] == ["holds", "unannotated"]

    # bound (scheduled at last) or deleted, the job no longer waits
    apiserver.delete("pods", "wide-1", "default")
    apiserver.wait_for(lambda: not cache.waiting().jobs, what="the wide job no longer waiting")
    assert "dsplatform_extender_waiting_jobs 0.0" in http.get("/metrics").text
    body = args_body(later, [{"metadata": {"name": n}} for n in ("holds", "unannotated")], node_cache_capable=True)
    assert http.post("/filter", content=body).json()["NodeNames"] == ["holds", "unannotated"]


def test_a_waiting_job_keeps_only_the_nodes_its_pods_may_use(
    apiserver: FakeApiServer, extender: tuple[httpx.Client, NodeCache]
) -> None:
    """Node pools: a wide job for the h100 pool keeps a whole h100 node, never a whole node
    of another pool nor one whose taint its pods do not tolerate; a node relabelled into
    the pool is kept from then on (the watch); a job the pool could never hold keeps none."""
    http, cache = extender
    for name in ("h100-a", "h100-b"):
        pool = api_node(name, topology=TOPO, gpus=8)
        pool["metadata"]["labels"]["pool"] = "h100"
        apiserver.create(pool)
    tainted = api_node("h100-reserved", topology=TOPO, gpus=8)
    tainted["metadata"]["labels"]["pool"] = "h100"
    tainted["spec"] = {"taints": [{"key": "reserved", "value": "infra", "effect": "NoSchedule"}]}
    apiserver.create(tainted)
    unschedulable = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}

    def wait(job: str, workers: int) -> None:
        wide = make_pod(
            f"{job}-0", gpus=8, labels={"dsagent.io/job": job}, annotations={"dsagent.io/workers": str(workers)}
        )
        wide["spec"]["nodeSelector"] = {"pool": "h100"}
        apiserver.create(wide)
        apiserver.patch("pods", f"{job}-0", {"status": unschedulable}, "default", subresource="status")
        apiserver.wait_for(
            lambda: f"default/{job}" in cache.waiting().jobs, what=f"the unplaced job {job} in the cache"
        )

    later = pod("small-0", namespace="default", gpus=2)
    later["metadata"]["creationTimestamp"] = kubetime.format_time(time.time() + 3600)  # queued behind it
    candidates = ["holds", "unannotated", "h100-a", "h100-reserved"]
    body = args_body(later, [{"metadata": {"name": n}} for n in candidates], node_cache_capable=True)

    # 3 workers of 8 GPUs, and the pool's untainted nodes hold 2: it could never be placed
    wait("huge", 3)
    assert http.post("/filter", content=body).json()["NodeNames"] == candidates

    wait("wide", 2)
    result = http.post("/filter", content=body).json()
    assert result["NodeNames"] == ["holds", "unannotated", "h100-reserved"]
    assert set(result["FailedNodes"]) == {"h100-a"} and result["FailedNodes"]["h100-a"].startswith("node kept whole")

    # the whole node outside the pool joins it: kept from then on, and the pool now holds "huge"
    apiserver.patch("nodes", "unannotated", {"metadata": {"labels": {"pool": "h100"}}})
    apiserver.wait_for(
        lambda: "unannotated" in http.post("/filter", content=body).json()["FailedNodes"],
        what="the relabelled node kept for the wide job",
    )
    assert cache.waiting().nodes["default/huge"] == cache.waiting().nodes["default/wide"] != frozenset()

    # rules longer than any real selector (the API server admits pods of ~1.5 MB) are not kept
    outsized = make_pod(
        "outsized-0", gpus=8, labels={"dsagent.io/job": "outsized"}, annotations={"dsagent.io/workers": "2"}
    )
    outsized["spec"]["tolerations"] = [{"key": f"k{i:03d}-" + "x" * 80, "operator": "Exists"} for i in range(250)]
    apiserver.create(outsized)
    apiserver.patch("pods", "outsized-0", {"status": unschedulable}, "default", subresource="status")
    apiserver.wait_for(lambda: "default/outsized" in cache.waiting().jobs, what="the outsized job in the cache")
    assert cache.waiting().nodes["default/outsized"] == frozenset()
