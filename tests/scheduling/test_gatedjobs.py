"""The pure rules of the plan loop (scheduling/gatedjobs.py, nodefit.py, pinning.py): which
nodes a worker may run on, plans in whole workers across nodes, which worker goes where."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from dsplatform.errors import InvalidInput
from dsplatform.gpus import GpuResources
from scheduling.gatedjobs import WaitingJob, Worker, assign, group, less_gpus, never_fits, plan_job, read_worker
from scheduling.nodefit import node_allowed
from scheduling.nodeinfo import NodeFacts
from scheduling.pinning import add_gate, remove_gate, require_node, required_node
from scheduling.timemodel import JobProfile, queue_order
from tools.support.fake_apiserver import json_patch, make_node, make_pod

NOW = 1_800_000_000.0
PROFILE = JobProfile(gradient_bytes=1e3, step_seconds=1.0, steps=8000, deadline=NOW + 6 * 3600, workers=2)


def facts(name: str, free: list[int]) -> NodeFacts:
    return NodeFacts(name, published_free=frozenset(free), allocatable_gpus=8, gpu_facts_known=True)


def job(gpus: int = 2, workers: int = 2, deadline: float = NOW + 6 * 3600) -> WaitingJob:
    profile = dataclasses.replace(PROFILE, workers=workers, deadline=deadline)
    members = tuple(Worker("ml", f"w-{i}", f"u{i}", "1", "ml/j", profile, gpus, NOW) for i in range(workers))
    return WaitingJob("ml/j", members)


def test_a_plan_is_whole_workers_on_each_node() -> None:
    # 3 free on a and 1 on b: 2 workers of 2 GPUs fit only as 2 + 2, so c's 2 are needed
    decision = plan_job(job(), [facts("a", [0, 1, 2]), facts("b", [0]), facts("c", [4, 5])], now=NOW)
    assert decision.plan is not None and decision.branch == "cross-expected"
    assert sorted(decision.plan.allocation) == [("a", 2), ("c", 2)]
    alone = plan_job(job(), [facts("a", [0, 1, 2]), facts("b", [0])], now=NOW)
    assert alone.plan is None
    # no partly free node: one node (best fit); with a fragment that ends no later (communication
    # is negligible here), the design's branch (1) takes the fragments and leaves a whole node
    one = plan_job(job(), [facts("a", [0, 1, 2, 3]), facts("b", [0, 1, 2, 3, 4])], now=NOW)
    assert one.plan is not None and one.plan.allocation == (("a", 4),) and one.branch == "single-expected"
    spread = plan_job(job(), [facts("a", [0, 1, 2, 3]), facts("b", [0, 1])], now=NOW)
    assert spread.plan is not None and spread.branch == "cross-expected"
    assert spread.plan.allocation == (("b", 2), ("a", 2))


def test_jobs_are_ordered_by_slack_then_lateness() -> None:
    nodes = [facts("a", [0, 1]), facts("b", [0, 1])]
    decisions = {
        "loose": plan_job(job(deadline=NOW + 10 * 3600), nodes, now=NOW),
        "tight": plan_job(job(deadline=NOW + 3600), nodes, now=NOW),
        "late": plan_job(job(deadline=NOW + 60), nodes, now=NOW),
        "none": plan_job(job(gpus=4), nodes, now=NOW),
    }
    assert queue_order(decisions.items()) == ["tight", "loose", "late", "none"]


def test_assign_fills_the_shares_in_order_and_keeps_pinned_workers() -> None:
    j = job(workers=3)
    assert assign(j, (("b", 2), ("a", 4))) == {"w-0": "b", "w-1": "a", "w-2": "a"}
    pinned = dataclasses.replace(j.members[0], pinned="a")
    resumed = WaitingJob(j.key, (pinned, *j.members[1:]))
    assert assign(resumed, (("b", 2), ("a", 4))) == {"w-1": "b", "w-2": "a"}
    with pytest.raises(InvalidInput, match="room for 2 more workers"):
        assign(job(workers=3), (("a", 4),))
    with pytest.raises(InvalidInput, match="not whole workers"):
        assign(j, (("a", 3), ("b", 3)))


def test_workers_that_disagree_refuse_their_job() -> None:
    j = job()
    odd = dataclasses.replace(j.members[1], gpus=4)
    jobs, refused = group([j.members[0], odd])
    assert jobs == [] and "different GPU counts" in refused[0][1]
    jobs, refused = group(j.members)
    assert [x.key for x in jobs] == ["ml/j"] and refused == [] and jobs[0].complete


def test_never_fits_counts_whole_workers_of_the_gpus_nodes_publish() -> None:
    assert never_fits(job(gpus=4, workers=3), [facts("a", [0, 1, 2, 3, 4]), facts("b", [0, 1, 2, 3])]) is not None
    assert never_fits(job(gpus=4, workers=2), [facts("a", [0, 1, 2, 3, 4]), facts("b", [0, 1, 2, 3])]) is None
    # CPU and memory for one worker on each node (when they run nothing else): two fit, not three
    nodes = [facts("a", [0, 1, 2, 3, 4, 5, 6, 7]), facts("b", [0, 1, 2, 3, 4, 5, 6, 7])]
    assert never_fits(job(gpus=2, workers=2), nodes, {"a": 1, "b": 1}) is None
    why = never_fits(job(gpus=2, workers=3), nodes, {"a": 1, "b": 1, "elsewhere": 9})
    assert why is not None and "at most 2 of its 3 workers" in why and "CPU and memory" in why
    assert never_fits(job(gpus=2, workers=3), nodes, {"a": None, "b": 1}) is None  # a: no limit known
    assert len(less_gpus(facts("a", [0, 1, 2, 3]), 3).free_gpus or ()) == 1


def pod_with(spec: dict[str, Any]) -> dict[str, Any]:
    pod = make_pod("p", gpus=2)
    pod["spec"].update(spec)
    return pod


def node(name: str, **spec: Any) -> dict[str, Any]:
    n = make_node(name, labels={"zone": "a", "gpus": "8"})
    n["spec"].update(spec)
    return n


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ({}, {"n1", "n2"}),
        ({"nodeSelector": {"zone": "a"}}, {"n1", "n2"}),
        ({"nodeSelector": {"zone": "b"}}, set()),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}
                            ]
                        }
                    }
                }
            },
            {"n2"},
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]}
                            ]
                        }
                    }
                }
            },
            {"n1", "n2"},
        ),
        ({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, {"n1", "n2", "n3"}),
    ],
)
def test_a_workers_own_rules_decide_its_nodes(spec: dict[str, Any], allowed: set[str]) -> None:
    tainted = node("n3", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])
    nodes = [node("n1"), node("n2"), tainted, node("n4", unschedulable=True)]
    pod = pod_with(spec)
    assert {n["metadata"]["name"] for n in nodes if node_allowed(pod, n)} == allowed


def test_pinning_narrows_every_term_and_lifting_removes_only_the_gate() -> None:
    pod = pod_with(
        {
            "schedulingGates": [{"name": "example.com/quota"}, {"name": "dsagent.io/deadline-plan"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]},
                        ]
                    }
                }
            },
        }
    )
    pinned = copy.deepcopy(pod)
    ops = require_node(pinned, "n2")
    assert json_patch(copy.deepcopy(pod), ops) == pinned and required_node(pinned) == "n2"
    lifted = json_patch(pinned, remove_gate(pinned, "dsagent.io/deadline-plan"))
    assert lifted["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    assert (
        remove_gate(lifted, "dsagent.io/deadline-plan") == []
        and add_gate(copy.deepcopy(lifted), "example.com/quota") == []
    )


def test_read_worker_refuses_what_cannot_be_planned() -> None:
    annotations = {
        "dsagent.io/deadline-plan": "apply",
        "dsagent.io/workers": "2",
        "dsagent.io/params": "1M",
        "dsagent.io/step-seconds": "1s",
        "dsagent.io/steps": "100",
    }
    pod = make_pod("w-0", gpus=2, annotations=annotations, labels={"dsagent.io/job": "j"})
    w = read_worker(pod, names=GpuResources(), now=NOW)
    assert (w.job, w.gpus, w.workers, w.pinned) == ("default/j", 2, 2, None)
    pod["metadata"]["annotations"]["dsagent.io/planned"] = '{"gpus": 2, "nodes": {"n1": 2}, "node": "n1"}'
    assert read_worker(pod, names=GpuResources(), now=NOW).pinned is None  # no affinity to n1: not pinned
    require_node(pod, "n1")
    assert read_worker(pod, names=GpuResources(), now=NOW).pinned == "n1"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": ["2"]}}
    with pytest.raises(InvalidInput):
        read_worker(pod, names=GpuResources(), now=NOW)


def test_a_job_without_a_label_is_named_by_its_controlling_owner() -> None:
    from dsplatform.jobs import owner_key

    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "0b9c"}
    assert owner_key("ml", [{**owner, "controller": True}]) == "ml/Job/0b9c"
    assert owner_key("ml", [owner]) is None  # an owner that does not control the pod
    assert owner_key("ml", "Job") is None and owner_key("ml", [{"controller": True, "kind": 7}]) is None
