"""The agent's side of the node inventory contract: its JSON schema and the check against it.

The contract itself (the document, its budget, how a reader finds a version) is
:mod:`dsplatform.wire.inventory`, which the agent writes and every reader parses;
its names are re-exported here for the agent's callers. Who calls :func:`validate`: the
tests of the writer (``GET /v1/inventory``, the published annotation).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema

from dsagent.errors import InvalidInput
from dsplatform.wire.inventory import (
    ANNOTATION,
    ANNOTATION_BUDGET,
    ANNOTATION_MAX_BYTES,
    PEER_INVENTORY_MAX_BYTES,
    compact,
    holds,
)


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


__all__ = [
    "ANNOTATION",
    "ANNOTATION_BUDGET",
    "ANNOTATION_MAX_BYTES",
    "PEER_INVENTORY_MAX_BYTES",
    "compact",
    "holds",
    "schema",
    "validate",
]
