"""How many nodes of the cluster hold each dataset version ready (docs/design.md#cluster-eviction).

A ready copy is an unpacked version, or a stripe share holding every bundle: a whole copy
kept as a share serves any peer every bundle, so the store need not serve the version again.

Who calls it: the Dataset controller (:mod:`dsagent.controller.copycounts`) counts the copies from
the node inventories it already reads (:func:`count_copies`) and publishes them as one
ConfigMap document (the wire contract :mod:`dsplatform.wire.copycounts`); each agent in
cluster mode (:mod:`dsagent.nodeagent.clusteragent`) reads that document back into its
:class:`ClusterCopies`, from which :mod:`dsagent.cache.space` fills ``Candidate.copies`` for
the eviction policy (:mod:`dsagent.policy.eviction`).

Decisions:

- **One document from the controller**, not every agent reading every Node: the
  controller lists the Nodes anyway (once per resync, one process), while N agents each
  listing N inventories of up to 64 KiB is N^2 traffic on the API server. Agents read one
  small ConfigMap instead.
- **Counts, not holder names**: the names would not fit one object at thousands of nodes.
  An agent subtracts itself when it holds the version ready: when the controller has not
  yet seen that copy, the agent's figure is one low, which keeps a version rather than
  evicting it.
- **One keeper per version with several copies**: the controller names one holder, by
  rendezvous hashing over the holders (:func:`tally`). To its keeper a copy reads as the
  last one, to the other holders as replicated. Counts are up to a resync old, so two
  holders of a version's only two copies, short of room at once, would each have counted
  the other's copy and evicted both; now only the one that is not the keeper may, and
  however many agents evict at once, the keeper's copy stays. The store would otherwise
  serve that version again.
- **Stale or missing counts read as unknown** (``None``), which the policy ranks as a last
  copy: a controller that stopped publishing makes eviction plain LRU again, never more
  eager. Entries past the size budget are dropped fewest copies first; a dropped entry
  also reads as "no other copy", exactly what a count of 1 told its only holder.
- Everything read is hostile input (:func:`dsplatform.wire.copycounts.parse_copies`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dsplatform.names import is_digest, is_name
from dsplatform.stripe import hrw_score
from dsplatform.wire.copycounts import Key
from dsplatform.wire.inventory import versions_of, whole_share


def ready_versions(inventory: Mapping[str, Any]) -> dict[Key, Mapping[str, Any]]:
    """The versions one node's inventory (hostile) lists ready, each once with its entry
    (:func:`dsplatform.wire.inventory.versions_of`): names and digests checked."""
    datasets = inventory.get("datasets")
    found: dict[Key, Mapping[str, Any]] = {}
    for name in datasets if isinstance(datasets, Mapping) else ():
        if not is_name(name):
            continue
        for version in versions_of(inventory, name):
            digest = version.get("digest")
            if version.get("state") == "ready" and is_digest(digest):
                found.setdefault((name, str(digest)), version)
    return found


def whole_shares(inventory: Mapping[str, Any]) -> dict[Key, Mapping[str, Any]]:
    """The striped versions one node's inventory (hostile) lists with every bundle held (a
    whole copy held as a share: :func:`dsplatform.wire.inventory.whole_share`), each with
    its entry."""
    stripes = inventory.get("stripes")
    found: dict[Key, Mapping[str, Any]] = {}
    for name, share in stripes.items() if isinstance(stripes, Mapping) else ():
        digest = share.get("digest") if isinstance(share, Mapping) else None
        if is_name(name) and is_digest(digest) and whole_share(inventory, name, str(digest)):
            found[(name, str(digest))] = share
    return found


def held_copies(
    inventory: Mapping[str, Any], versions: Mapping[Key, Mapping[str, Any]] | None = None
) -> dict[Key, Mapping[str, Any]]:
    """Every whole copy one node's inventory lists: its ready versions (``versions``, where
    the caller has its :func:`ready_versions`) and its whole shares (:func:`whole_shares`),
    each version once; what the copy counts count."""
    return {**whole_shares(inventory), **(ready_versions(inventory) if versions is None else versions)}


def count_copies(inventories: Iterable[Mapping[str, Any]]) -> dict[Key, int]:
    """Whole copies per ``(name, digest)`` over node inventories (one per node, hostile):
    ready versions and shares holding every bundle (:func:`held_copies`)."""
    counts: dict[Key, int] = {}
    for inventory in inventories:
        for key in held_copies(inventory):
            counts[key] = counts.get(key, 0) + 1
    return counts


class Tally(NamedTuple):
    """Over a pass's node inventories: ready copies per version, and the keeper of each
    version that more than one node holds ready."""

    counts: dict[Key, int]
    keepers: dict[Key, str]


def tally(
    inventories: Mapping[str, Mapping[str, Any]],
    *,
    ready: Callable[[Mapping[str, Any]], Mapping[Key, Mapping[str, Any]]] = held_copies,
    keeper_of: Callable[[Key, list[str]], str] | None = None,
) -> Tally:
    """:class:`Tally` of ``inventories`` (node name -> its inventory), in one walk. A keeper
    (:func:`keeper`) is the holder first by rendezvous hashing of its node name with the
    version, so that a holder joining or leaving moves few keepers. ``ready``: what
    :func:`held_copies` answers, ``keeper_of``: what :func:`keeper` answers for a version and
    its holders (a caller may remember either for what it read before)."""
    holders: dict[Key, list[str]] = {}
    for node, inventory in inventories.items():
        for key in ready(inventory):
            holders.setdefault(key, []).append(node)
    choose = keeper_of if keeper_of is not None else _keeper
    return Tally(
        {key: len(nodes) for key, nodes in holders.items()},
        {key: choose(key, nodes) for key, nodes in holders.items() if len(nodes) > 1},
    )


def _keeper(version: Key, holders: list[str]) -> str:
    return keeper(f"{version[0]}@{version[1]}", holders)


def keeper(version: str, holders: Iterable[str]) -> str:
    """The keeper of ``version`` (``name@digest``) among the node names ``holders``: the
    first by rendezvous hashing."""
    return max(holders, key=lambda node: hrw_score(node, version))


def keepers(inventories: Mapping[str, Mapping[str, Any]]) -> dict[Key, str]:
    """The keeper of each version that more than one node holds ready (:func:`tally`)."""
    return tally(inventories).keepers


@dataclass
class ClusterCopies:
    """The latest counts an agent read and when the controller made them; :meth:`others`
    answers the policy's question."""

    counts: dict[Key, int] = field(default_factory=dict)
    made_at: float | None = None  # the document's ``at``; None: never read
    max_age: float = 300.0  # older counts are not trusted: the controller stopped publishing
    keepers: dict[Key, str] = field(default_factory=dict)
    node: str | None = None  # this agent's node: to whom its keepers' copies are last copies

    def update(
        self,
        counts: Mapping[Key, int],
        made_at: float,
        kept_by: Mapping[Key, str] | None = None,
        node: str | None = None,
    ) -> None:
        """The counts made at ``made_at``, each version's keeper (``kept_by``) and this
        agent's ``node``."""
        self.counts, self.made_at = dict(counts), made_at
        self.keepers, self.node = dict(kept_by or {}), node

    def fresh(self, now: float) -> bool:
        """Made within ``max_age`` of ``now`` (either way: clocks of two machines differ a little)."""
        return self.made_at is not None and abs(now - self.made_at) <= self.max_age

    def others(self, name: str, digest: str, *, ready_here: bool, now: float) -> int | None:
        """Other nodes holding ``name@digest`` ready; None when no fresh count is known; 0
        when this node is the version's keeper and holds it ready (to it, the last copy)."""
        if not self.fresh(now):
            return None
        if ready_here and self.node is not None and self.keepers.get((name, digest)) == self.node:
            return 0
        total = self.counts.get((name, digest), 0)
        return max(0, total - (1 if ready_here else 0))


__all__ = [
    "ClusterCopies",
    "Key",
    "Tally",
    "count_copies",
    "held_copies",
    "keeper",
    "keepers",
    "ready_versions",
    "tally",
    "whole_shares",
]
