"""The node inventory contract: its JSON schema, validation, the annotation budget, and
how a report lists a version.

Who calls it: tests and the Kubernetes integration (which publishes the inventory as the
Node annotation ``dsagent.io/inventory``); the scheduler extender reads the same shape
(it never imports this module: it reads the published JSON). The inventory itself is
built by :meth:`dsagent.cache.service.CacheService.inventory`. Peers read other agents'
inventories (``GET /v1/inventory``, or the annotation in cluster mode) with :func:`holds`
to find who holds a version (:mod:`dsagent.cache.peers.peerfetch`,
:mod:`dsagent.cluster.peerlist`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema

from dsagent.errors import InvalidInput
from dsplatform import published

ANNOTATION = published.INVENTORY
ANNOTATION_BUDGET = 64 * 1024
#: a peer's whole ``GET /v1/inventory`` (not budgeted like the annotation): ~20,000 versions
PEER_INVENTORY_MAX_BYTES = 4 << 20
#: the API server's limit on all the annotations of one object together
ANNOTATION_MAX_BYTES = 256 << 10


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The committed JSON schema (``dsagent/cache/inventory.schema.json``)."""
    text = resources.files("dsagent.cache").joinpath("inventory.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def validate(inventory: dict[str, Any]) -> None:
    """Raise :class:`InvalidInput` naming the first place ``inventory`` breaks the schema."""
    try:
        jsonschema.validate(inventory, schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise InvalidInput(f"inventory does not match its schema at {where}: {exc.message}") from exc


def compact(inventory: dict[str, Any], budget: int = ANNOTATION_BUDGET) -> str:
    """Compact JSON within ``budget`` bytes: drops the least recently used non-ready
    entries first, then the least recently used others, and sets ``"truncated": true``."""
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


def holds(inventory: Mapping[str, Any], name: str, digest: str) -> str | None:
    """``"ready"`` or ``"fetching"``: how an inventory report (``GET /v1/inventory``, the Node
    annotation) lists ``name@digest``; None when it does not."""
    datasets = inventory.get("datasets") if isinstance(inventory, Mapping) else None
    entry = datasets.get(name) if isinstance(datasets, Mapping) else None
    if not isinstance(entry, Mapping):
        return None
    versions = entry.get("versions") or [entry]
    if not isinstance(versions, list):
        return None
    states = {v.get("state") for v in versions if isinstance(v, Mapping) and v.get("digest") == digest}
    return "ready" if "ready" in states else "fetching" if "fetching" in states else None


__all__ = ["ANNOTATION", "ANNOTATION_BUDGET", "compact", "holds", "schema", "validate"]
