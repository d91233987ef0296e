"""Bounded JSON: the one parse for JSON that another party wrote.

Who calls it: the agent's peer code (a peer's ``GET /v1/inventory``, a node's inventory
annotation). What it owns: the rule that untrusted JSON is refused, as a
:class:`JsonRefused` (a :class:`VocabularyError`, so a 400 or exit 2 at the edges), when it
is larger than its input's byte limit, nested deeper than its depth limit, not JSON, or
has an object with the same key twice (which ``json.loads`` would read as the last one,
silently: ``{"name":"d","name":"e"}`` is refused, naming ``name``): never a
``RecursionError`` or a ``MemoryError`` escaping into the caller. Each input states
its own limits once, beside the code that knows what a legitimate document of that kind
looks like (e.g. ``dsagent.cache.inventory.PEER_INVENTORY_MAX_BYTES``).

Decision: the standard library's C parser, with its size checked before and its depth
after. CPython's scanner stops a document nested beyond the interpreter's recursion limit
with ``RecursionError`` before building it, so the depth walk only ever sees documents of
at most that depth; a streaming parser (ijson) would bound memory as it reads, but the byte
limit already does, and it would add a dependency for no input we accept.
"""

from __future__ import annotations

import json
from typing import Any

from dsplatform.errors import VocabularyError

#: deeper than anything the platform writes (an inventory is 5 levels), far below the stack
MAX_DEPTH = 32


class JsonRefused(VocabularyError):
    """JSON from another party that is too large, too deep or not JSON."""

    code = "invalid_json"


class DuplicateKey(ValueError):
    """An object of a JSON document has ``key`` twice (raised by :func:`unique_keys`)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :mod:`json`: the object, or :class:`DuplicateKey`. Every
    parse of another party's JSON uses it (here, and the extender's body walk)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return value


def loads(data: bytes | str, *, what: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """``data`` parsed, or :class:`JsonRefused` naming ``what`` and the limit it broke."""
    # a str has at most as many characters as its UTF-8 bytes: encode only what may fit
    if len(data) > max_bytes or (isinstance(data, str) and len(data.encode()) > max_bytes):
        raise JsonRefused(f"{what} is over {max_bytes} bytes")
    try:
        value = json.loads(data, object_pairs_hook=unique_keys)
    except RecursionError:
        raise JsonRefused(f"{what} is nested deeper than {max_depth} levels") from None
    except DuplicateKey as exc:
        raise JsonRefused(f"{what} has the key {exc.key!r} twice in one object") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonRefused(f"{what} is not JSON: {exc}") from None
    if depth(value) > max_depth:
        raise JsonRefused(f"{what} is nested deeper than {max_depth} levels")
    return value


def depth(value: Any) -> int:
    """How deeply ``value``'s lists and objects nest (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def count(value: Any) -> int:
    """A count in another party's parsed JSON: a whole number >= 0 as it is, anything else
    (a bool, a float, a string, a negative number, nothing) 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


__all__ = ["MAX_DEPTH", "DuplicateKey", "JsonRefused", "count", "depth", "loads", "unique_keys"]
