"""How many nodes of the cluster hold each dataset version ready (docs/design.md#cluster-eviction).

Who calls it: the Dataset controller (:mod:`dsagent.controller.copycounts`) counts the copies from
the node inventories it already reads (:func:`count_copies`) and publishes them as one
ConfigMap document (:func:`copies_document`); each agent in cluster mode
(:mod:`dsagent.cluster.nodeagent`) reads that document back (:func:`parse_copies`) into its
:class:`ClusterCopies`, from which :mod:`dsagent.cache.space` fills ``Candidate.copies`` for
the eviction policy (:mod:`dsagent.cache.eviction`).

Decisions:

- **One document from the controller**, not every agent reading every Node: the
  controller lists the Nodes anyway (once per resync, one process), while N agents each
  listing N inventories of up to 64 KiB is N^2 traffic on the API server. Agents read one
  small ConfigMap instead.
- **Counts, not holder names**: the names would not fit one object at thousands of nodes.
  An agent subtracts itself when it holds the version ready: when the controller has not
  yet seen that copy, the agent's figure is one low, which keeps a version rather than
  evicting it.
- **Stale or missing counts read as unknown** (``None``), which the policy ranks as a last
  copy: a controller that stopped publishing makes eviction plain LRU again, never more
  eager. Entries past the size budget are dropped fewest copies first; a dropped entry
  also reads as "no other copy", exactly what a count of 1 told its only holder.
- Everything read is hostile input: bounded size, names and digests checked, counts
  bounded non-negative integers; anything else is skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dsplatform.names import is_digest, is_name

#: The ConfigMap the controller writes and agents read (in the chart's namespace).
CONFIGMAP = "dsplatform-dataset-copies"
#: Its one data key.
DATA_KEY = "copies.json"
#: A ConfigMap holds at most 1 MiB; stay well inside it.
BUDGET_BYTES = 900 * 1024
_MAX_COUNT = 1_000_000

Key = tuple[str, str]


def _versions(entry: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield entry
    listed = entry.get("versions")
    if isinstance(listed, list):
        yield from (v for v in listed if isinstance(v, Mapping))


def count_copies(inventories: Iterable[Mapping[str, Any]]) -> dict[Key, int]:
    """Ready copies per ``(name, digest)`` over node inventories (one per node, hostile)."""
    counts: dict[Key, int] = {}
    for inventory in inventories:
        datasets = inventory.get("datasets")
        if not isinstance(datasets, Mapping):
            continue
        seen: set[Key] = set()  # a node counts once per version, however often it lists it
        for name, entry in datasets.items():
            if not is_name(name) or not isinstance(entry, Mapping):
                continue
            for version in _versions(entry):
                digest = version.get("digest")
                if version.get("state") == "ready" and is_digest(digest):
                    seen.add((name, str(digest)))
        for key in seen:
            counts[key] = counts.get(key, 0) + 1
    return counts


def copies_document(counts: Mapping[Key, int], *, at: float, budget: int = BUDGET_BYTES) -> str:
    """The ConfigMap's JSON: ``{"version": 1, "at": seconds, "copies": {"name@digest": n}}``
    within ``budget`` bytes, dropping the versions with the fewest copies first when it
    would not fit. ``at``: when the counts were made (epoch seconds)."""
    entries = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    while True:
        text = json.dumps(
            {"version": 1, "at": round(at, 3), "copies": {f"{n}@{d}": c for (n, d), c in sorted(entries)}},
            separators=(",", ":"),
        )
        if len(text) <= budget or not entries:
            return text
        entries = entries[: max(0, len(entries) - max(1, len(entries) // 10))]


def parse_copies(text: Any, *, limit: int = 1 << 20) -> tuple[dict[Key, int], float] | None:
    """The counts in a ConfigMap document and when they were made, or None when it is not
    one (hostile input)."""
    if not isinstance(text, str) or len(text) > limit:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    copies = doc.get("copies") if isinstance(doc, dict) and doc.get("version") == 1 else None
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
    return out, float(at)


@dataclass
class ClusterCopies:
    """The latest counts an agent read and when the controller made them; :meth:`others`
    answers the policy's question."""

    counts: dict[Key, int] = field(default_factory=dict)
    made_at: float | None = None  # the document's ``at``; None: never read
    max_age: float = 300.0  # older counts are not trusted: the controller stopped publishing

    def update(self, counts: Mapping[Key, int], made_at: float) -> None:
        self.counts, self.made_at = dict(counts), made_at

    def fresh(self, now: float) -> bool:
        """Made within ``max_age`` of ``now`` (either way: clocks of two machines differ a little)."""
        return self.made_at is not None and abs(now - self.made_at) <= self.max_age

    def others(self, name: str, digest: str, *, ready_here: bool, now: float) -> int | None:
        """Other nodes holding ``name@digest`` ready; None when no fresh count is known."""
        if not self.fresh(now):
            return None
        total = self.counts.get((name, digest), 0)
        return max(0, total - (1 if ready_here else 0))


__all__ = ["BUDGET_BYTES", "CONFIGMAP", "DATA_KEY", "ClusterCopies", "copies_document", "count_copies", "parse_copies"]
