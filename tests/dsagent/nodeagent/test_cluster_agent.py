"""The agent in cluster mode against the fake API server, with a real CacheService."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.errors import InvalidInput, NotFound
from dsagent.nodeagent.clusteragent import ClusterAgent
from dsagent.nodeagent.clusterhooks import ClusterHooks, TaskNotOnNode
from dsagent.nodeagent.clustersettings import ClusterSettings
from dsagent.webhook.mutation import Injection, ResolvedDataset, mutate
from dsplatform.published import FOLLOW_UPS
from gpu_topology.dumps import load_dump
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_dataset, make_node, make_pod

#: Cluster mode keeps 25% of the disk free by default (the reserve and the kubelet's
#: threshold): here the test machine's own disk fullness must not decide a test. The floor
#: itself is tested in tests/dsagent/cache/test_disk_floor.py.
NO_FLOOR: dict[str, Any] = {"reserve": 0, "nodefs_available": 0}

NODE = "gpu-1"
#: A capacity well under any test disk's free space, so that the inventory's ``freeBytes``
#: moves only with this agent's cache: other tests writing to the same disk would otherwise
#: move it across a rounding step and count as a change to publish.
CAPACITY = 1 << 30
FAST = ClusterSettings(publish_interval=0.05, watch_timeout=5, guard_wait=0.5)


async def until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def cluster_agent(
    apiserver: FakeApiServer,
    root: Path,
    *,
    topology: Any = None,
    cluster: ClusterSettings = FAST,
    lease_ttl: float = 3600,
    roce_classes: str = "numa",
    capacity_bytes: int | None = CAPACITY,
    clock: Callable[[], float] | None = None,
) -> AsyncIterator[ClusterAgent]:
    settings = Settings(
        root=root,
        node_name=NODE,
        kubernetes=True,
        **NO_FLOOR,
        lease_ttl=lease_ttl,
        roce_classes=roce_classes,
        capacity_bytes=capacity_bytes,
    )
    hooks = ClusterHooks(settings, cluster)
    service = CacheService(settings, hooks=hooks.for_service())
    await service.start()
    api_client = apiserver.api_client()
    agent = ClusterAgent(service, settings, api_client=api_client, topology=topology, cluster=cluster, hooks=hooks)
    if clock is not None:
        agent.clock = clock  # the publisher's clock from its first write on
    await agent.start()
    try:
        assert agent._watch is not None
        await until(agent._watch.synced.is_set, what="the first list")
        yield agent
    finally:
        await agent.stop()
        await service.stop()
        await asyncio.to_thread(api_client.close)


async def task_or_none(service: CacheService, uid: str) -> Any:
    try:
        return await service.get_task(uid)
    except NotFound:
        return None


async def until_released(agent: ClusterAgent, uid: str) -> None:
    deadline = time.monotonic() + 10
    while await task_or_none(agent.service, uid) is not None:
        assert time.monotonic() < deadline, f"task {uid} was not released"
        await asyncio.sleep(0.02)
    assert uid in agent.released and uid not in agent._tasks


def inline(name: str, source: str) -> str:
    return json.dumps([{"name": name, "source": source}])


def node_annotations(apiserver: FakeApiServer) -> dict[str, str]:
    node = apiserver.get("nodes", NODE)
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


def node_cache(apiserver: FakeApiServer) -> dict[str, Any]:
    """The status of the node's NodeCache ({} when there is none)."""
    obj = apiserver.get("nodecaches", NODE)
    return dict(obj.get("status") or {}) if obj is not None else {}


# -- publishing: the NodeCache and the Node's free GPUs


def test_the_inventory_is_published_in_the_nodecache_only_on_change_and_emptied_on_stop(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    # the Node as an agent of the release before left it: its inventory annotations go
    legacy = {"dsagent.io/inventory": '{"datasets":{}}', "dsagent.io/published-at": "2020-01-01T00:00:00Z"}
    node = apiserver.create(make_node(NODE, annotations={"unrelated": "kept", **legacy}))
    manual = ClusterSettings(publish_interval=3600, watch_timeout=5)

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, cluster=manual) as agent:
            await until(lambda: agent.patches == 1, what="the first publish")
            cache = apiserver.get("nodecaches", NODE)
            assert cache is not None
            assert cache["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]}
            ]
            inventory = json.loads(node_cache(apiserver)["inventory"])
            assert inventory["node"] == NODE and inventory["datasets"] == {}
            assert node_annotations(apiserver) == {"unrelated": "kept"}  # the old annotations removed
            assert await agent.publish_once() is False  # nothing changed: no request at all
            writes = len(apiserver.requests_matching("PATCH")) + len(apiserver.requests_matching("POST"))
            await agent.service.submit_task("cli-op", [DatasetRequest("tiny", memory_dataset)], wait=10)
            assert await agent.publish_once() is False  # changed, but within the interval
            later = time.monotonic() + 7200
            agent.clock = lambda: later
            assert await agent.publish_once() is True
            published = json.loads(node_cache(apiserver)["inventory"])
            assert published["datasets"]["tiny"]["state"] == "ready"
            assert await agent.publish_once() is False
            assert len(apiserver.requests_matching("PATCH")) + len(apiserver.requests_matching("POST")) == writes + 1
            [patch] = apiserver.requests_matching("PATCH", f"/apis/dsagent.io/v1alpha1/nodecaches/{NODE}")[-1:]
            assert patch.content_type == "application/merge-patch+json"
            assert "inventory" in patch.body["status"] and set(patch.body["status"]) <= {"inventory", "publishedAt"}
            metrics = agent.service.metrics.render()
            assert 'dsplatform_agent_state_writes_total{object="nodecache"} 2.0' in metrics
            assert 'dsplatform_agent_state_writes_total{object="node"} 1.0' in metrics
        assert node_annotations(apiserver) == {"unrelated": "kept"}
        assert "inventory" not in node_cache(apiserver)  # emptied as the agent stopped

    asyncio.run(scenario())


def test_patches_are_rate_limited_to_the_publish_interval(apiserver: FakeApiServer, tmp_path: Path) -> None:
    apiserver.create(make_node(NODE))
    slow = ClusterSettings(publish_interval=3600, watch_timeout=5)

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, cluster=slow) as agent:
            await until(lambda: agent.patches == 1, what="the first publish")
            await agent.service.submit_task("cli-op", [DatasetRequest("x", "memory://nowhere/x")])
            await asyncio.sleep(0.3)
            assert agent.patches == 1  # the change waits for the next interval

    asyncio.run(scenario())


@pytest.mark.slow  # a burst of 100 tasks, then a few of the publisher's polls
def test_a_burst_of_changes_is_written_once_at_the_end_of_the_interval(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    """The publisher polls every interval in real time; the clock it measures the interval by
    is the test's, so that the burst lies within one interval however slow the machine is:
    it moves by 5 ms a change, 0.5 s over the 100, while the publisher polls and writes nothing.
    The write comes at the interval's end (the first write's time + the interval), not before."""
    apiserver.create(make_node(NODE))
    interval = ClusterSettings(publish_interval=1.0, watch_timeout=5)
    first = 1000.0
    now = first

    async def scenario() -> None:
        nonlocal now
        async with cluster_agent(apiserver, tmp_path, cluster=interval, clock=lambda: now) as agent:
            await until(lambda: agent.patches == 1, what="the first publish")  # at ``first``
            for i in range(100):  # 100 changes of the cache within the interval
                await agent.service.submit_task(f"cli-{i}", [DatasetRequest(f"d{i}", memory_dataset)], wait=10)
                now = first + (i + 1) * 0.005
            assert agent.patches == 1, "nothing written within the interval"
            now = first + 0.999
            assert await agent.publish_once() is False  # changed, but the interval has not ended
            now = first + 1.0
            await until(lambda: agent.patches == 2, what="the write at the end of the interval")
            now = first + 3.0  # the interval long past: a change would be written at once
            await asyncio.sleep(2.5)  # two polls or more
            assert agent.patches == 2  # one write for the whole burst, none since
            names = json.loads(node_cache(apiserver)["inventory"])["datasets"]
            assert {f"d{i}" for i in range(100)} <= set(names)  # the latest state, all of it

    asyncio.run(scenario())


def test_topology_in_the_nodecache_and_free_gpus_on_the_node_withdrawn_when_pods_use_gpus(
    apiserver: FakeApiServer, tmp_path: Path, fixtures_dir: Path
) -> None:
    apiserver.create(make_node(NODE))
    topology = load_dump(fixtures_dir / "topology" / "dgx1-v100-4ib-nvidia-smi-topo-m.txt")

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, topology=topology):
            await until(lambda: "dsagent.io/free-gpus" in node_annotations(apiserver), what="free GPUs")
            annotations = node_annotations(apiserver)
            assert annotations == {"dsagent.io/free-gpus": ",".join(str(i) for i in range(len(topology.gpus)))}
            published = json.loads(node_cache(apiserver)["topology"])
            assert published["version"] == 1 and len(published["gpus"]) == len(topology.gpus)
            apiserver.create(make_pod("trainer", node_name=NODE, gpus=4, phase="Running"))
            await until(lambda: "dsagent.io/free-gpus" not in node_annotations(apiserver), what="withdrawal")
            assert "topology" in node_cache(apiserver)

    asyncio.run(scenario())


def test_the_namespaces_of_running_pods_that_name_a_follow_up_are_on_the_node_while_they_run(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.create(make_node(NODE))
    naming = {"dsagent.io/next-job": "train-b"}

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, cluster=ClusterSettings(publish_interval=0.2, watch_timeout=5)):
            apiserver.create(make_pod("plain", namespace="ml", node_name=NODE, phase="Running"))
            apiserver.create(make_pod("a-0", namespace="ml", node_name=NODE, annotations=naming, phase="Running"))
            apiserver.create(make_pod("b-0", namespace="team-b", node_name=NODE, annotations=naming, phase="Running"))
            apiserver.create(make_pod("elsewhere", namespace="other", node_name="gpu-9", annotations=naming))
            bad = {"dsagent.io/next-job": "Not A Name"}
            apiserver.create(make_pod("typo", namespace="typo", node_name=NODE, annotations=bad, phase="Running"))
            await until(lambda: node_annotations(apiserver).get(FOLLOW_UPS) == "ml,team-b", what="follow-ups")
            apiserver.patch("pods", "b-0", {"status": {"phase": "Succeeded"}}, namespace="team-b")
            await until(lambda: node_annotations(apiserver).get(FOLLOW_UPS) == "ml", what="one ended")
            apiserver.delete("pods", "a-0", namespace="ml")
            await until(lambda: FOLLOW_UPS not in node_annotations(apiserver), what="withdrawal")

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("mode", "classes"), [("numa", [[0, 1, 2, 3], [4, 5, 6, 7]]), ("none", [list(range(8))]), ("subnet", [])]
)
def test_the_published_classes_follow_the_operator_s_class_mode(
    apiserver: FakeApiServer, tmp_path: Path, fixtures_dir: Path, mode: str, classes: list[list[int]]
) -> None:
    # The DGX-1 fixture knows no NIC subnets: subnet mode publishes the topology without classes.
    apiserver.create(make_node(NODE))
    topology = load_dump(fixtures_dir / "topology" / "dgx1-v100-4ib-nvidia-smi-topo-m.txt")
    roce_classes = Settings.from_env({"DSAGENT_ROCE_CLASSES": mode}).roce_classes

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, topology=topology, roce_classes=roce_classes):
            await until(lambda: "topology" in node_cache(apiserver), what="topology")
            published = json.loads(node_cache(apiserver)["topology"])
            assert [c["gpus"] for c in published["classes"]] == classes
            assert published.get("classMode") == (None if mode == "subnet" else mode)

    asyncio.run(scenario())


def test_an_unknown_class_mode_is_refused_at_start_up() -> None:
    with pytest.raises(InvalidInput, match="DSAGENT_ROCE_CLASSES"):
        Settings.from_env({"DSAGENT_ROCE_CLASSES": "per-nic"})


# -- pods: caching at bind time, in use while running, released at the end


def test_caching_starts_when_the_pod_is_bound_before_its_containers_start(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    apiserver.create(make_node(NODE))
    pod = apiserver.create(make_pod("train-0", annotations={"dsagent.io/datasets": inline("tiny", memory_dataset)}))
    uid = pod["metadata"]["uid"]

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await asyncio.sleep(0.2)
            assert await task_or_none(agent.service, uid) is None  # not bound yet: nothing to do
            apiserver.patch("pods", "train-0", {"spec": {"nodeName": NODE}})  # the scheduler binds it
            await until(lambda: uid in agent._tasks, what="the task")
            record = await agent.service.get_task(uid)
            assert [d.name for d in record.datasets] == ["tiny"]
            assert apiserver.get("pods", "train-0")["status"]["phase"] == "Pending"  # containers not started
            for _ in range(200):
                if (await agent.service.get_task(uid)).state == "ready":
                    break
                await asyncio.sleep(0.05)
            assert (await agent.service.get_task(uid)).state == "ready"
            [view] = await agent.service.datasets()
            assert view["inUse"] is True

    asyncio.run(scenario())


@pytest.mark.parametrize("ending", ["deleted", "succeeded"])
def test_a_pod_that_ends_releases_its_datasets(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str, ending: str
) -> None:
    apiserver.create(make_node(NODE))
    pod = apiserver.create(
        make_pod(
            "train-0",
            node_name=NODE,
            phase="Running",
            annotations={"dsagent.io/datasets": inline("tiny", memory_dataset)},
        )
    )
    uid = pod["metadata"]["uid"]

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(lambda: uid in agent._tasks, what="the task")
            await agent.service.submit_task(uid, [DatasetRequest("tiny", memory_dataset)], wait=10)
            if ending == "deleted":
                apiserver.delete("pods", "train-0")
            else:
                apiserver.patch("pods", "train-0", {"status": {"phase": "Succeeded"}})
            await until_released(agent, uid)
            [view] = await agent.service.datasets()
            assert view["inUse"] is False and view["state"] == "ready"  # still cached, now evictable

    asyncio.run(scenario())


def test_a_pod_deleted_while_the_api_server_was_down_is_released_after_410_gone(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    apiserver.create(make_node(NODE))
    pod = apiserver.create(
        make_pod(
            "train-0",
            node_name=NODE,
            phase="Running",
            annotations={"dsagent.io/datasets": inline("tiny", memory_dataset)},
        )
    )
    uid = pod["metadata"]["uid"]

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(lambda: uid in agent._tasks, what="the task")
            assert agent._watch is not None
            relists = agent._watch.relists
            await asyncio.to_thread(apiserver.stop)
            apiserver.delete("pods", "train-0")  # while the agent cannot see it
            apiserver.compact()  # and its watch history is gone
            await asyncio.to_thread(apiserver.start)
            await until_released(agent, uid)
            assert agent._watch.relists > relists
            later = apiserver.create(
                make_pod(
                    "train-1",
                    node_name=NODE,
                    phase="Pending",
                    annotations={"dsagent.io/datasets": inline("tiny", memory_dataset)},
                )
            )
            await until(lambda: later["metadata"]["uid"] in agent._tasks, what="the watch after the restart")

    asyncio.run(scenario())


def test_tasks_of_pods_deleted_while_the_agent_was_down_are_released_at_start(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    apiserver.create(make_node(NODE))
    live = apiserver.create(
        make_pod(
            "train-live",
            node_name=NODE,
            phase="Running",
            annotations={"dsagent.io/datasets": inline("tiny", memory_dataset)},
        )
    )
    gone_uid = "0b7e6a52-4b8e-4c3a-9a51-6d1f0e1c2b3a"  # a pod deleted while the agent was down

    async def scenario() -> None:
        settings = Settings(root=tmp_path, node_name=NODE, kubernetes=True, **NO_FLOOR)
        service = CacheService(settings)
        await service.start()
        await service.submit_task(gone_uid, [DatasetRequest("tiny", memory_dataset)], wait=10)
        await service.submit_task("manual-job", [DatasetRequest("tiny", memory_dataset)])
        await service.stop()
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until_released(agent, gone_uid)
            await until(lambda: live["metadata"]["uid"] in agent._tasks, what="the live pod's task")
            remaining = await agent.service.task_ids()
            assert "manual-job" in remaining  # not a pod UID: not the cluster agent's to release
            assert live["metadata"]["uid"] in remaining

    asyncio.run(scenario())


def test_the_watch_resumes_after_an_api_server_restart_without_relisting(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    apiserver.create(make_node(NODE))

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            assert agent._watch is not None
            relists = agent._watch.relists
            await asyncio.to_thread(apiserver.restart)
            pod = apiserver.create(
                make_pod("p", node_name=NODE, annotations={"dsagent.io/datasets": inline("tiny", memory_dataset)})
            )
            await until(lambda: pod["metadata"]["uid"] in agent._tasks, what="the pod after the restart")
            assert agent._watch.relists == relists

    asyncio.run(scenario())


def test_bookmarks_move_the_watch_forward(apiserver: FakeApiServer, tmp_path: Path) -> None:
    apiserver.create(make_node(NODE))

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            assert agent._watch is not None
            apiserver.create(make_pod("elsewhere", node_name="gpu-2"))  # moves the resourceVersion
            await until(lambda: apiserver.open_watches >= 1, what="the watch")
            apiserver.send_bookmarks()
            current = str(apiserver.store.rv)
            await until(
                lambda: agent._watch is not None and agent._watch.resource_version == current, what="the bookmark"
            )
            watches = apiserver.requests_matching("GET", "/api/v1/pods", watch=True)
            assert watches[-1].query["allowWatchBookmarks"] == "true"
            assert watches[-1].query["fieldSelector"] == f"spec.nodeName={NODE}"

    asyncio.run(scenario())


# -- Datasets, init-containers and the task guard


def test_a_named_dataset_is_resolved_through_its_dataset_resource(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    apiserver.create(make_node(NODE))
    apiserver.create(make_dataset("tiny", namespace="ml", source=memory_dataset))
    pod = apiserver.create(make_pod("p", namespace="ml", node_name=NODE, annotations={"dsagent.io/datasets": "tiny"}))

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(lambda: pod["metadata"]["uid"] in agent._tasks, what="the task")
            [request] = agent._tasks[pod["metadata"]["uid"]]
            assert request.source == memory_dataset
            assert apiserver.requests_matching("GET", "/apis/dsagent.io/v1alpha1/namespaces/ml/datasets/tiny")

    asyncio.run(scenario())


def test_datasets_needing_secrets_are_left_to_the_init_container(apiserver: FakeApiServer, tmp_path: Path) -> None:
    apiserver.create(make_node(NODE))
    secret = make_dataset("private", source="s3://corp/private")
    secret["spec"]["storageSecretRef"] = {"name": "creds"}
    apiserver.create(secret)
    pod = apiserver.create(make_pod("p", node_name=NODE, annotations={"dsagent.io/datasets": "private"}))

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(
                lambda: apiserver.requests_matching(
                    "GET", "/apis/dsagent.io/v1alpha1/namespaces/default/datasets/private"
                )
            )
            await asyncio.sleep(0.2)
            assert pod["metadata"]["uid"] not in agent._tasks
            assert await task_or_none(agent.service, pod["metadata"]["uid"]) is None

    asyncio.run(scenario())


def test_a_pod_left_to_its_init_container_is_not_resolved_again_on_every_update(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.create(make_node(NODE))
    secret = make_dataset("private", source="s3://corp/private")
    secret["spec"]["storageSecretRef"] = {"name": "creds"}
    apiserver.create(secret)
    apiserver.create(make_pod("p", node_name=NODE, annotations={"dsagent.io/datasets": "private"}))
    lookup = ("GET", "/apis/dsagent.io/v1alpha1/namespaces/default/datasets/private")

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(lambda: apiserver.requests_matching(*lookup), what="the first lookup")
            for phase in ("Pending", "Running", "Running"):  # the kubelet's status updates
                apiserver.patch("pods", "p", {"status": {"phase": phase, "message": phase}})
            later = apiserver.create(make_pod("q", node_name=NODE))  # an event after those three
            assert agent._watch is not None
            watch = agent._watch
            await until(lambda: watch.has_pod(later["metadata"]["uid"]), what="the later pod")
            await asyncio.sleep(0.2)
            assert len(apiserver.requests_matching(*lookup)) == 1

    asyncio.run(scenario())


def test_the_agent_sends_what_the_init_container_will_and_its_repeat_is_a_no_op(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    apiserver.create(make_node(NODE))
    pod = make_pod("p", annotations={"dsagent.io/datasets": "tiny"})
    pod = json_patch(pod, mutate(pod, (ResolvedDataset("tiny", memory_dataset),), Injection(image="img:1")))
    pod["spec"]["nodeName"] = NODE
    uid = apiserver.create(pod)["metadata"]["uid"]

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(lambda: uid in agent._tasks, what="the task")
            first = await agent.service.get_task(uid)
            init_env = {e["name"]: e.get("value") for e in pod["spec"]["initContainers"][0]["env"]}
            items = json.loads(init_env["DSAGENT_DATASETS"])
            again = await agent.service.submit_task(uid, [DatasetRequest(i["name"], i["source"]) for i in items])
            assert again.created_at == first.created_at  # the same record: docs/design.md#rule-1

    asyncio.run(scenario())


def test_the_agent_reads_the_init_container_environment_exactly_as_dsctl_does(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    from dsagent.cli.cache import datasets_from_env

    apiserver.create(make_node(NODE))
    pod = make_pod("p", annotations={"dsagent.io/datasets": "tiny"})
    pod = json_patch(pod, mutate(pod, (ResolvedDataset("tiny", memory_dataset),), Injection(image="img:1")))
    # What an operator may add: a default bundle store (docs/user-guide/kubernetes.md), and an empty per-dataset one.
    env = pod["spec"]["initContainers"][0]["env"]
    env.append({"name": "DSAGENT_BUNDLES", "value": "memory://no-store-yet"})
    for e in env:
        if e["name"] == "DSAGENT_DATASETS":
            e["value"] = json.dumps([{**item, "bundles": ""} for item in json.loads(e["value"])])
    pod["spec"]["nodeName"] = NODE
    uid = apiserver.create(pod)["metadata"]["uid"]

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(lambda: uid in agent._tasks, what="the task")
            first = await agent.service.get_task(uid)
            sent = datasets_from_env(
                {e["name"]: e["value"] for e in env if "value" in e}
            )  # the init-container's request
            again = await agent.service.submit_task(uid, [DatasetRequest(**d) for d in sent])
            assert again.created_at == first.created_at  # the same task, not a Conflict

    asyncio.run(scenario())


def test_task_ids_shaped_like_pod_uids_must_be_pods_on_this_node(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    apiserver.create(make_node(NODE))
    here = apiserver.create(make_pod("here", node_name=NODE))["metadata"]["uid"]
    there = apiserver.create(make_pod("there", node_name="gpu-2"))["metadata"]["uid"]
    request = [DatasetRequest("tiny", memory_dataset)]

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            service = agent.service
            with pytest.raises(TaskNotOnNode) as info:
                await service.submit_task(there, request)  # what the HTTP API calls
            assert info.value.http_status == 403 and NODE in str(info.value)
            assert (await service.submit_task(here, request)).task_id == here
            assert (await service.submit_task("cli-operator-job", request)).task_id == "cli-operator-job"
        assert "submit_task" not in vars(service)  # after stop the service is itself again

    asyncio.run(scenario())


def test_running_pods_keep_their_lease_renewed(apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str) -> None:
    apiserver.create(make_node(NODE))
    uid = apiserver.create(
        make_pod(
            "p", node_name=NODE, phase="Running", annotations={"dsagent.io/datasets": inline("tiny", memory_dataset)}
        )
    )["metadata"]["uid"]
    renewing = ClusterSettings(publish_interval=0.05, watch_timeout=5, renew_interval=0.1)

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, cluster=renewing) as agent:
            await until(lambda: uid in agent._tasks, what="the task")
            first = (await agent.service.get_task(uid)).lease_until
            await asyncio.sleep(0.4)
            assert (await agent.service.get_task(uid)).lease_until > first

    asyncio.run(scenario())


def test_cluster_settings_come_from_the_environment() -> None:
    assert ClusterSettings.from_env({"DSAGENT_PUBLISH_INTERVAL": "30s"}).publish_interval == 30
    with pytest.raises(Exception, match="DSAGENT_PUBLISH_INTERVAL"):
        ClusterSettings.from_env({"DSAGENT_PUBLISH_INTERVAL": "soon"})


def test_a_wrong_node_name_fails_fast_with_the_fix(apiserver: FakeApiServer, tmp_path: Path) -> None:
    from dsagent.errors import InvalidInput

    async def scenario() -> None:
        settings = Settings(root=tmp_path, node_name="train-pod-7f9c", kubernetes=True, **NO_FLOOR)
        hooks = ClusterHooks(settings, FAST)
        service = CacheService(settings, hooks=hooks.for_service())
        await service.start()
        agent = ClusterAgent(
            service, settings, api_client=apiserver.api_client(), topology=None, cluster=FAST, hooks=hooks
        )
        try:
            with pytest.raises(InvalidInput) as info:
                await agent.start()
            assert "DSAGENT_NODE_NAME" in str(info.value)
        finally:
            await service.stop()

    asyncio.run(scenario())


def test_an_unreachable_api_server_does_not_stop_the_agent(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    apiserver.create(make_node(NODE))
    apiserver.stop()

    async def scenario() -> None:
        settings = Settings(root=tmp_path, node_name=NODE, kubernetes=True, **NO_FLOOR)
        hooks = ClusterHooks(settings, FAST)
        service = CacheService(settings, hooks=hooks.for_service())
        await service.start()
        api_client = apiserver.api_client()
        agent = ClusterAgent(service, settings, api_client=api_client, topology=None, cluster=FAST, hooks=hooks)
        await agent.start()
        try:
            record = await service.submit_task("cli-op", [DatasetRequest("tiny", memory_dataset)], wait=10)
            assert record.state == "ready"  # caching through the socket works without the API server
            await asyncio.to_thread(apiserver.start)
            await until(lambda: agent.patches >= 1, what="publishing once the API server is back")
        finally:
            await agent.stop()
            await service.stop()
            await asyncio.to_thread(api_client.close)

    asyncio.run(scenario())


# -- the rights the chart grants are the ones the agent uses


def _verb_and_resource(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str, str | None]:
    """(verb, apiGroup, resource, name) of one request, as the API server's RBAC sees it."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, name = rest[0], (rest[1] if len(rest) > 1 else None)
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list")
    else:
        verb = {"PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}[method]
    return verb, group, resource, name


def test_every_request_of_the_agent_is_granted_by_the_chart_and_stays_on_its_own_node(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str
) -> None:
    """The chart's agent ClusterRole grants pods list/watch only (no get) and Node patch,
    and its ValidatingAdmissionPolicy allows only the agent's own Node: the agent must
    list pods only with its node's field selector and read and patch only its own Node."""
    from tests.charts.test_chart import find, render, rules_of

    docs = render({})
    granted = rules_of(docs, "-agent")
    assert find(docs, "ValidatingAdmissionPolicy", "-agent-node-restriction")  # renders by default
    assert find(docs, "ValidatingAdmissionPolicy", "-agent-nodecache-restriction")
    apiserver.create(make_node(NODE))
    apiserver.create(make_node("gpu-2"))
    apiserver.create(make_dataset("tiny", namespace="ml", source=memory_dataset))
    pod = apiserver.create(make_pod("p", namespace="ml", node_name=NODE, annotations={"dsagent.io/datasets": "tiny"}))
    apiserver.create(make_pod("elsewhere", namespace="ml", node_name="gpu-2"))

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(lambda: pod["metadata"]["uid"] in agent._tasks, what="the task")
            await until(lambda: agent.patches >= 1, what="a publish")

    asyncio.run(scenario())
    seen = set()
    for request in apiserver.requests:
        verb, group, resource, name = _verb_and_resource(request.method, request.path, request.query)
        assert (group, resource, verb) in granted, (request.method, request.path)
        if resource == "pods":
            assert request.query.get("fieldSelector") == f"spec.nodeName={NODE}", request.path
        if resource in ("nodes", "nodecaches") and verb != "create":
            assert name == NODE, request.path
        if resource == "nodecaches" and verb == "create":
            assert request.body["metadata"]["name"] == NODE, request.body
        seen.add((resource, verb))
    assert {("pods", "list"), ("pods", "watch"), ("nodes", "patch"), ("nodecaches", "create")} <= seen


def test_a_pod_s_datasets_are_events_on_the_pod_caching_ready_and_failed_with_code_and_hint(
    apiserver: FakeApiServer, tmp_path: Path, memory_dataset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kubectl describe pod`` says what the agent did for it: each dataset's caching, its
    readiness and a failure with the error's code and hint, each said once."""
    monkeypatch.setattr("dsagent.nodeagent.podevents.INTERVAL", 0.05)
    apiserver.create(make_node(NODE))
    datasets = json.dumps(
        [{"name": "tiny", "source": memory_dataset}, {"name": "gone", "source": memory_dataset + "-missing"}]
    )
    pod = apiserver.create(make_pod("train-0", namespace="team-a", annotations={"dsagent.io/datasets": datasets}))
    uid = pod["metadata"]["uid"]

    def said() -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for event in apiserver.list("events"):
            if event["regarding"].get("uid") == uid:
                out.setdefault(event["reason"], []).append(event)
        return out

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            apiserver.patch("pods", "train-0", {"spec": {"nodeName": NODE}}, namespace="team-a")
            await until(lambda: {"DatasetReady", "DatasetFailed"} <= set(said()), what="the pod's Events")
            await asyncio.sleep(0.3)  # more passes of the loop: nothing is said twice
            assert (await agent.service.get_task(uid)).state == "failed"

    asyncio.run(scenario())
    events = said()
    [ready] = events["DatasetReady"]
    assert ready["type"] == "Normal" and "dataset tiny" in ready["note"] and NODE in ready["note"]
    assert ready["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "train-0",
                                  "uid": uid}  # fmt: skip
    assert ready["metadata"]["namespace"] == "team-a" and ready["reportingController"] == "dsagent.io/agent"
    [failed] = events["DatasetFailed"]
    assert failed["type"] == "Warning" and failed["note"].startswith("dataset gone: not_found: ")
    assert "(" in failed["note"]  # the hint
    assert len(events.get("DatasetCaching", [])) <= 2


def test_a_pod_reading_only_striped_versions_gets_no_task_and_may_read_its_stripes(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """docs/design-striping.md#start: its datasets come from the node's shares, which the
    controller holds; a whole copy would not fit. Its annotation still names them, which
    lets it read them through the agent (``pod_datasets``); another pod's does not."""
    from dsagent.webhook.mutation import STRIPE_WAIT_CONTAINER

    apiserver.create(make_node(NODE))
    apiserver.create(make_dataset("web", source="memory://nowhere/web"))  # resolvable: a task could be made
    pod = make_pod("p", annotations={"dsagent.io/datasets": "web"})
    striped = ResolvedDataset("web", "s3://ml/web", "s3://ml/packs", stripe_digest="c" * 32)
    pod = json_patch(pod, mutate(pod, (striped,), Injection(image="img:1")))
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [STRIPE_WAIT_CONTAINER]
    pod["spec"]["nodeName"] = NODE
    uid = apiserver.create(pod)["metadata"]["uid"]
    other = apiserver.create(make_pod("q", node_name=NODE, annotations={"dsagent.io/datasets": "coco"}))

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            assert agent._watch is not None
            watch = agent._watch
            await until(lambda: watch.has_pod(uid) and watch.has_pod(other["metadata"]["uid"]), what="the pods")
            await asyncio.sleep(0.3)
            assert uid not in agent._tasks and await task_or_none(agent.service, uid) is None
            assert await agent.service.pod_names_dataset(uid, "web")
            assert not await agent.service.pod_names_dataset(other["metadata"]["uid"], "web")

    asyncio.run(scenario())


def test_the_datasets_running_pods_name_keep_their_stripe_shares_in_use(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """A whole copy held as a share is read from local disk, where the agent sees no read:
    the Datasets its node's running pods name are what keeps such a share in use (each pod's
    namespace), until the pods end."""
    apiserver.create(make_node(NODE))
    apiserver.create(make_pod("a", namespace="ml", node_name=NODE, phase="Running",
                              annotations={"dsagent.io/datasets": "web"}))  # fmt: skip
    apiserver.create(make_pod("b", namespace="cv", node_name=NODE, phase="Running",
                              annotations={"dsagent.io/datasets": "coco"}))  # fmt: skip
    apiserver.create(make_pod("elsewhere", namespace="ml", node_name="other-node", phase="Running",
                              annotations={"dsagent.io/datasets": "imgs"}))  # fmt: skip

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            stripes = agent.service.stripes
            await until(lambda: stripes.reading == {("ml", "web"), ("cv", "coco")}, what="the pods' Datasets")
            apiserver.patch("pods", "a", {"status": {"phase": "Succeeded"}}, "ml")
            await until(lambda: stripes.reading == {("cv", "coco")}, what="the ended pod's Dataset gone")
            apiserver.delete("pods", "b", "cv")
            await until(lambda: stripes.reading == frozenset(), what="the deleted pod's Dataset gone")

    asyncio.run(scenario())


def test_the_stripe_shares_know_the_pods_read_nothing_once_the_first_list_is_in(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """Until the agent has listed its node's pods, which Datasets they read is unknown (and
    no lapsed share is dropped); a list in which no pod names one says so too."""
    apiserver.create(make_node(NODE))
    apiserver.create(make_pod("plain", namespace="ml", node_name=NODE, phase="Running"))

    async def scenario() -> None:
        settings = Settings(root=tmp_path, node_name=NODE, kubernetes=True, **NO_FLOOR)
        hooks = ClusterHooks(settings, ClusterSettings())
        assert CacheService(settings, hooks=hooks.for_service()).stripes.reading is None, "not listed yet"
        async with cluster_agent(apiserver, tmp_path) as agent:
            stripes = agent.service.stripes
            await until(lambda: stripes.reading == frozenset(), what="the first list, naming no Dataset")

    asyncio.run(scenario())


def test_in_csi_mode_a_striped_start_before_whole_dataset_stays_out_of_the_pods_task(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """A CSI pod has no caching container: the cluster agent makes its task from its
    annotation at bind. A striped Dataset that starts before whole is read from the node's
    share (the CSI volume shows it), so it stays out of the task, as the CSI publish leaves
    it out (one request, no conflict, no whole copy); a pod of such datasets only gets no
    task, and its annotation still lets it read them through the agent."""
    apiserver.create(make_node(NODE))
    striped = {"stripe": "auto", "startBeforeWhole": True}
    web = make_dataset("web", source="memory://nowhere/web", bundles="memory://nowhere/packs",
                       status={"digest": "c" * 32, "bundles": 4, "files": 8, "bytes": 1 << 40})  # fmt: skip
    web["spec"].update(striped)
    apiserver.create(web)
    apiserver.create(make_dataset("tiny", source="memory://nowhere/tiny"))
    both = apiserver.create(make_pod("p", node_name=NODE, annotations={"dsagent.io/datasets": "web,tiny"}))
    only = apiserver.create(make_pod("q", node_name=NODE, annotations={"dsagent.io/datasets": "web"}))
    both_uid, only_uid = both["metadata"]["uid"], only["metadata"]["uid"]

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            await until(lambda: both_uid in agent._tasks, what="the task of the pod with a whole dataset")
            assert [r.name for r in agent._tasks[both_uid]] == ["tiny"]
            await asyncio.sleep(0.3)
            assert only_uid not in agent._tasks and await task_or_none(agent.service, only_uid) is None
            assert await agent.service.pod_names_dataset(only_uid, "web")

    asyncio.run(scenario())


def test_the_agent_hands_off_on_sigterm_only_when_its_node_is_leaving(apiserver: FakeApiServer, tmp_path: Path) -> None:
    # a rolling update restarts the agent on a node that stays: its shares stay on disk for
    # the agent that replaces it, so the hand-off ends at once; a drain cordons or taints first
    from dsagent.cache.striped.handoff import HandoffEnd

    apiserver.create(make_node(NODE))

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path) as agent:
            leaving = agent.service.hooks.node_leaving
            assert leaving is not None
            assert await leaving() is False
            assert await agent.service.handoff.run(lambda: False) is HandoffEnd.STAYING
            autoscaler = {"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}
            apiserver.patch("nodes", NODE, {"spec": {"taints": [autoscaler]}})
            assert await leaving() is True
            assert await agent.service.handoff.run(lambda: False) is HandoffEnd.OFF  # the rule's turn (off here)
            apiserver.patch("nodes", NODE, {"spec": {"taints": [], "unschedulable": True}})  # kubectl cordon
            assert await leaving() is True
            await asyncio.to_thread(apiserver.stop)
            assert await leaving() is None  # unknown: the hand-off goes on, bounded
            await asyncio.to_thread(apiserver.start)  # the agent clears its annotations as it stops

    asyncio.run(scenario())
