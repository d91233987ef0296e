"""Combining scores, and one RoCE class for every worker of a job."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from scheduler_plugin.framework import Framework, combine
from scheduler_plugin.jobs import JobClasses
from scheduler_plugin.settings import Settings, Weights
from scheduler_plugin.testing import holding, inventory_json, node, pod, topology_json
from scheduling.nodeinfo import NodeFacts, NodeReader

TOPO = topology_json()


@pytest.mark.parametrize(
    ("weights", "scores", "expected"),
    [
        (Weights(1, 0, 0), (10, 3, 7), 10),
        (Weights(0.5, 0.3, 0.2), (10, 10, 10), 10),
        (Weights(0.5, 0.3, 0.2), (10, 0, 0), 5),
        (Weights(0.5, 0.3, 0.2), (0, 5, 5), 3),
        (Weights(2, 2, 2), (10, 10, 10), 10),  # clamped
        (Weights(0, 0, 0), (10, 10, 10), 0),
    ],
)
def test_combined_score_is_a_clamped_weighted_sum(
    weights: Weights, scores: tuple[int, int, int], expected: int
) -> None:
    assert combine(weights, [scores[0]], [scores[1]], [scores[2]]) == [expected]


def facts(free_sets: Sequence[Sequence[int]]) -> list[NodeFacts | None]:
    reader = NodeReader()
    return [reader.read(node(f"n{i}", topology=TOPO, free_gpus=free)) for i, free in enumerate(free_sets)]


def test_every_worker_of_a_job_gets_the_class_of_the_first() -> None:
    framework = Framework(Settings(), jobs=JobClasses(ttl_s=600))
    first_view = facts([[4, 5, 6], [4, 5, 6, 7], [0, 1]])  # gpu-roce2 suggested by 2 of 3
    workers = [framework.read_pod(pod(f"w{i}", gpus=2, job="bert")) for i in range(4)]
    scores = framework.roce_scores(workers[0], first_view, lambda: [f for f in first_view if f])
    assert framework.jobs.get("ml/bert") == "gpu-roce2"
    assert scores[0] > 0 and scores[2] == 0
    # The cluster changes: now gpu-roce1 would win a fresh vote, but the job keeps roce2.
    later_view = facts([[0, 1, 2, 3], [0, 1, 2, 5, 6], [0, 1, 2]])
    for worker in workers[1:]:
        scores = framework.roce_scores(worker, later_view, lambda: [f for f in later_view if f])
        assert scores == [0, 10, 0]
    fresh = framework.read_pod(pod("other", gpus=2, job="gpt"))
    framework.roce_scores(fresh, later_view, lambda: [f for f in later_view if f])
    assert framework.jobs.get("ml/gpt") == "gpu-roce1"


def test_best_fit_within_the_job_class() -> None:
    framework = Framework(Settings())
    view = facts([[4, 5, 6, 7], [4, 5], [4, 5, 6], [0, 1, 2, 3]])
    request = framework.read_pod(pod(gpus=2, gpu_resource="dsagent.io/gpu-roce2"))
    assert framework.roce_scores(request, view, lambda: []) == [3, 10, 5, 0]


def test_pods_without_gpus_or_datasets_get_zero_everywhere() -> None:
    framework = Framework(Settings())
    view = facts([[0, 1], [2, 3]])
    request = framework.read_pod(pod())
    assert framework.prioritize(request, view, lambda: []) == [0, 0]


def test_unknown_nodes_score_zero() -> None:
    framework = Framework(Settings(weights=Weights(1, 0, 0)))
    reader = NodeReader()
    known = reader.read(node("n1", inventory=inventory_json(datasets={"imagenet": holding()})))
    request = framework.read_pod(pod(datasets="imagenet"))
    assert framework.prioritize(request, [None, known], lambda: []) == [0, 10]


def test_an_unparseable_pod_dataset_annotation_scores_zero_everywhere() -> None:
    framework = Framework(Settings(weights=Weights(1, 0, 0)))
    known = NodeReader().read(node("n1", inventory=inventory_json(datasets={"imagenet": holding()})))
    request = framework.read_pod(pod(datasets='[{"name": "imagenet"'))
    assert framework.prioritize(request, [known], lambda: []) == [0]


def test_the_combined_verb_is_the_weighted_sum_of_the_three_verbs_node_by_node() -> None:
    # Mixed candidates: holders of one or both datasets, equal GPU keys, no topology,
    # and unknown nodes (None): the per-key shortcuts must not change any score.
    reader = NodeReader()
    both = {"imagenet": holding(), "coco": holding()}
    shapes: list[tuple[dict[str, dict[str, object]], list[int] | None]] = [
        (both, [0, 1]),
        ({"imagenet": holding()}, [0, 1]),
        ({}, [0, 1]),
        (both, [4, 5, 6, 7]),
        ({}, [4, 5, 6, 7]),
        (both, None),
        ({"coco": holding()}, []),
    ]
    nodes: list[NodeFacts | None] = [
        reader.read(
            node(
                f"n{i}",
                inventory=inventory_json(datasets=held),
                **({"topology": TOPO, "free_gpus": free} if free is not None else {}),
            )
        )
        for i, (held, free) in enumerate(shapes)
    ]
    nodes.insert(2, None)
    nodes.append(None)
    wants = [{"name": n, "source": f"s3://d/{n}"} for n in ("imagenet", "coco")]
    for weights in (Weights(), Weights(1, 0, 0), Weights(0.2, 0.5, 0.3)):
        framework = Framework(Settings(weights=weights))
        request = framework.read_pod(pod(datasets=wants, gpus=2))
        cluster = lambda: [n for n in nodes if n is not None]  # noqa: E731
        expected = combine(
            weights,
            framework.dataset_scores(request, nodes),
            framework.roce_scores(request, nodes, cluster),
            framework.numa_scores(request, nodes),
        )
        assert framework.prioritize(request, nodes, cluster) == expected
        assert framework.dataset_scores(request, nodes)[0] == 10
        assert framework.dataset_scores(request, nodes)[1] == framework.dataset_scores(request, nodes)[2] == 0
