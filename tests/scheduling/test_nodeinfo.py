"""Reading node annotations into facts: tolerant, cached."""

from __future__ import annotations

import json
import logging

import pytest

from scheduler_plugin.testing import holding, inventory_json, node, topology_json
from scheduling.nodeinfo import NodeReader, parse_free_gpus, parse_inventory


def test_a_full_node_is_read() -> None:
    facts = NodeReader().read(
        node(
            "n1",
            inventory=inventory_json(datasets={"imagenet": holding()}),
            topology=topology_json(),
            free_gpus=[0, 1, 4],
        )
    )
    assert facts.inventory is not None and facts.inventory.datasets["imagenet"].ready
    assert [c.name for c in facts.classes] == ["gpu-roce1", "gpu-roce2"]
    assert facts.free_gpus == {0, 1, 4}
    assert facts.free_by_class == {"gpu-roce1": 2, "gpu-roce2": 1}
    assert facts.allocatable_gpus == 8


@pytest.mark.parametrize(
    "text",
    ["{not json", "[]", '{"version": 1}', '{"datasets": []}'],
    ids=["not-json", "not-object", "no-datasets", "datasets-not-object"],
)
def test_an_unparseable_inventory_is_an_error_not_an_exception(text: str) -> None:
    inventory, error = parse_inventory(text)
    assert inventory is None and error


def test_malformed_inventory_entries_are_skipped() -> None:
    inventory, error = parse_inventory(
        '{"datasets": {"good": {"state": "ready", "digest": "AA"}, "bad": 5, "worse": {}}}'
    )
    assert error is None and inventory is not None
    assert list(inventory.datasets) == ["good"] and inventory.datasets["good"].digest == "aa"


def test_an_older_version_in_use_marks_the_dataset_in_use() -> None:
    entry = holding("b" * 32, versions=[{"digest": "a" * 32, "state": "ready", "inUse": True, "sizeBytes": 1}])
    inventory, _ = parse_inventory(inventory_json(datasets={"imagenet": entry}))
    assert inventory is not None and inventory.datasets["imagenet"].in_use


@pytest.mark.parametrize(
    ("text", "expected"), [("0,1,4,5", {0, 1, 4, 5}), ("", set()), (" 3 ", {3}), ("a,b", None), (None, None)]
)
def test_free_gpus_annotation(text: str | None, expected: set[int] | None) -> None:
    assert parse_free_gpus(text) == expected


def test_unreadable_topology_is_an_error() -> None:
    facts = NodeReader().read(node("n1", topology='{"version": 1, "gpus": "nope"}'))
    assert facts.topology is None and facts.topology_error


def test_a_topology_with_garbled_classes_is_an_error_not_an_exception() -> None:
    doc = json.loads(topology_json())
    doc["classes"][0]["gpus"] = ["zero", "one"]
    facts = NodeReader().read(node("n1", topology=json.dumps(doc)))
    assert facts.topology is None and facts.topology_error and facts.classes == ()


def test_published_classes_are_taken_as_published_even_none() -> None:
    """An agent whose class rule could not be applied (subnet mode, NICs without addresses)
    publishes ``classes: []``: no classes here either, as the webhook and the node's device
    plugin see it; only a document without ``classes`` has them recomputed."""
    doc = json.loads(topology_json())
    doc["classes"] = []
    facts = NodeReader().read(node("n1", topology=json.dumps(doc), free_gpus=range(8)))
    assert facts.topology is not None and facts.classes == () and facts.free_by_class == {}
    del doc["classes"]
    facts = NodeReader().read(node("n2", topology=json.dumps(doc), free_gpus=range(8)))
    assert [c.name for c in facts.classes] == ["gpu-roce1", "gpu-roce2"]


def test_free_indices_the_topology_lacks_are_ignored() -> None:
    facts = NodeReader().read(node("n1", topology=topology_json(), free_gpus="0,1,42"))
    assert facts.free_gpus == {0, 1}


def test_without_a_free_list_the_best_subset_of_the_free_count_is_assumed(caplog: pytest.LogCaptureFixture) -> None:
    reader = NodeReader()
    with caplog.at_level(logging.INFO):
        facts = reader.read(node("n1", topology=topology_json(), gpus=8), used_gpus=4)
    assert facts.free_count == 4
    assert facts.free_gpus in ({0, 1, 2, 3}, {4, 5, 6, 7})
    assert "publishes no dsagent.io/free-gpus" in caplog.text


def test_facts_are_cached_by_resource_version() -> None:
    reader = NodeReader()
    first = reader.read(node("n1", inventory=inventory_json(), resource_version="7"))
    assert reader.read(node("n1", inventory=inventory_json(), resource_version="7")) is first
    changed = reader.read(node("n1", inventory=inventory_json(), free_gpus=[1], resource_version="8"))
    assert changed is not first and changed.published_free == {1}
    assert changed.inventory is first.inventory  # same annotation text: parsed once


def test_the_reader_forgets_old_nodes_when_full() -> None:
    reader = NodeReader(limit=10)
    for i in range(25):
        reader.read(node(f"n{i}", free_gpus=[0], resource_version=str(i)))
    assert reader.cached("n24", "24") is not None
    assert reader.cached("n0", "0") is None


def test_allocatable_gpus_count_a_class_set_and_gpu_all_once() -> None:
    """Issue 22: the reader summed every resource starting with the class prefix, so a node
    whose device plugin serves two classes of 4 and their set read as 16 GPUs (24 with
    NVIDIA's plugin beside it), and its free count (allocatable minus requests) doubled."""
    advertised = {
        "dsagent.io/gpu-roce1": "4",
        "dsagent.io/gpu-roce2": "4",
        "dsagent.io/gpu-roce1-2": "8",
        "dsagent.io/gpu-all": "8",
    }
    facts = NodeReader().read(node("n1", gpus=8, extra_allocatable=advertised), used_gpus=4)
    assert facts.allocatable_gpus == 8
    assert NodeReader().read(node("n2", gpus=None, extra_allocatable=advertised)).allocatable_gpus == 8
