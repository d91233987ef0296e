"""One RoCE class per job: the pod rewrite, the vote input and the job Lease (fake API server)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from dsagent.errors import SettingsError
from dsagent.webhook.gpurequest import (
    CLASS_ANNOTATION,
    GpuClassSettings,
    controller_of,
    gpu_request,
    lease_name,
    requested_classes,
    rewrite,
)
from dsagent.webhook.mutation import Injection
from dsagent.webhook.roceclass import GpuClassPolicy, KubeGpuClasses, read_cluster
from dsagent.webhook.server import decide
from dsplatform.kubetime import format_micro_time
from scheduler_plugin.testing import node as extender_node
from scheduler_plugin.testing import topology_json
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_lease, make_pod

SETTINGS = GpuClassSettings(enabled=True)
OWNER = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "name": "bert",
    "uid": "uid-bert-1",
    "controller": True,
    "blockOwnerDeletion": True,
}


def worker(
    index: int = 0,
    *,
    gpus: int = 4,
    job: str | None = "bert",
    owner: dict[str, Any] | None = OWNER,
    resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    labels = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-index": str(index)} if job else {}
    pod = make_pod(f"bert-worker-{index}", namespace="ml", labels=labels, gpus=gpus)
    if resource != "nvidia.com/gpu":
        for kind in ("limits", "requests"):
            entries = pod["spec"]["containers"][0]["resources"][kind]
            entries[resource] = entries.pop("nvidia.com/gpu")
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [owner]
    return pod


def gpu_node(name: str, free: list[int], *, topology: str | None = None) -> dict[str, Any]:
    obj = extender_node(name, topology=topology or topology_json(), free_gpus=free)
    obj["kind"], obj["apiVersion"] = "Node", "v1"
    obj["metadata"].pop("resourceVersion")
    return obj


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(apiserver: FakeApiServer) -> FakeApiServer:
    # gpu-roce1 = GPUs 0-3, gpu-roce2 = GPUs 4-7 on every node. Nodes suggest: a both,
    # b roce2, c roce1, d none (3 free at most), e roce2: gpu-roce2 wins 3 to 2.
    for name, free in (
        ("a", list(range(8))),
        ("b", [4, 5, 6, 7]),
        ("c", [0, 1, 2, 3]),
        ("d", [4, 5, 6]),
        ("e", [0, 1, 4, 5, 6, 7]),
    ):
        apiserver.create(gpu_node(name, free))
    return apiserver


@pytest.fixture
def policy(cluster: FakeApiServer, clock: Clock) -> Iterator[GpuClassPolicy]:
    client = cluster.api_client()
    try:
        yield GpuClassPolicy(SETTINGS, KubeGpuClasses(client, SETTINGS, clock=clock))
    finally:
        client.close()


def admitted(policy: GpuClassPolicy, pod: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    decision = policy.decide(pod, "ml", annotations_exist=pod["metadata"].get("annotations") is not None)
    return json_patch(copy.deepcopy(pod), decision.patch), decision.warnings


def resources(pod: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = pod["spec"]["containers"][0]["resources"]
    return result


# -- the pure part


def test_the_gpu_request_counts_containers_and_the_largest_init_container() -> None:
    pod = make_pod("p", gpus=2)
    pod["spec"]["containers"].append(copy.deepcopy(pod["spec"]["containers"][0]))
    assert gpu_request(pod, SETTINGS) == 4
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]
    assert gpu_request(pod, SETTINGS) == 8
    assert gpu_request(make_pod("p"), SETTINGS) == 0


def test_the_gpu_request_counts_class_resources_of_every_container() -> None:
    """Two containers of one class hold twice the GPUs (the policy once took the larger one)."""
    pod = make_pod("p", gpus=2)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"dsagent.io/gpu-roce1": "2"}}
    pod["spec"]["containers"].append(copy.deepcopy(pod["spec"]["containers"][0]))
    assert gpu_request(pod, SETTINGS) == 4
    assert gpu_request(pod, GpuClassSettings(enabled=True, prefix="example.com")) == 0


def test_rewrite_moves_requests_and_limits_to_the_class_resource_and_annotates() -> None:
    pod = worker()
    result = json_patch(copy.deepcopy(pod), rewrite(pod, SETTINGS, "gpu-roce2", annotations_exist=True))
    assert resources(result) == {"limits": {"dsagent.io/gpu-roce2": "4"}, "requests": {"dsagent.io/gpu-roce2": "4"}}
    assert result["metadata"]["annotations"][CLASS_ANNOTATION] == "gpu-roce2"
    bare = worker()
    del bare["metadata"]["annotations"]
    result = json_patch(copy.deepcopy(bare), rewrite(bare, SETTINGS, "gpu-roce1", annotations_exist=False))
    assert result["metadata"]["annotations"] == {CLASS_ANNOTATION: "gpu-roce1"}


def test_quantities_are_read_by_the_platforms_one_rule() -> None:
    """The rewrite read quantities with int(), so a valid "4000m" (4 GPUs, as the
    API server and gpu_request read it) was removed and nothing added: the pod lost its
    GPU request. Requested classes counted it as 0."""
    pod = worker(gpus=4)
    for kind in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpu"] = "4000m"
    assert gpu_request(pod, SETTINGS) == 4
    patched = json_patch(pod, rewrite(pod, SETTINGS, "gpu-roce2", annotations_exist=False))
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {"dsagent.io/gpu-roce2": "4"}
    asking = worker(gpus=2, resource="dsagent.io/gpu-roce1")
    asking["spec"]["containers"][0]["resources"]["limits"]["dsagent.io/gpu-roce1"] = "2000m"
    assert requested_classes(asking, "dsagent.io") == {"gpu-roce1": 2}
    unreadable = worker(gpus=2, resource="dsagent.io/gpu-roce1")
    for kind in ("limits", "requests"):
        unreadable["spec"]["containers"][0]["resources"][kind]["dsagent.io/gpu-roce1"] = "two"
    assert requested_classes(unreadable, "dsagent.io") == {"gpu-roce1": 0}  # as before: counts none


def test_rewrite_replaces_another_class_and_keeps_unrelated_resources() -> None:
    pod = worker(resource="dsagent.io/gpu-roce1")
    resources(pod)["limits"]["cpu"] = "8"
    assert requested_classes(pod, "dsagent.io") == {"gpu-roce1": 4}
    result = json_patch(copy.deepcopy(pod), rewrite(pod, SETTINGS, "gpu-roce2", annotations_exist=True))
    assert resources(result)["limits"] == {"cpu": "8", "dsagent.io/gpu-roce2": "4"}
    assert rewrite(worker(resource="dsagent.io/gpu-roce2"), SETTINGS, "gpu-roce2", annotations_exist=True) == []


@pytest.mark.parametrize("job", ["ml/bert", "ml/Bert_Large.v2", "ml/" + "x" * 63, "ml/---"])
def test_lease_names_are_dns_names_and_differ_per_job(job: str) -> None:
    name = lease_name(job)
    assert len(name) <= 63 and name == name.lower()
    assert all(c.isalnum() or c == "-" for c in name) and name[0].isalpha() and name[-1].isalnum()
    assert lease_name(job) != lease_name(job + "x")


def test_the_lease_owner_is_the_pods_controller_without_blocking_its_deletion() -> None:
    assert controller_of(worker()) == {**OWNER, "controller": False, "blockOwnerDeletion": False}
    assert controller_of(worker(owner=None)) is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DSAGENT_WEBHOOK_GPU_CLASSES": "maybe"}, "is not a boolean"),
        ({"DSAGENT_WEBHOOK_GPU_RESOURCE": "gpu"}, "not an extended resource"),
        ({"DSAGENT_WEBHOOK_CLASS_PREFIX": "Bad_Prefix"}, "not a DNS subdomain"),
        ({"DSAGENT_WEBHOOK_JOB_TTL": "soon"}, "JOB_TTL"),
    ],
)
def test_bad_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        GpuClassSettings.from_env(env)


def test_settings_from_the_environment() -> None:
    settings = GpuClassSettings.from_env(
        {
            "DSAGENT_WEBHOOK_GPU_CLASSES": "true",
            "DSAGENT_WEBHOOK_CLASS_PREFIX": "example.com",
            "DSAGENT_WEBHOOK_JOB_LABELS": "team/job, job-name",
            "DSAGENT_WEBHOOK_JOB_TTL": "2h",
        }
    )
    assert (settings.enabled, settings.resource("gpu-roce1"), settings.job_labels, settings.lease_ttl_s) == (
        True,
        "example.com/gpu-roce1",
        ("team/job", "job-name"),
        7200,
    )
    assert GpuClassSettings.from_env({}).enabled is False


def test_the_vote_reads_published_classes_and_skips_unreadable_or_cordoned_nodes() -> None:
    nodes = [gpu_node("a", [4, 5, 6, 7]), gpu_node("b", [4, 5, 6, 7]), gpu_node("c", [0, 1, 2, 3])]
    broken = gpu_node("x", [0])
    broken["metadata"]["annotations"]["dsagent.io/topology"] = "{not json"
    cordoned = gpu_node("y", [0, 1, 2, 3])
    cordoned["spec"]["unschedulable"] = True
    unknown_free = gpu_node("z", [])
    del unknown_free["metadata"]["annotations"]["dsagent.io/free-gpus"]
    view = read_cluster(nodes + [broken, cordoned, unknown_free])
    assert len(view.sizes) == 4 and len(view.free) == 3
    assert view.vote(4) == "gpu-roce2"
    assert view.vote(5) is None  # no class of five anywhere
    # Nobody has four free in one class now: the class most nodes could hold it in.
    assert read_cluster([gpu_node("a", [0, 4]), gpu_node("b", [1])]).vote(4) == "gpu-roce1"


# -- the job Lease


def test_the_first_worker_takes_the_vote_and_later_workers_its_lease(
    policy: GpuClassPolicy, cluster: FakeApiServer
) -> None:
    first, warnings = admitted(policy, worker(0))
    assert warnings == ()
    assert resources(first)["limits"] == {"dsagent.io/gpu-roce2": "4"}
    lease = cluster.get("leases", lease_name("ml/bert"), "ml")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "gpu-roce2" and lease["spec"]["leaseDurationSeconds"] == 3600
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-bert-1"
    assert lease["metadata"]["annotations"]["dsagent.io/job"] == "ml/bert"
    # The cluster changes so that a fresh vote would say gpu-roce1; the job keeps gpu-roce2.
    for name in ("a", "b", "e"):
        cluster.patch("nodes", name, {"metadata": {"annotations": {"dsagent.io/free-gpus": "0,1,2,3"}}})
    second, _ = admitted(policy, worker(1))
    assert resources(second)["requests"] == {"dsagent.io/gpu-roce2": "4"}
    assert len(cluster.list("leases")) == 1


def test_a_restarted_or_second_replica_reads_the_same_class(
    cluster: FakeApiServer, policy: GpuClassPolicy, clock: Clock
) -> None:
    admitted(policy, worker(0))
    for name in ("a", "b", "e"):
        cluster.patch("nodes", name, {"metadata": {"annotations": {"dsagent.io/free-gpus": "0,1,2,3"}}})
    client = cluster.api_client()
    try:
        replica = GpuClassPolicy(SETTINGS, KubeGpuClasses(client, SETTINGS, clock=clock))
        second, _ = admitted(replica, worker(1))
        other_job, _ = admitted(replica, worker(0, job="gpt", owner=None))
    finally:
        client.close()
    assert resources(second)["limits"] == {"dsagent.io/gpu-roce2": "4"}
    assert resources(other_job)["limits"] == {"dsagent.io/gpu-roce1": "4"}  # a new job votes afresh


def test_two_replicas_racing_for_a_new_job_agree_on_the_winner(
    cluster: FakeApiServer, policy: GpuClassPolicy, clock: Clock
) -> None:
    client = cluster.api_client()
    try:
        loser = GpuClassPolicy(SETTINGS, KubeGpuClasses(client, SETTINGS, clock=clock))
        real_read = loser.kube.leases.read
        reads: list[str] = []

        def read_then_lose_the_race(namespace: str, name: str) -> dict[str, Any] | None:
            found = real_read(namespace, name)
            if not reads:  # between our read and our create, the other replica creates it
                cluster.create(
                    make_lease(
                        name,
                        namespace=namespace,
                        holder="gpu-roce1",
                        duration_s=3600,
                        renew_time="2027-01-15T08:00:00Z",
                    )
                )
            reads.append(name)
            return found

        loser.kube.leases.read = read_then_lose_the_race  # type: ignore[method-assign]
        pod, _ = admitted(loser, worker(0))
    finally:
        client.close()
    assert resources(pod)["limits"] == {"dsagent.io/gpu-roce1": "4"}  # the winner's class, not its own vote
    assert len(reads) == 2
    conflicts = [r for r in cluster.requests_matching("POST") if r.path.endswith("/leases")]
    assert len(conflicts) == 1


def test_a_lease_of_an_earlier_job_of_the_same_name_is_replaced(cluster: FakeApiServer, policy: GpuClassPolicy) -> None:
    old = make_lease(
        lease_name("ml/bert"),
        namespace="ml",
        holder="gpu-roce1",
        duration_s=3600,
        renew_time=format_micro_time(policy.kube.now()),
    )
    old["metadata"]["ownerReferences"] = [{**OWNER, "uid": "uid-of-a-deleted-job"}]
    cluster.create(old)
    pod, _ = admitted(policy, worker(0))
    assert resources(pod)["limits"] == {"dsagent.io/gpu-roce2": "4"}
    lease = cluster.get("leases", lease_name("ml/bert"), "ml")
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-bert-1"


def test_an_ownerless_lease_expires_and_is_renewed_by_its_workers(
    cluster: FakeApiServer, policy: GpuClassPolicy, clock: Clock
) -> None:
    first, _ = admitted(policy, worker(0, owner=None))
    assert resources(first)["limits"] == {"dsagent.io/gpu-roce2": "4"}
    clock.now += 2000  # past half the hour: the next worker renews
    admitted(policy, worker(1, owner=None))
    lease = cluster.get("leases", lease_name("ml/bert"), "ml")
    assert lease is not None and lease["spec"]["renewTime"] == format_micro_time(clock.now)
    clock.now += 3000  # within the renewed hour
    assert resources(admitted(policy, worker(2, owner=None))[0])["limits"] == {"dsagent.io/gpu-roce2": "4"}
    for name in ("a", "b", "e"):
        cluster.patch("nodes", name, {"metadata": {"annotations": {"dsagent.io/free-gpus": "0,1,2,3"}}})
    clock.now += 3601 + 10  # expired, and the node listing is stale too: a new job of that name votes again
    pod, _ = admitted(policy, worker(0, owner=None))
    assert resources(pod)["limits"] == {"dsagent.io/gpu-roce1": "4"}


def test_a_pod_in_no_job_gets_the_vote_without_a_lease(policy: GpuClassPolicy, cluster: FakeApiServer) -> None:
    pod, _ = admitted(policy, worker(job=None, owner=None))
    assert resources(pod)["limits"] == {"dsagent.io/gpu-roce2": "4"}
    assert cluster.list("leases") == []


def test_a_worker_larger_than_every_class_keeps_its_gpu_request(policy: GpuClassPolicy, cluster: FakeApiServer) -> None:
    pod, warnings = admitted(policy, worker(gpus=8))
    assert resources(pod)["limits"] == {"nvidia.com/gpu": "8"}
    assert "whole-node worker" in warnings[0] or "can hold 8 GPUs" in warnings[0]
    assert cluster.list("leases") == []


def test_without_published_classes_nothing_is_rewritten(apiserver: FakeApiServer, clock: Clock) -> None:
    apiserver.create(
        gpu_node("plain", [0, 1], topology=json.dumps({"version": 1, "gpus": [], "nics": [], "links": {}}))
    )
    client = apiserver.api_client()
    try:
        policy = GpuClassPolicy(SETTINGS, KubeGpuClasses(client, SETTINGS, clock=clock))
        pod, warnings = admitted(policy, worker())
    finally:
        client.close()
    assert resources(pod)["limits"] == {"nvidia.com/gpu": "4"}
    assert "no node publishes a GPU class" in warnings[0]


def test_a_pod_asking_for_another_class_is_held_to_its_jobs(policy: GpuClassPolicy) -> None:
    admitted(policy, worker(0))
    pod, warnings = admitted(policy, worker(1, resource="dsagent.io/gpu-roce1"))
    assert resources(pod)["limits"] == {"dsagent.io/gpu-roce2": "4"}
    assert "uses GPU class gpu-roce2" in warnings[0]


def test_a_pod_without_gpus_is_left_alone(policy: GpuClassPolicy, cluster: FakeApiServer) -> None:
    assert admitted(policy, worker(gpus=0))[0] == worker(gpus=0)
    assert cluster.requests_matching("GET", "/api/v1/nodes") == []


# -- in the webhook's decision


def test_the_webhook_wires_datasets_and_the_gpu_class_in_one_patch(policy: GpuClassPolicy) -> None:
    pod = worker()
    del pod["metadata"]["annotations"]
    decision = decide(pod, "ml", Injection(image="img:1"), lambda ns, name: pytest.fail("no lookup"), policy)
    result = json_patch(copy.deepcopy(pod), decision.patch)
    assert resources(result)["limits"] == {"dsagent.io/gpu-roce2": "4"}
    pod["metadata"]["annotations"] = {"dsagent.io/datasets": json.dumps([{"name": "imagenet", "source": "s3://b/i"}])}
    decision = decide(pod, "ml", Injection(image="img:1"), lambda ns, name: pytest.fail("no lookup"), policy)
    result = json_patch(copy.deepcopy(pod), decision.patch)
    assert result["metadata"]["annotations"][CLASS_ANNOTATION] == "gpu-roce2"
    assert result["metadata"]["annotations"]["dsagent.io/injected"] == "true"
    assert result["spec"]["initContainers"][0]["name"] == "dsagent-cache"


def test_an_unreachable_api_server_admits_the_pod_unchanged_with_a_warning(
    policy: GpuClassPolicy, cluster: FakeApiServer
) -> None:
    cluster.stop()
    decision = decide(worker(), "ml", Injection(image="img:1"), lambda ns, name: pytest.fail("no lookup"), policy)
    assert decision.patch == []
    assert "GPU class not assigned" in decision.warnings[0]


def test_a_dry_run_reads_the_jobs_lease_but_never_writes_one(policy: GpuClassPolicy, cluster: FakeApiServer) -> None:
    decision = policy.decide(worker(0), "ml", annotations_exist=True, dry_run=True)
    assert decision.gpu_class == "gpu-roce2" and cluster.list("leases") == []
    admitted(policy, worker(0))
    for name in ("a", "b", "e"):
        cluster.patch("nodes", name, {"metadata": {"annotations": {"dsagent.io/free-gpus": "0,1,2,3"}}})
    assert policy.decide(worker(1), "ml", annotations_exist=True, dry_run=True).gpu_class == "gpu-roce2"
    writes = [r for r in cluster.requests_matching("POST") + cluster.requests_matching("PUT") if "/leases" in r.path]
    assert len(writes) == 1


def test_with_its_node_watch_the_vote_reads_the_watched_nodes_and_lists_none(
    cluster: FakeApiServer, clock: Clock
) -> None:
    """The webhook's processes keep the Nodes by list+watch (dsagent/kube/nodewatch.py): a
    vote reads them as a listing vote would, follows their changes, and lists nothing."""
    from dsagent.kube.nodewatch import NodeWatch
    from dsagent.webhook.admissionmetrics import WebhookMetrics
    from dsplatform import published

    client = cluster.api_client()
    watch = NodeWatch(client, retry_s=0.05, watch_timeout_s=30, published=(published.TOPOLOGY,))  # as serve() makes it
    metrics = WebhookMetrics()
    watch.start()
    try:
        assert watch.wait_synced(10)
        lists = len(cluster.requests_matching("GET", "/api/v1/nodes", watch=False))
        kube = KubeGpuClasses(client, SETTINGS, clock=clock, watch=watch, reads=metrics.node_reads)
        policy = GpuClassPolicy(SETTINGS, kube)
        first, _ = admitted(policy, worker(0))
        assert resources(first)["limits"] == {"dsagent.io/gpu-roce2": "4"}  # as the listing vote says
        for name in ("a", "b", "e"):  # a fresh vote now says gpu-roce1
            cluster.patch("nodes", name, {"metadata": {"annotations": {"dsagent.io/free-gpus": "0,1,2,3"}}})
        cluster.wait_for(lambda: watch.events >= 3, what="the changed nodes in the watch")
        clock.now += SETTINGS.nodes_ttl_s + 1  # past the view's time to live
        other, _ = admitted(policy, worker(0, job="gpt", owner=None))
        assert resources(other)["limits"] == {"dsagent.io/gpu-roce1": "4"}
        assert len(cluster.requests_matching("GET", "/api/v1/nodes", watch=False)) == lists
        # each view counted where it read the Nodes: dsplatform_webhook_node_reads_total
        assert metrics.node_reads.counter.labels(source="watch")._value.get() == kube.cluster_reads == 2
        assert metrics.node_reads.counter.labels(source="list")._value.get() == 0
    finally:
        watch.stop()
        client.close()


def test_without_a_node_watch_each_view_counts_as_listed(cluster: FakeApiServer, clock: Clock) -> None:
    from dsagent.webhook.admissionmetrics import WebhookMetrics

    metrics = WebhookMetrics()
    client = cluster.api_client()
    try:
        kube = KubeGpuClasses(client, SETTINGS, clock=clock, reads=metrics.node_reads)
        policy = GpuClassPolicy(SETTINGS, kube)
        admitted(policy, worker(0))
        clock.now += SETTINGS.nodes_ttl_s + 1
        admitted(policy, worker(0, job="gpt", owner=None))
        assert metrics.node_reads.counter.labels(source="list")._value.get() == kube.cluster_reads == 2
        assert metrics.node_reads.counter.labels(source="watch")._value.get() == 0
        assert b'dsplatform_webhook_node_reads_total{source="list"} 2.0' in metrics.render()
    finally:
        client.close()
