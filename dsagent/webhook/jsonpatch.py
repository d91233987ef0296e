"""RFC 6902 JSON Patch operations for admission responses: the type and the few builders we use.

Who calls it: :mod:`dsagent.webhook.mutation` (the hostPath wiring),
:mod:`dsagent.webhook.csiwiring` (the CSI wiring) and
:mod:`dsagent.webhook.roceclass` (the GPU class rewrite), whose operations the
webhook returns together. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

JSONPatch = list[dict[str, Any]]


def escape(key: str) -> str:
    """``key`` as one JSON Pointer segment (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


def prepend(path: str, existing: Sequence[Any] | None, item: Any) -> JSONPatch:
    """Put ``item`` first in the list at ``path`` (creating the list when absent)."""
    if existing is None:
        return [{"op": "add", "path": path, "value": [item]}]
    return [{"op": "add", "path": f"{path}/0", "value": item}]


def append_all(path: str, existing: Sequence[Any] | None, items: Sequence[Any]) -> JSONPatch:
    """Add ``items`` at the end of the list at ``path`` (creating the list when absent)."""
    if not items:
        return []
    if existing is None:
        return [{"op": "add", "path": path, "value": list(items)}]
    return [{"op": "add", "path": f"{path}/-", "value": item} for item in items]


__all__ = ["JSONPatch", "append_all", "escape", "prepend"]
