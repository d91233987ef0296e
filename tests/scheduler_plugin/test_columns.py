"""The watch cache's columns: names-only requests scored from them answer exactly what
scoring every node's facts answers, and the columns stay equal to ones built afresh
through any sequence of node updates and deletions."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

import pytest

from scheduler_plugin.columns import NodeColumns
from scheduler_plugin.framework import Framework
from scheduler_plugin.plugins import dataset
from scheduler_plugin.settings import Settings, Weights
from scheduler_plugin.testing import holding, inventory_json, node, pod, topology_json
from scheduling.nodeinfo import NodeFacts, NodeReader

TOPO = topology_json()
DATASETS = ["imagenet", "coco", "laion", "wiki", "c4", "pile"]
DIGESTS = ["a" * 32, "b" * 32]
VERBS = ["combined", "dataset", "roce", "numa", "time"]


def random_node(rng: random.Random, reader: NodeReader, name: str, version: int) -> NodeFacts:
    inventory = None
    if rng.random() < 0.9:
        held = {
            ds: holding(
                rng.choice(DIGESTS),
                state=rng.choice(["ready", "ready", "ready", "fetching"]),
                in_use=rng.random() < 0.3,
                size=rng.randint(1, 9) << 30,
            )
            for ds in rng.sample(DATASETS, rng.randint(0, len(DATASETS)))
        }
        inventory = inventory_json(name, held)
    free = sorted(rng.sample(range(8), rng.randint(0, 8))) if rng.random() < 0.8 else None
    facts = reader.read(
        node(
            name,
            inventory=inventory,
            topology=TOPO if rng.random() < 0.85 else None,
            free_gpus=free,
            resource_version=str(version),
        )
    )
    return dataclasses.replace(facts, used_gpus=rng.randint(1, 4)) if free is None and rng.random() < 0.5 else facts


def random_pod(rng: random.Random, index: int) -> dict[str, Any]:
    wants = [
        {"name": ds, "source": f"s3://d/{ds}", **({"digest": rng.choice(DIGESTS)} if rng.random() < 0.5 else {})}
        for ds in rng.sample(DATASETS, rng.randint(0, 3))
    ]
    obj = pod(
        f"p{index}",
        datasets=wants if wants or rng.random() < 0.5 else "not json",
        gpus=rng.choice([0, 1, 2, 4, 8]),
        job=rng.choice([None, f"job-{index}"]),
    )
    if rng.random() < 0.4:
        obj["metadata"]["annotations"]["dsagent.io/workers"] = str(rng.randint(2, 6))
    return obj


def assert_same_scores(rng: random.Random, facts: dict[str, NodeFacts], columns: NodeColumns, rounds: int) -> None:
    """Every verb, under several weightings: the columns' path equals the per-node path."""
    for index in range(rounds):
        names = rng.sample(sorted(facts), rng.randint(0, len(facts))) + [
            f"unknown-{i}" for i in range(rng.randint(0, 2))
        ]
        rng.shuffle(names)
        weights = rng.choice([Weights(), Weights(1, 0, 0), Weights(0, 1, 0), Weights(0, 0, 1), Weights(0.7, 0, 0.6)])
        settings = Settings(weights=weights)
        raw_pod = random_pod(rng, index)
        for verb in VERBS:
            per_node, by_columns = Framework(settings, clock=lambda: 0.0), Framework(settings, clock=lambda: 0.0)
            expected = per_node.prioritize(
                per_node.read_pod(raw_pod), [facts.get(n) for n in names], lambda: list(facts.values()), verb
            )
            # the cluster-wide class vote and class-set choice read the columns' groups
            got = by_columns.prioritize_selection(
                by_columns.read_pod(raw_pod), columns.select(names), columns.groups, verb
            )
            assert got == expected, (verb, weights, raw_pod["metadata"]["annotations"], names)


@pytest.mark.parametrize("seed", range(8))
def test_scores_from_the_columns_equal_scores_from_every_nodes_facts(seed: int) -> None:
    rng = random.Random(seed)
    reader = NodeReader()
    facts = {f"n{i}": random_node(rng, reader, f"n{i}", i) for i in range(rng.randint(1, 40))}
    assert_same_scores(rng, facts, NodeColumns(facts), rounds=12)


@pytest.mark.parametrize("seed", range(6))
def test_columns_updated_event_by_event_equal_columns_built_afresh(seed: int) -> None:
    rng = random.Random(100 + seed)
    reader = NodeReader()
    facts: dict[str, NodeFacts] = {}
    columns = NodeColumns(key_limit=rng.choice([3, 8, 1000]))  # small limits rebuild the id table
    for version in range(300):
        name = f"n{rng.randint(0, 25)}"
        if rng.random() < 0.15:
            facts.pop(name, None)
            columns.drop(name)
        elif name in facts and rng.random() < 0.5:  # the same inventory, new free GPUs or usage
            changed = dataclasses.replace(facts[name], published_free=frozenset(rng.sample(range(8), 3)))
            facts[name] = changed
            columns.put(name, changed)
        else:
            facts[name] = random_node(rng, reader, name, version)
            columns.put(name, facts[name])
    fresh = NodeColumns(facts)
    assert columns.facts == facts
    assert columns.ready == fresh.ready and columns.ready_at == fresh.ready_at
    assert set(columns.gpu.ids) == set(facts)
    assert columns.gpu.counts == Counter(columns.gpu.ids.values())
    groups = columns.groups()
    assert sum(groups.counts) == len(facts)
    assert {g.gpu_key for g in groups} == {f.gpu_key for f in facts.values()}
    for name, node_facts in facts.items():
        assert columns.gpu.reps[columns.gpu.ids[name]].gpu_key == node_facts.gpu_key  # type: ignore[union-attr]
    assert_same_scores(rng, facts, columns, rounds=6)


@pytest.mark.parametrize("seed", range(5))
def test_holding_all_is_exactly_the_nodes_whose_affinity_is_full(seed: int) -> None:
    rng = random.Random(200 + seed)
    reader = NodeReader()
    facts = {f"n{i}": random_node(rng, reader, f"n{i}", i) for i in range(30)}
    columns = NodeColumns(facts)
    for index in range(20):
        request = Framework(Settings()).read_pod(random_pod(rng, index))
        wants = request.datasets
        full = {name for name, f in facts.items() if wants and dataset.affinity(wants, f.inventory) == len(wants)}
        assert dataset.holding_all(wants, columns.ready, columns.ready_at) == full
