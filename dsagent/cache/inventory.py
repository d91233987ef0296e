"""The node inventory contract: its JSON schema, validation, and the annotation budget.

Who calls it: tests and the Kubernetes integration (which publishes the inventory as the
Node annotation ``dsagent.io/inventory``); the scheduler extender reads the same shape
(it never imports this module: it reads the published JSON). The inventory itself is
built by :meth:`dsagent.cache.service.CacheService.inventory`.
"""

from __future__ import annotations

import json
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


__all__ = ["ANNOTATION", "ANNOTATION_BUDGET", "compact", "schema", "validate"]
