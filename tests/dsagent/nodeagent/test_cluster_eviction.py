"""Cluster-aware eviction end to end (docs/design.md#cluster-eviction): the Dataset controller
counts ready copies from the Node inventories on the fake API server and writes them to a
ConfigMap; a real agent in cluster mode reads it, and a real fetch that must evict keeps the
cluster's last copy and evicts the version two other nodes also hold."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest

from dsagent.cache.layout import Store
from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsagent.nodeagent.clusteragent import ClusterAgent
from dsagent.nodeagent.clusterhooks import ClusterHooks
from dsagent.nodeagent.clustersettings import ClusterSettings
from dsagent.policy import copies
from dsplatform.wire import copycounts
from tests.dsagent.nodeagent.test_cluster_agent import NO_FLOOR, until
from tools.support.fake_apiserver import FakeApiServer, make_node

NS = "dsplatform"
NODE = "gpu-1"
FILES, FILE_BYTES = 4, 1000


def memory_source(tag: str, fill: int) -> str:
    root = f"memory://dsagent-copies/{tag}"
    fs = fsspec.filesystem("memory")
    for i in range(FILES):
        fs.pipe(f"{root.split('://', 1)[1]}/{i}.bin", bytes([fill + i]) * FILE_BYTES)
    return root


def inventory(node: str, datasets: dict[str, Any]) -> str:
    return json.dumps(
        {"version": 1, "node": node, "capacityBytes": 1 << 40, "freeBytes": 1 << 30, "datasets": datasets}
    )


@pytest.mark.slow
@pytest.mark.parametrize("counts", [True, False], ids=["with-cluster-counts", "plain-lru"])
def test_a_fetch_evicts_the_replicated_version_and_keeps_the_last_copy(
    apiserver: FakeApiServer, tmp_path: Path, counts: bool
) -> None:
    tag = f"{counts}-{tmp_path.name}"
    last, shared, new = (
        memory_source(f"{tag}/last", 0),
        memory_source(f"{tag}/shared", 50),
        memory_source(f"{tag}/new", 100),
    )
    root = tmp_path / "cache"
    block = Store(root).block_size
    size, overhead = FILES * FILE_BYTES, 2 * FILES * block
    # room for one held version plus the new one's 1.2x target, not for two held versions
    capacity = (size + overhead) + overhead + math.ceil(1.2 * size) + 100
    for name in (NODE, "gpu-2", "gpu-3"):
        apiserver.create(make_node(name))
    configmap = f"{NS}/{copycounts.CONFIGMAP}"
    cluster = ClusterSettings(publish_interval=0.05, watch_timeout=5, copies_configmap=configmap, copies_interval=3600)

    async def scenario() -> list[str]:
        settings = Settings(root=root, node_name=NODE, kubernetes=True, capacity_bytes=capacity, **NO_FLOOR)
        hooks = ClusterHooks(settings, cluster)
        service = CacheService(settings, hooks=hooks.for_service())
        await service.start()
        api_client = apiserver.api_client()
        agent = ClusterAgent(service, settings, api_client=api_client, topology=None, cluster=cluster, hooks=hooks)
        await agent.start()
        try:
            for task, name, source in (("t-last", "last", last), ("t-shared", "shared", shared)):
                await service.submit_task(task, [DatasetRequest(name, source)], wait=30)
                await service.release_task(task)
                await asyncio.sleep(0.01)  # "last" is the least recently used
            digests = {v["name"]: v["digest"] for v in await service.datasets()}
            # two other nodes hold "shared" ready; nobody else holds "last"
            held = {"shared": {"digest": digests["shared"], "state": "ready"}}
            for other in ("gpu-2", "gpu-3"):
                apiserver.patch(
                    "nodes", other, {"metadata": {"annotations": {"dsagent.io/inventory": inventory(other, held)}}}
                )

            def own_inventory() -> dict[str, Any]:  # from its NodeCache (the other nodes: older agents' annotations)
                cache = apiserver.get("nodecaches", NODE) or {}
                text = (cache.get("status") or {}).get("inventory")
                return json.loads(text)["datasets"] if text else {}

            def both_ready() -> bool:
                listed = own_inventory()
                return all((listed.get(name) or {}).get("state") == "ready" for name in ("last", "shared"))

            await until(both_ready, what="the agent's inventory listing both ready")
            controller = DatasetController(apiserver.api_client(), ControllerSettings(namespace=NS, identity="c-1"))
            await asyncio.to_thread(controller.reconcile_all)
            document = (apiserver.get("configmaps", copycounts.CONFIGMAP, NS) or {})["data"][copycounts.DATA_KEY]
            assert json.loads(document)["copies"] == {
                f"last@{digests['last']}": 1,
                f"shared@{digests['shared']}": 3,
            }
            # another holder keeps "shared": to this node it is a replicated copy
            assert json.loads(document)["keepers"][f"shared@{digests['shared']}"] in ("gpu-2", "gpu-3")
            if counts:
                assert await agent.read_copies() is True
            await service.submit_task("t-new", [DatasetRequest("new", new)], wait=30)
            record = await service.get_task("t-new")
            assert record.datasets[0].state == "ready"
            return sorted(v["name"] for v in await service.datasets())
        finally:
            await agent.stop()
            await service.stop()
            await asyncio.to_thread(api_client.close)

    kept = asyncio.run(scenario())
    # with the counts the replicated version goes; without them plain LRU takes the last copy
    assert kept == (["last", "new"] if counts else ["new", "shared"])


def test_the_controller_rewrites_the_counts_and_skips_hostile_inventories(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    digest = "b" * 32
    good = inventory(
        "n1", {"data": {"digest": digest, "state": "ready", "versions": [{"digest": "c" * 32, "state": "ready"}]}}
    )
    apiserver.create(make_node("n1", annotations={"dsagent.io/inventory": good}))
    apiserver.create(make_node("n2", annotations={"dsagent.io/inventory": "{not json"}))
    apiserver.create(
        make_node(
            "n3",
            annotations={
                "dsagent.io/inventory": inventory(
                    "n3",
                    {
                        "data": {"digest": digest, "state": "fetching"},
                        "../evil": {"digest": digest, "state": "ready"},
                        "other": {"digest": "not-a-digest", "state": "ready"},
                    },
                )
            },
        )
    )
    controller = DatasetController(api_client, ControllerSettings(namespace=NS, identity="c-1"), clock=lambda: 1000.0)
    controller.reconcile_all()
    text = (apiserver.get("configmaps", copycounts.CONFIGMAP, NS) or {})["data"][copycounts.DATA_KEY]
    assert json.loads(text) == {
        "version": 1, "at": 1000.0, "copies": {f"data@{digest}": 1, f"data@{'c' * 32}": 1}, "keepers": {},
    }  # fmt: skip
    apiserver.patch("nodes", "n3", {"metadata": {"annotations": {"dsagent.io/inventory": good}}})
    controller.reconcile_all()
    parsed = copycounts.parse_copies(
        (apiserver.get("configmaps", copycounts.CONFIGMAP, NS) or {})["data"][copycounts.DATA_KEY]
    )
    assert parsed is not None and parsed.counts == {("data", digest): 2, ("data", "c" * 32): 2}
    # a keeper for each version two nodes hold: one of the holders, named by the Node's name
    assert set(parsed.keepers) == set(parsed.counts) and set(parsed.keepers.values()) <= {"n1", "n3"}


def test_the_agent_ignores_a_hostile_or_stale_document(apiserver: FakeApiServer, tmp_path: Path) -> None:
    apiserver.create(make_node(NODE))
    apiserver.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "counts", "namespace": NS},
            "data": {copycounts.DATA_KEY: "[1, 2"},
        }
    )
    cluster = ClusterSettings(
        publish_interval=3600, watch_timeout=5, copies_configmap=f"{NS}/counts", copies_interval=3600
    )

    async def scenario() -> None:
        settings = Settings(root=tmp_path, node_name=NODE, kubernetes=True, **NO_FLOOR)
        hooks = ClusterHooks(settings, cluster)
        service = CacheService(settings, hooks=hooks.for_service())
        await service.start()
        api_client = apiserver.api_client()
        agent = ClusterAgent(service, settings, api_client=api_client, topology=None, cluster=cluster, hooks=hooks)
        await agent.start()
        try:
            assert await agent.read_copies() is False
            assert service.node.copies.made_at is None
            stale = copycounts.copies_document({("data", "d" * 32): 5}, at=service.clock() - 3600)
            apiserver.patch("configmaps", "counts", {"data": {copycounts.DATA_KEY: stale}}, namespace=NS)
            assert await agent.read_copies() is True
            # read, but an hour old: the policy gets "unknown", i.e. plain LRU
            assert service.node.copies.others("data", "d" * 32, ready_here=True, now=service.clock()) is None
        finally:
            await agent.stop()
            await service.stop()
            await asyncio.to_thread(api_client.close)

    asyncio.run(scenario())


def test_the_agent_reads_the_counts_in_the_background(apiserver: FakeApiServer, tmp_path: Path) -> None:
    apiserver.create(make_node(NODE))
    document = copycounts.copies_document({("data", "e" * 32): 4}, at=time.time())
    apiserver.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": NS},
            "data": {copycounts.DATA_KEY: document},
        }
    )
    cluster = ClusterSettings(publish_interval=3600, watch_timeout=5, copies_configmap=f"{NS}/c", copies_interval=0.05)

    async def scenario() -> None:
        settings = Settings(root=tmp_path, node_name=NODE, kubernetes=True, **NO_FLOOR)
        hooks = ClusterHooks(settings, cluster)
        service = CacheService(settings, hooks=hooks.for_service())
        await service.start()
        api_client = apiserver.api_client()
        agent = ClusterAgent(service, settings, api_client=api_client, topology=None, cluster=cluster, hooks=hooks)
        await agent.start()
        try:
            await until(lambda: service.node.copies.made_at is not None, what="the first read")
            assert service.node.copies.others("data", "e" * 32, ready_here=True, now=service.clock()) == 3
            assert service.node.copies.others("data", "e" * 32, ready_here=False, now=service.clock()) == 4
        finally:
            await agent.stop()
            await service.stop()
            await asyncio.to_thread(api_client.close)

    asyncio.run(scenario())


def test_bad_copy_settings_are_refused() -> None:
    from dsagent.errors import SettingsError

    for bad in ("no-slash", "Bad_NS/x", "ns/"):
        with pytest.raises(SettingsError):
            ClusterSettings.from_env({"DSAGENT_COPIES_CONFIGMAP": bad})
    assert ClusterSettings.from_env({"DSAGENT_COPIES_CONFIGMAP": ""}).copies_configmap is None
    off = ControllerSettings.from_env({"DSAGENT_CONTROLLER_COPIES_CONFIGMAP": "off"})
    assert off.copies_configmap is None
    assert ControllerSettings.from_env({}).copies_configmap == copycounts.CONFIGMAP


def test_a_versions_keeper_holds_its_copy_as_the_last_and_the_others_as_replicated() -> None:
    """Counts can be a resync old: two nodes holding a version's only two copies, short of
    room at once, would each count the other's and evict both. The keeper never does."""
    v, w = ("data", "a" * 32), ("data", "b" * 32)
    holding = {"version": 1, "datasets": {"data": {"digest": v[1], "state": "ready", "versions": [
        {"digest": v[1], "state": "ready"}, {"digest": w[1], "state": "ready"}]}}}  # fmt: skip
    inventories = {f"gpu-{i}": holding for i in range(1, 5)}
    inventories["gpu-5"] = {"version": 1, "datasets": {"data": {"digest": w[1], "state": "fetching"}}}
    kept = copies.keepers(inventories)
    assert set(kept) == {v, w} and {kept[v], kept[w]} <= {"gpu-1", "gpu-2", "gpu-3", "gpu-4"}
    assert copies.keepers({"gpu-1": holding}) == {}  # one copy: nobody to agree with
    # the keeper stays the same when another holder leaves (rendezvous hashing)
    others = {n: inv for n, inv in inventories.items() if n not in (kept[v], "gpu-5")}
    assert copies.keepers({**dict(list(others.items())[:2]), kept[v]: holding})[v] == kept[v]
    published = copycounts.parse_copies(copycounts.copies_document({v: 4, w: 4}, at=100.0, keepers=kept))
    assert published is not None and published.keepers == kept
    for node in inventories:
        view = copies.ClusterCopies()
        view.update(published.counts, published.at, published.keepers, node)
        expected = 0 if node == kept[v] else 3
        assert view.others(*v, ready_here=True, now=100.0) == expected
        assert view.others(*v, ready_here=False, now=100.0) == 4  # a node that does not hold it
    # hostile keepers are skipped: not a string, too long, for a version without a count
    text = json.dumps({"version": 1, "at": 1.0, "copies": {f"data@{v[1]}": 2},
                       "keepers": {f"data@{v[1]}": 7, f"data@{w[1]}": "gpu-1"}})  # fmt: skip
    assert copycounts.parse_copies(text) == copycounts.Published({v: 2}, 1.0, {})
    text = json.dumps({"version": 1, "at": 1.0, "copies": {f"data@{v[1]}": 2}, "keepers": {f"data@{v[1]}": "x" * 300}})
    assert copycounts.parse_copies(text) == copycounts.Published({v: 2}, 1.0, {})
    # an agent of an earlier release reads the counts and ignores the keepers (the same
    # version-1 document): nothing it did changes
    assert json.loads(copycounts.copies_document({v: 2}, at=1.0, keepers={v: "gpu-1"}))["copies"] == {f"data@{v[1]}": 2}


def test_a_share_holding_every_bundle_counts_as_a_copy_and_a_partial_one_does_not() -> None:
    """A whole copy kept as a stripe share serves any peer every bundle: the counts count it,
    with the unpacked ready copies (one per node, however it holds it); a share still filling,
    or a hostile entry, counts nothing."""
    v = ("imgs", "a" * 32)

    def share(held: Any, size: Any = 1000, digest: str = v[1]) -> dict[str, Any]:
        return {"version": 1, "stripes": {"imgs": {"digest": digest, "sizeBytes": size, "heldBytes": held}}}

    both = {**share(1000), "datasets": {"imgs": {"digest": v[1], "state": "ready"}}}
    inventories = {
        "n1": share(1000), "n2": both, "n3": share(999), "n4": share(True, True), "n5": share("1000", "1000"),
        "n6": share(1000, digest="not-a-digest"), "n7": share(2000, 0),
    }  # fmt: skip
    counted = copies.tally(inventories)
    assert counted.counts == {v: 2} and counted.keepers[v] in {"n1", "n2"}
    assert copies.count_copies(inventories.values()) == {v: 2}
