"""The NodeCache contract: what the agent writes every reader reads back alike, the
fallback to an older agent's Node annotations, and what readers refuse."""

from __future__ import annotations

import json

from dsagent.nodeagent.publisher import desired_annotations, node_state
from dsplatform import published
from dsplatform.wire import nodecache
from scheduling.nodeinfo import NodeReader
from tools.support.fake_apiserver import make_node, make_nodecache

INVENTORY = {"version": 1, "node": "n1", "capacityBytes": None, "freeBytes": 0, "datasets": {}}


def test_what_the_agent_writes_reads_back_as_the_annotations_it_replaces() -> None:
    state = node_state(INVENTORY, '{"version":1}')
    obj = nodecache.document(
        "n1", "uid-1", nodecache.status(state["inventory"], state["topology"], "2030-01-01T00:00:00Z")
    )
    assert obj["metadata"] == {
        "name": "n1",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}],
    }
    assert nodecache.published_of(obj) == {
        published.INVENTORY: state["inventory"],
        published.TOPOLOGY: '{"version":1}',
        published.PUBLISHED_AT: "2030-01-01T00:00:00Z",
    }
    assert json.loads(state["inventory"])["node"] == "n1"


def test_a_field_over_its_budget_is_left_out() -> None:
    status = nodecache.status("x" * (nodecache.INVENTORY_MAX_BYTES + 1), "y" * (nodecache.TOPOLOGY_MAX_BYTES + 1), "t")
    assert "inventory" not in status and "topology" not in status


def test_a_reader_takes_the_nodecache_when_present_else_the_node_annotations() -> None:
    """The rolling upgrade: a node of an older agent still carries its annotations."""
    old = desired_annotations({**INVENTORY, "datasets": {"old": {"digest": "a", "state": "ready"}}}, None, [0, 1])
    node = {
        **make_node("n1", annotations={**old, "other": "kept"}),
        "metadata": {**make_node("n1")["metadata"], "annotations": {**old, "other": "kept"}, "resourceVersion": "7"},
    }
    assert nodecache.overlay(node, None) is node  # no NodeCache: the Node as it is
    cache = make_nodecache("n1", inventory=json.dumps(INVENTORY))
    cache["metadata"]["resourceVersion"] = "9"
    seen = nodecache.overlay(node, nodecache.state_of(cache))
    annotations = seen["metadata"]["annotations"]
    assert json.loads(annotations[published.INVENTORY])["datasets"] == {}  # the NodeCache's, not the Node's
    assert published.TOPOLOGY not in annotations  # never mixed with a leftover annotation
    assert annotations["other"] == "kept" and annotations[published.FREE_GPUS] == "0,1"  # stays on the Node
    assert seen["metadata"]["resourceVersion"] == "7+9"  # a change of either is a new version


def test_the_extender_s_reader_reads_both_forms_alike() -> None:
    reader = NodeReader()
    text = json.dumps({**INVENTORY, "datasets": {"coco": {"digest": "d", "state": "ready", "sizeBytes": 5}}})
    old = make_node("n1", annotations={published.INVENTORY: text})
    old["metadata"]["resourceVersion"] = "1"
    new = make_node("n2")
    new["metadata"]["resourceVersion"] = "1"
    cache = make_nodecache("n2", inventory=text)
    cache["metadata"]["resourceVersion"] = "2"
    facts_old = reader.read(old)  # type: ignore[arg-type]
    facts_new = reader.read(nodecache.overlay(new, nodecache.state_of(cache)))  # type: ignore[arg-type]
    assert facts_old.inventory is not None and facts_new.inventory is not None
    assert facts_old.inventory.datasets == facts_new.inventory.datasets


def test_hostile_objects_publish_nothing() -> None:
    for obj in (None, [], {"status": "x"}, {"status": {"inventory": 5, "topology": ["x"]}}, {"metadata": {}}):
        assert nodecache.published_of(obj) == {}
    assert nodecache.by_node([{"metadata": {"name": 3}}, {"kind": "x"}]) == {}


def test_the_merge_patch_sends_what_changed_and_removes_what_went() -> None:
    assert nodecache.merge_patch({"inventory": "a", "publishedAt": "t"}, None) == {
        "status": {"inventory": "a", "topology": None, "publishedAt": "t"}
    }
    written = {"version": 1, "inventory": "a", "topology": "x", "publishedAt": "t"}
    assert nodecache.merge_patch({"version": 1, "inventory": "b", "publishedAt": "t"}, written) == {
        "status": {"inventory": "b", "topology": None}
    }
