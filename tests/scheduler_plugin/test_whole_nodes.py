"""Whole nodes kept for a waiting wide job: a node with every GPU free is kept from a smaller
pod queued behind a multi-worker job that kube-scheduler could not place, while the pod is
offered another node (docs/design.md#whole-nodes)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from gpu_topology.classsets import set_key
from scheduler_plugin.filter import NO_WAITING, Ask, Waiting, kept_whole, whole_free
from scheduler_plugin.framework import Framework
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import node, pod, topology_json
from scheduling.nodefit import placement_key
from scheduling.nodeinfo import NodeFacts, NodeReader
from scheduling.podspec import PodRequest, read_pod

TOPO = topology_json()
EARLY, LATE = (0, 100.0), (0, 200.0)
#: a wide job of 8-GPU workers, queued before LATE pods
WIDE = Waiting.of([("ml/wide", 8, EARLY), ("ml/wide", 8, (0, 150.0))])


def facts(free_sets: Sequence[Sequence[int]]) -> list[NodeFacts]:
    reader = NodeReader()
    return [reader.read(node(f"n{i}", topology=TOPO, free_gpus=free)) for i, free in enumerate(free_sets)]


def small(gpus: int = 2, *, job: str = "ml/small", queue: tuple[int, float] = LATE) -> PodRequest:
    return PodRequest("ml/small-0", namespace="ml", gpus=gpus, job=job, queue=queue)


def test_a_waiting_job_is_its_largest_ask_at_its_first_place_in_the_queue() -> None:
    waiting = Waiting.of([("a", 4, (0, 50.0)), ("a", 8, (0, 10.0)), ("b", 2, (-5, 90.0))])
    assert waiting.jobs == {"a": (8, (0, 10.0)), "b": (2, (-5, 90.0))}
    assert waiting.ahead_of("c", (0, 20.0)) == {Ask(8), Ask(2)}  # b's higher priority puts it first
    assert waiting.ahead_of("c", (0, 5.0)) == {Ask(2)}
    assert waiting.ahead_of("a", (0, 20.0)) == {Ask(2)}  # never kept for its own job
    assert waiting.ahead_of("c", (-9, 0.0)) == frozenset()  # a higher priority is ahead of all
    assert NO_WAITING.ahead_of("c", (0, 1e12)) == frozenset()


def test_only_a_node_with_every_gpu_free_is_kept_and_only_for_an_ask_it_would_no_longer_hold() -> None:
    whole, used = facts([range(8), range(1, 8)])
    assert whole_free(whole) == 8 and whole_free(used) == 0
    kept = kept_whole(small(2), whole, frozenset({Ask(8)}))
    assert kept is not None and not kept.unresolvable
    assert kept.reason == (
        "node kept whole: every GPU free, and a job queued ahead of this pod waits for 8 GPUs on one node"
    )
    assert kept_whole(small(2), used, frozenset({Ask(8)})) is None  # GPUs in use: nothing to keep
    assert kept_whole(small(2), whole, frozenset({Ask(4)})) is None  # 6 left still take a 4-GPU pod
    assert kept_whole(small(6), whole, frozenset({Ask(4)})) is not None  # 2 left would not
    assert kept_whole(small(8), whole, frozenset({Ask(8)})) is None  # a whole-node pod itself
    assert kept_whole(small(2), whole, frozenset({Ask(16)})) is None  # no node of this kind holds that ask
    assert kept_whole(small(0), whole, frozenset({Ask(8)})) is None  # a pod without GPUs takes none
    unknown = NodeReader().read(node("bare", gpus=None))
    assert whole_free(unknown) == 0 and kept_whole(small(2), unknown, frozenset({Ask(8)})) is None


def filtered(request: PodRequest, nodes: Sequence[NodeFacts], waiting: Waiting, **settings: object):  # type: ignore[no-untyped-def]
    framework = Framework(Settings(**settings))  # type: ignore[arg-type]
    return framework.filter(request, [n.name for n in nodes], list(nodes), waiting=waiting)


def test_the_whole_nodes_fail_while_the_pod_is_offered_another_node() -> None:
    nodes = facts([range(8), range(4, 8), range(8)])
    out = filtered(small(2), nodes, WIDE)
    assert out.passed == ["n1"]
    assert set(out.failed) == {"n0", "n2"} and "kept whole" in out.failed["n0"]
    assert not out.unresolvable  # resolvable: the wide job placed, the node is anyone's again


def test_a_pod_offered_only_whole_nodes_takes_one() -> None:
    nodes = facts([range(8), range(8)])
    assert filtered(small(2), nodes, WIDE).passed == ["n0", "n1"]


def test_a_pod_waits_when_the_other_node_offered_fails_on_its_own_facts() -> None:
    # n1 is offered but has too few GPUs free for this pod: the whole node is still kept,
    # the pod waits behind the wide job rather than break its node up
    nodes = facts([range(8), range(6, 8)])
    out = filtered(small(4), nodes, WIDE)
    assert out.passed == []
    assert "kept whole" in out.failed["n0"] and out.failed["n1"] == "2 free GPUs, pod needs 4"


def test_nothing_is_kept_for_a_job_queued_behind_the_pod_nor_for_its_own_job_nor_when_switched_off() -> None:
    nodes = facts([range(8), range(4, 8)])
    assert filtered(small(2, queue=(0, 50.0)), nodes, WIDE).passed == ["n0", "n1"]  # the pod is ahead
    assert filtered(small(2, job="ml/wide"), nodes, WIDE).passed == ["n0", "n1"]  # its own job's nodes
    assert filtered(small(2), nodes, NO_WAITING).passed == ["n0", "n1"]
    assert filtered(small(2), nodes, WIDE, whole_nodes=False).passed == ["n0", "n1"]


def test_a_preferred_class_set_is_not_given_up_for_a_kept_node() -> None:
    # a two-worker job's class set (a GPU in each class): n1's two free GPUs are both in one
    # class, so only the whole node could serve the set; the pod waits rather than go across
    # class layouts
    # (that is for a set whose nodes are gone, not kept)
    framework = Framework(Settings())
    framework.jobs.set("ml/pair", set_key(("gpu-roce1", "gpu-roce2")))  # the set its first worker got
    request = PodRequest("ml/pair-1", namespace="ml", gpus=2, job="ml/pair", workers=2, queue=LATE)
    nodes = facts([range(8), [0, 1]])
    out = framework.filter(request, [n.name for n in nodes], list(nodes), lambda: iter(nodes), WIDE)
    assert out.passed == [] and out.split_reason is None
    assert "kept whole" in out.failed["n0"] and "class set" in out.failed["n1"]
    # with no job waiting, the same job takes the whole node in its set
    assert framework.filter(request, [n.name for n in nodes], list(nodes), lambda: iter(nodes)).passed == ["n0"]


def test_a_pods_place_in_the_queue_is_its_priority_then_its_age() -> None:
    created = dt.datetime(2026, 11, 21, 10, tzinfo=dt.timezone.utc).timestamp()
    raw = pod("w-0", gpus=8, job="wide")
    assert raw["metadata"]["creationTimestamp"] == "2026-11-21T10:00:00Z"
    read = read_pod(raw, job_labels=("dsagent.io/job",), gpu_resource="nvidia.com/gpu", roce_prefix="x.io/c")
    assert read.queue == (0, created)  # no priority
    raw["spec"]["priority"] = 1000
    read = read_pod(raw, job_labels=("dsagent.io/job",), gpu_resource="nvidia.com/gpu", roce_prefix="x.io/c")
    assert read.queue == (-1000, created)
    raw["spec"]["priority"] = "high"
    del raw["metadata"]["creationTimestamp"]
    read = read_pod(raw, job_labels=("dsagent.io/job",), gpu_resource="nvidia.com/gpu", roce_prefix="x.io/c")
    assert read.queue == (0, float("inf"))  # unreadable: no priority, the queue's end


def test_a_node_is_kept_only_for_a_job_whose_pods_may_run_there() -> None:
    h100 = placement_key({"metadata": {"labels": {"pool": "h100"}}})
    a100 = placement_key({"metadata": {"labels": {"pool": "a100"}}})
    whole, other_pool, unknown = (dataclasses.replace(facts([range(8)])[0], placement=k) for k in (h100, a100, None))
    pool_job = Ask(8, frozenset({h100}))
    assert kept_whole(small(2), whole, [pool_job]) is not None
    assert kept_whole(small(2), other_pool, [pool_job]) is None  # its pods may not run there
    assert kept_whole(small(2), unknown, [pool_job]) is None  # a node of no known placement: not for it
    assert kept_whole(small(2), other_pool, [pool_job, Ask(8)]) is not None  # another job may use any node
    assert kept_whole(small(2), whole, [Ask(8, frozenset())]) is None  # rules that name nodes: kept nowhere
    # the framework's memo per GPU facts tells the pools apart
    waiting = Waiting.of([("ml/wide", 8, EARLY)], {"ml/wide": frozenset({h100})})
    nodes = [
        dataclasses.replace(n, placement=k)
        for n, k in zip(facts([range(8), range(8), range(4, 8)]), (h100, a100, a100))
    ]
    out = filtered(small(2), nodes, waiting)
    assert out.passed == ["n1", "n2"] and set(out.failed) == {"n0"}
