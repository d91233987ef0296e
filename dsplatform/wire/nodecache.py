"""The ``NodeCache`` custom resource: one node's published cache state. Version 1.

Writer: the node agent (:mod:`dsagent.nodeagent.clusteragent`, through
:mod:`dsagent.nodeagent.publisher`), one object per node, cluster-scoped, named after its
Node and owned by it (an ownerReference: the garbage collector deletes it with the Node).
Readers, each through :func:`published_of` or :func:`overlay`: the scheduler extender
(:mod:`scheduler_plugin.nodecache`, list+watch), the Dataset controller
(:mod:`dsagent.controller.reconcile`, a list per pass), the webhook's RoCE class vote and
deadline plans (:mod:`dsagent.webhook.roceclass`, :mod:`dsagent.webhook.deadlineplan`) and
the agents' peer list (:mod:`dsagent.nodeagent.clusterhooks`). Where the state lives and why
it left the Node: docs/design.md#node-state.

The object (``dsagent.io/v1alpha1``, kind ``NodeCache``; the CRD has no status subresource,
so the agent creates it and patches it whole in one request each)::

    metadata.name             the node's name
    metadata.ownerReferences  [{apiVersion: v1, kind: Node, name, uid}]
    status.version            1
    status.inventory          the compact inventory JSON (dsplatform.wire.inventory, within
                              :data:`INVENTORY_MAX_BYTES`: the budget it had as an annotation)
    status.topology           the compact topology JSON (gpu_topology's contract, within
                              :data:`TOPOLOGY_MAX_BYTES`); absent when the node has none
    status.publishedAt        when the agent last wrote it (RFC 3339, seconds): rewritten with
                              every change and at least every heartbeat, so a reader can tell a
                              stale inventory (docs/operator-guide/tenancy.md)

The inventory and topology keep their JSON text form: every reader already parses that text
(bounded, hostile input), and the CRD's ``maxLength`` holds the budget server-side.

A rolling upgrade (docs/operator-guide/upgrade.md#nodecache): readers of this release take a
node's ``NodeCache`` when there is one, else the Node annotations an agent of the release
before still writes (``dsagent.io/inventory``, ``dsagent.io/topology``,
``dsagent.io/published-at``); :func:`published_of` and :func:`overlay` say so in one place.
The small ``dsagent.io/free-gpus`` annotation stays on the Node.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from dsplatform import published

#: the version of the object's ``status`` (its ``status.version``)
VERSION = 1
GROUP = "dsagent.io"
API_VERSION = "v1alpha1"
PLURAL = "nodecaches"
KIND = "NodeCache"
#: the inventory's budget (bytes of compact JSON; the annotation's before)
INVENTORY_MAX_BYTES = 64 * 1024
#: the topology's budget (bytes of compact JSON; the annotation's before)
TOPOLOGY_MAX_BYTES = 32 * 1024
#: what a ``NodeCache`` carries, by the Node annotation it replaces
FIELDS = {
    published.INVENTORY: "inventory",
    published.TOPOLOGY: "topology",
    published.PUBLISHED_AT: "publishedAt",
}
#: the Node annotations an agent of the release before wrote and a ``NodeCache`` replaces
REPLACED_ANNOTATIONS = tuple(FIELDS)


def status(inventory: str | None, topology: str | None, published_at: str) -> dict[str, Any]:
    """The object's ``status``; a field over its budget is left out (its reader then sees none)."""
    doc: dict[str, Any] = {"version": VERSION, "publishedAt": published_at}
    if inventory is not None and len(inventory.encode()) <= INVENTORY_MAX_BYTES:
        doc["inventory"] = inventory
    if topology is not None and len(topology.encode()) <= TOPOLOGY_MAX_BYTES:
        doc["topology"] = topology
    return doc


def document(node: str, node_uid: str | None, state: Mapping[str, Any]) -> dict[str, Any]:
    """The whole object for a create: named after ``node``, owned by it when its uid is known."""
    metadata: dict[str, Any] = {"name": node}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {"apiVersion": f"{GROUP}/{API_VERSION}", "kind": KIND, "metadata": metadata, "status": dict(state)}


def merge_patch(state: Mapping[str, Any], written: Mapping[str, Any] | None) -> dict[str, Any]:
    """The smallest merge patch taking an object whose status is ``written`` to ``state``:
    the fields that changed, and null for a field ``state`` no longer carries; with
    ``written`` unknown (None: an object another run of the agent may have left), every
    field of ``state`` and null for each it lacks."""
    if written is None:
        return {"status": {**dict.fromkeys(("inventory", "topology")), **state}}
    patch: dict[str, Any] = {key: value for key, value in state.items() if written.get(key) != value}
    patch.update({key: None for key in written if key not in state})
    return {"status": patch}


def node_name(obj: Any) -> str | None:
    """The node a ``NodeCache`` object speaks for (its name), None when it has none."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name else None


def published_of(obj: Any) -> dict[str, str]:
    """What a ``NodeCache`` publishes, keyed by the Node annotation each field replaces, so a
    reader of either form reads one map. Hostile input: a field that is not a string counts
    as absent."""
    state = obj.get("status") if isinstance(obj, Mapping) else None
    if not isinstance(state, Mapping):
        return {}
    return {key: value for key, field in FIELDS.items() if isinstance(value := state.get(field), str)}


class NodeState(NamedTuple):
    """One node's ``NodeCache`` as a reader keeps it."""

    published: dict[str, str]  # :func:`published_of`
    resource_version: str  # the object's (empty when it says none)


def state_of(obj: Any) -> NodeState:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return NodeState(published_of(obj), version if isinstance(version, str) else "")


def by_node(items: Iterable[Any]) -> dict[str, NodeState]:
    """node name -> :func:`state_of`, from a list of ``NodeCache`` objects."""
    return {name: state_of(obj) for obj in items if (name := node_name(obj)) is not None}


def apply_event(states: dict[str, NodeState], kind: str, obj: Any) -> str | None:
    """A watch event of a ``NodeCache`` (``ADDED``, ``MODIFIED``, ``DELETED``) applied to
    ``states`` (:func:`by_node`); the node it speaks for, None when it names none."""
    owner = node_name(obj)
    if owner is None:
        return None
    if kind == "DELETED":
        states.pop(owner, None)
    else:
        states[owner] = state_of(obj)
    return owner


def published_annotations(annotations: Mapping[str, Any] | None, cache: Mapping[str, str] | None) -> dict[str, Any]:
    """A node's annotations as a reader of this release sees them: when the node has a
    ``NodeCache`` (``cache``, from :func:`published_of`), its fields replace the annotations
    it replaces (all of them: a leftover annotation never mixes with the object); else the
    Node's own annotations (an agent of the release before: the rolling upgrade)."""
    merged = dict(annotations or {})
    if cache is None:
        return merged
    for key in REPLACED_ANNOTATIONS:
        merged.pop(key, None)
    merged.update(cache)
    return merged


def overlay(node: Mapping[str, Any], state: NodeState | None) -> Mapping[str, Any]:
    """A raw Node object with :func:`published_annotations` as its annotations (the Node
    itself when it has no ``NodeCache``), and ``<node's>+<NodeCache's>`` as its
    resourceVersion, so that a reader caching what it read by resourceVersion sees either
    change; the rest of the object is shared, not copied."""
    if state is None:
        return node
    meta = node.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    annotations = meta.get("annotations")
    merged = published_annotations(annotations if isinstance(annotations, Mapping) else None, state.published)
    new_meta = {**meta, "annotations": merged}
    if isinstance(meta.get("resourceVersion"), str):
        new_meta["resourceVersion"] = f"{meta['resourceVersion']}+{state.resource_version}"
    return {**node, "metadata": new_meta}


__all__ = [
    "API_VERSION",
    "apply_event",
    "FIELDS",
    "GROUP",
    "INVENTORY_MAX_BYTES",
    "KIND",
    "NodeState",
    "PLURAL",
    "REPLACED_ANNOTATIONS",
    "TOPOLOGY_MAX_BYTES",
    "VERSION",
    "by_node",
    "document",
    "merge_patch",
    "node_name",
    "overlay",
    "published_annotations",
    "published_of",
    "state_of",
    "status",
]
