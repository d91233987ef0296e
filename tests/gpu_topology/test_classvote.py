"""The cluster-wide RoCE class vote shared by the webhook and the extender."""

from __future__ import annotations

import pytest

from dsplatform.jobs import DEFAULT_JOB_LABELS, job_key
from gpu_topology import ParseError
from gpu_topology.classvote import choose_class, choose_class_by_size, node_classes, parse_free_gpus, suggest
from gpu_topology.contract import topology_to_dict
from scheduler_plugin.testing import two_class_topology


def test_the_patents_two_node_rule_with_ties_voting_for_both() -> None:
    assert suggest({"gpu-roce1": 3, "gpu-roce2": 1}) == ("gpu-roce1",)
    assert suggest({"gpu-roce1": 2, "gpu-roce2": 2}) == ("gpu-roce1", "gpu-roce2")
    assert suggest({"gpu-roce1": 2, "gpu-roce2": 1}, need=3) == ()
    choice = choose_class(
        [{"gpu-roce1": 3, "gpu-roce2": 1}, {"gpu-roce1": 0, "gpu-roce2": 3}, {"gpu-roce1": 1, "gpu-roce2": 4}]
    )
    assert choice is not None and (choice.name, dict(choice.votes)) == ("gpu-roce2", {"gpu-roce1": 1, "gpu-roce2": 2})


def test_the_size_fallback_picks_the_class_most_nodes_could_hold_the_worker_in() -> None:
    nodes = [{"gpu-roce1": 2, "gpu-roce2": 4}, {"gpu-roce1": 4, "gpu-roce2": 4}, {"gpu-roce1": 2}]
    choice = choose_class_by_size(nodes, need=4)
    assert choice is not None and choice.name == "gpu-roce2" and dict(choice.votes) == {"gpu-roce1": 1, "gpu-roce2": 2}
    assert choose_class_by_size(nodes, need=5) is None


def test_a_nodes_classes_and_free_gpus_come_from_its_published_document() -> None:
    document = topology_to_dict(two_class_topology())
    found = node_classes(document, parse_free_gpus("0,1,5"))
    assert (dict(found.sizes), dict(found.free or {})) == (
        {"gpu-roce1": 4, "gpu-roce2": 4},
        {"gpu-roce1": 2, "gpu-roce2": 1},
    )
    assert node_classes(document, None).free is None
    with pytest.raises(ParseError):
        node_classes({"version": 2}, None)


@pytest.mark.parametrize(
    ("text", "free"), [("0,1,4", {0, 1, 4}), ("", set()), (" 3 , 2 ", {2, 3}), ("a,b", None), (None, None)]
)
def test_free_gpu_lists(text: str | None, free: set[int] | None) -> None:
    assert parse_free_gpus(text) == (None if free is None else frozenset(free))


def test_the_job_is_named_by_the_first_job_label_set() -> None:
    labels = {"job-name": "batch-7", "training.kubeflow.org/job-name": "bert"}
    assert job_key("ml", labels) == "ml/bert"
    assert job_key("ml", {"job-name": ""}) is None and job_key("ml", None) is None
    assert job_key("ml", labels, ("job-name",)) == "ml/batch-7"
    assert DEFAULT_JOB_LABELS[0] == "dsagent.io/job"
