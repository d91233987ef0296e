"""The copy counts: how many nodes hold each dataset version ready, as one ConfigMap. Version 1.

Writer: the Dataset controller (:mod:`dsagent.controller.copycounts`), from the counts and
keepers :mod:`dsagent.policy.copies` makes of the node inventories. Reader: every agent in
cluster mode (:mod:`dsagent.nodeagent.clusteragent`), into the
:class:`dsagent.policy.copies.ClusterCopies` its eviction policy asks.

The document, the ConfigMap's one data key :data:`DATA_KEY`::

    version   1
    at        when the counts were made (epoch seconds)
    copies    "name@digest" -> how many nodes hold that version ready
    keepers   "name@digest" -> the node that keeps the version's last copy, for each
              version more than one node holds (absent in the first form: counts alone)

A reader treats it as another party's JSON: bounded size, names and digests checked, counts
bounded non-negative integers, a keeper a node name; anything else is skipped. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from dsplatform.names import is_digest, is_name

VERSION = 1
#: The ConfigMap the controller writes and agents read (in the chart's namespace).
CONFIGMAP = "dsplatform-dataset-copies"
#: Its one data key.
DATA_KEY = "copies.json"
#: A ConfigMap holds at most 1 MiB; stay well inside it.
BUDGET_BYTES = 900 * 1024
_MAX_COUNT = 1_000_000
_MAX_NODE_NAME = 253  # a Kubernetes object name

#: a dataset version: (name, digest)
Key = tuple[str, str]


def copies_document(
    counts: Mapping[Key, int], *, at: float, keepers: Mapping[Key, str] | None = None, budget: int = BUDGET_BYTES
) -> str:
    """The ConfigMap's JSON: ``{"version": VERSION, "at": seconds, "copies": {"name@digest": n},
    "keepers": {"name@digest": node}}`` within ``budget`` bytes, dropping the versions with
    the fewest copies first when it would not fit. ``at``: when the counts were made (epoch
    seconds). An agent from before ``keepers`` reads the counts alone."""
    entries = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    keepers = keepers or {}
    while True:
        kept = sorted(entries)
        doc = {
            "version": VERSION,
            "at": round(at, 3),
            "copies": {f"{n}@{d}": c for (n, d), c in kept},
            "keepers": {f"{n}@{d}": keepers[(n, d)] for (n, d), _ in kept if (n, d) in keepers},
        }
        text = json.dumps(doc, separators=(",", ":"))
        if len(text) <= budget or not entries:
            return text
        entries = entries[: max(0, len(entries) - max(1, len(entries) // 10))]


class Published(NamedTuple):
    """What a ConfigMap document says: the counts, when they were made, the keepers."""

    counts: dict[Key, int]
    at: float
    keepers: dict[Key, str]


def parse_copies(text: Any, *, limit: int = 1 << 20) -> Published | None:
    """The counts and keepers in a ConfigMap document and when they were made, or None when
    it is not one (hostile input; a keeper that is not a node name is skipped)."""
    if not isinstance(text, str) or len(text) > limit:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    copies = doc.get("copies") if isinstance(doc, dict) and doc.get("version") == VERSION else None
    at = doc.get("at") if isinstance(doc, dict) else None
    if (
        not isinstance(copies, dict)
        or not isinstance(at, (int, float))
        or isinstance(at, bool)
        or not math.isfinite(at)
    ):
        return None
    out: dict[Key, int] = {}
    for key, count in copies.items():
        name, _, digest = str(key).rpartition("@")
        if is_name(name) and is_digest(digest) and type(count) is int and 0 <= count <= _MAX_COUNT:
            out[(name, digest)] = count
    named = doc.get("keepers")
    keeping: dict[Key, str] = {}
    for key, node in named.items() if isinstance(named, dict) else ():
        name, _, digest = str(key).rpartition("@")
        if (name, digest) in out and isinstance(node, str) and 0 < len(node) <= _MAX_NODE_NAME:
            keeping[(name, digest)] = node
    return Published(out, float(at), keeping)


__all__ = ["BUDGET_BYTES", "CONFIGMAP", "DATA_KEY", "VERSION", "Key", "Published", "copies_document", "parse_copies"]
