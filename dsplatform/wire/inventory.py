"""The node inventory: what a node's agent says it holds. Version 1.

Writer: the agent. :func:`document` and :func:`dataset_entry` build it (called by
:func:`dsagent.cache.report.inventory`); ``GET /v1/inventory`` answers it whole, and the
cluster mode's publisher (:mod:`dsagent.nodeagent.publisher`) writes it as the Node annotation
``dsagent.io/inventory``, cut to :data:`ANNOTATION_BUDGET` by :func:`compact`. Readers, each
through :func:`loads` and :func:`versions_of`: the peers (:mod:`dsagent.nodeagent.peerlist`,
:mod:`dsagent.cache.peers.peerfetch`, with :func:`holds`), the scheduler extender
(:mod:`scheduling.nodeinfo`) and the Dataset controller (:mod:`dsagent.controller.reconcile`,
:mod:`dsagent.controller.cachestate`). Its JSON schema, checked in the agent's tests, is
``dsagent/cache/inventory.schema.json`` (:mod:`dsagent.cache.inventory`).

The document::

    version        1
    node           the node's name (null: a standalone agent)
    capacityBytes  the cache's capacity; freeBytes: its free bytes
    datasets       name -> the current version: digest, sizeBytes, files, state (ready,
                   fetching, failed), inUse, lastUsed; heldBytes while fetching; versions
                   (digest, state, inUse, sizeBytes of each) when more than one is cached
    stripes        name -> this node's share of a striped version (docs/design-striping.md):
                   digest, sizeBytes, heldBytes, windowBytes (bytes its readers took through
                   the window), members (the group's size) and group (the
                   node names of the members that own bundles, from which any reader
                   computes each bundle's owner; the annotation's budget drops it first)
    truncated      true when the annotation's budget dropped datasets
    features       what this agent understands beyond version 1's first form (absent: none),
                   so that a cluster with agents of two releases (a rolling upgrade) asks
                   each only for what it can do: ``stripeNoShare``, a stripe group member
                   that owns no bundle (``noShare`` in ``PUT /v1/stripes/<name>``);
                   ``stripeOnDemand``, a share whose store reads wait for readers
                   (``storeOnDemand`` in the same body); ``stripeWindowBytes``, its
                   ``stripes`` entries count ``windowBytes``

A reader treats it as another party's JSON: bounded (:data:`ANNOTATION_MAX_BYTES`, or
:data:`PEER_INVENTORY_MAX_BYTES` for a peer's whole answer), and a field of the wrong type
counts as absent. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dsplatform import boundedjson, published

#: the version of this document (its ``version`` field)
VERSION = 1
ANNOTATION = published.INVENTORY
#: the annotation's size: the least recently used entries are dropped beyond it
ANNOTATION_BUDGET = 64 * 1024
#: the API server's limit on all the annotations of one object together
ANNOTATION_MAX_BYTES = 256 << 10
#: a peer's whole ``GET /v1/inventory`` (not budgeted like the annotation): ~20,000 versions
PEER_INVENTORY_MAX_BYTES = 4 << 20
#: what the inventory says of the current version, copied from the agent's version view
ENTRY_KEYS = ("digest", "sizeBytes", "files", "state", "inUse", "lastUsed")
#: what it says of each version when more than one is cached
VERSION_KEYS = ("digest", "state", "inUse", "sizeBytes")
#: the most member names a ``stripes`` entry's ``group`` lists (a reader takes none past it)
MAX_GROUP = 4096
#: a feature: the agent takes stripe group members that own no bundle (``noShare``)
STRIPE_NO_SHARE = "stripeNoShare"
#: a feature: the agent holds a share whose store reads wait for readers (``storeOnDemand``)
STRIPE_ON_DEMAND = "stripeOnDemand"
#: a feature: the agent counts its readers' window bytes (``windowBytes`` in ``stripes``)
STRIPE_WINDOW_BYTES = "stripeWindowBytes"
#: what this release's agents understand (its ``features`` field)
FEATURES = (STRIPE_NO_SHARE, STRIPE_ON_DEMAND, STRIPE_WINDOW_BYTES)


def dataset_entry(versions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One dataset's entry from its cached versions' views (``GET /v1/datasets`` rows), in
    resolution order: the last is the current one."""
    newest = versions[-1]
    entry = {key: newest[key] for key in ENTRY_KEYS}
    if newest["state"] == "fetching":
        entry["heldBytes"] = newest["bytesDone"]  # a copy being fetched earns partial credit
    if len(versions) > 1:
        entry["versions"] = [{key: v[key] for key in VERSION_KEYS} for v in versions]
    return entry


def document(
    node: str | None,
    *,
    capacity_bytes: int | None,
    free_bytes: int,
    datasets: Mapping[str, Mapping[str, Any]],
    stripes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The inventory document (``datasets``: name -> :func:`dataset_entry`)."""
    return {
        "version": VERSION,
        "node": node,
        "capacityBytes": capacity_bytes,
        "freeBytes": free_bytes,
        "datasets": dict(datasets),
        **({"stripes": dict(stripes)} if stripes else {}),
        "features": list(FEATURES),
    }


def has_feature(inventory: Mapping[str, Any], feature: str) -> bool:
    """Whether the inventory's agent says it understands ``feature`` (an agent from before
    the field says nothing, and is taken to understand none)."""
    features = inventory.get("features")
    return isinstance(features, list) and feature in features


def compact(inventory: Mapping[str, Any], budget: int = ANNOTATION_BUDGET) -> str:
    """Compact JSON within ``budget`` bytes: drops the stripe groups' member lists first
    (readers then ask the members in turn), then the least recently used non-ready
    entries, then the least recently used others, and sets ``"truncated": true``."""
    text = json.dumps(inventory, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) <= budget:
        return text
    stripes = inventory.get("stripes")
    if isinstance(stripes, Mapping) and any("group" in s for s in stripes.values()):
        ungrouped = {n: {k: v for k, v in s.items() if k != "group"} for n, s in stripes.items()}
        inventory = {**inventory, "stripes": ungrouped}
        text = json.dumps(inventory, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) <= budget:
            return text
    datasets = dict(inventory["datasets"])
    order = sorted(datasets, key=lambda n: (datasets[n]["state"] == "ready", datasets[n].get("lastUsed") or "", n))
    trimmed = {**inventory, "datasets": datasets, "truncated": True}
    for name in order:
        del datasets[name]
        text = json.dumps(trimmed, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) <= budget:
            return text
    return json.dumps(trimmed, separators=(",", ":"), sort_keys=True)


def loads(text: str | bytes, *, max_bytes: int = ANNOTATION_MAX_BYTES, what: str = ANNOTATION) -> dict[str, Any]:
    """An inventory another agent wrote; :class:`~dsplatform.boundedjson.JsonRefused` when it
    is too large, too deep, not JSON or not an object with a ``datasets`` object."""
    doc = boundedjson.loads(text, what=what, max_bytes=max_bytes)
    if not isinstance(doc, dict) or not isinstance(doc.get("datasets"), dict):
        raise boundedjson.JsonRefused(f"{what} has no 'datasets' object")
    return doc


def versions_of(inventory: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    """The versions of ``name`` an inventory lists (its current entry first), objects only."""
    datasets = inventory.get("datasets")
    entry = datasets.get(name) if isinstance(datasets, Mapping) else None
    if not isinstance(entry, Mapping):
        return []
    versions = entry.get("versions")
    more = [v for v in versions if isinstance(v, Mapping)] if isinstance(versions, list) else []
    return [entry, *more]


def holds(inventory: Mapping[str, Any], name: str, digest: str) -> str | None:
    """How an inventory lists ``name@digest``: ``"ready"`` or ``"fetching"`` (a copy; a
    share of the striped version holding every bundle is a ready copy too: it serves them
    all), ``"share"`` (a share with bundles held: it serves those); None when it does not."""
    if not isinstance(inventory, Mapping):
        return None
    states = {v.get("state") for v in versions_of(inventory, name) if v.get("digest") == digest}
    if "ready" in states or "fetching" in states:
        return "ready" if "ready" in states else "fetching"
    if whole_share(inventory, name, digest):
        return "ready"
    stripes = inventory.get("stripes")
    share = stripes.get(name) if isinstance(stripes, Mapping) else None
    if isinstance(share, Mapping) and share.get("digest") == digest and boundedjson.count(share.get("heldBytes")) > 0:
        return "share"
    return None


def whole_share(inventory: Mapping[str, Any], name: str, digest: str, *, size_bytes: int = 0) -> bool:
    """Whether an inventory's ``stripes`` entry for ``name`` is ``digest`` with every bundle
    held (``heldBytes`` reaching a known ``sizeBytes``): a whole copy held as a share.
    ``size_bytes``: the version's size as the caller knows it, for an entry that does not
    say its own (an agent of an earlier release)."""
    stripes = inventory.get("stripes") if isinstance(inventory, Mapping) else None
    share = stripes.get(name) if isinstance(stripes, Mapping) else None
    if not isinstance(share, Mapping) or share.get("digest") != digest:
        return False
    size = boundedjson.count(share.get("sizeBytes")) or max(0, size_bytes)
    return 0 < size <= boundedjson.count(share.get("heldBytes"))


def stripe_group(inventory: Mapping[str, Any], name: str, digest: str) -> tuple[str, ...]:
    """The node names of ``name@digest``'s stripe group as an inventory lists them; empty
    when it lists none, another version, or a malformed or oversized list."""
    stripes = inventory.get("stripes") if isinstance(inventory, Mapping) else None
    share = stripes.get(name) if isinstance(stripes, Mapping) else None
    if not isinstance(share, Mapping) or share.get("digest") != digest:
        return ()
    group = share.get("group")
    if not isinstance(group, list) or not 0 < len(group) <= MAX_GROUP:
        return ()
    if not all(isinstance(m, str) and 0 < len(m) <= 253 for m in group):
        return ()
    return tuple(group)


__all__ = [
    "ANNOTATION",
    "ANNOTATION_BUDGET",
    "ANNOTATION_MAX_BYTES",
    "ENTRY_KEYS",
    "MAX_GROUP",
    "PEER_INVENTORY_MAX_BYTES",
    "VERSION",
    "VERSION_KEYS",
    "compact",
    "dataset_entry",
    "document",
    "holds",
    "loads",
    "stripe_group",
    "versions_of",
    "whole_share",
]
