"""The nodes' inventories as the Dataset controller's passes read them.

Who calls it: :class:`dsagent.controller.reconcile.DatasetController`, once a pass
(:meth:`InventoryReader.fresh`, :meth:`InventoryReader.index`, the copy counts' ``ready`` and
``keeper``) and per Dataset (:meth:`DatasetIndex.holdings`, :meth:`DatasetIndex.listing`).

What it owns: the work that depends only on what an inventory says, done once per inventory
rather than once per pass or per Dataset, and kept from one pass to the next:

- an inventory's text is parsed once: the same text as the last pass is the same parsed
  object (read-only), never parsed again (:meth:`InventoryReader.fresh`); inventories are
  hostile input: one that is not JSON or not an object is skipped, never trusted, and one
  older than the bound (its ``dsagent.io/published-at``) is used for nothing;
- what is read from one inventory object (its ready versions, what it holds of each dataset at
  each digest: :class:`Facts`) is worked out the first pass it is seen;
- the keeper of each version several nodes hold (rendezvous hashing over the holders) is
  worked out again only when its holders change;
- an index of the inventories by the datasets they list (:class:`DatasetIndex`), brought up
  to date each pass from the inventories that changed, so that one Dataset's holdings read
  the few nodes that list it, and are worked out again only when one of those changed.

What a pass read and did not read again is forgotten at the end of the next one, so the
state kept is that of the nodes as they are now.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from dsagent.controller.cachestate import Holding, held_versions
from dsagent.policy import copies
from dsagent.policy.copies import Key
from dsplatform import published
from dsplatform.boundedjson import JsonRefused
from dsplatform.kubetime import parse_or_none
from dsplatform.wire import inventory as wire_inventory

JSON = dict[str, Any]


def parse_inventory(raw: Any) -> dict[str, Any] | None:
    """A Node's inventory annotation, or None when it cannot be read (hostile input)."""
    if not isinstance(raw, str):
        return None
    try:
        return wire_inventory.loads(raw)
    except JsonRefused:
        return None


class Facts(NamedTuple):
    """What one inventory says, read once: its whole copies (ready versions and shares
    holding every bundle, :func:`dsagent.policy.copies.held_copies`), and per dataset name it lists (a copy or a
    stripe share), digest -> :class:`~dsagent.controller.cachestate.Holding`
    (:func:`~dsagent.controller.cachestate.held_versions`)."""

    ready: dict[Key, Mapping[str, Any]]
    held: dict[str, dict[str, Holding]]
    versions: dict[Key, Mapping[str, Any]]
    """its ready versions alone (:func:`dsagent.policy.copies.ready_versions`)"""


def facts_of(inventory: Mapping[str, Any]) -> Facts:
    """:class:`Facts` of one inventory (hostile input: a name that is not a string is skipped)."""
    datasets = inventory.get("datasets")
    stripes = inventory.get("stripes")
    names = list(datasets) if isinstance(datasets, Mapping) else []
    if isinstance(stripes, Mapping):
        names += [n for n in stripes if n not in datasets] if isinstance(datasets, Mapping) else list(stripes)
    held = {name: held_versions(inventory, name) for name in names if isinstance(name, str)}
    versions = copies.ready_versions(inventory)
    return Facts(copies.held_copies(inventory, versions), held, versions)


class DatasetIndex:
    """The inventories by the datasets they list, kept up to date from pass to pass
    (:meth:`update`: only the nodes whose inventory changed are read again), so that one
    Dataset's holdings read the few nodes that list it, not every node (a pass over 5,000
    nodes and 1,000 Datasets would walk five million inventories), and are worked out once
    and then only changed where a node's inventory changed."""

    def __init__(self) -> None:
        self.inventories: Mapping[str, Mapping[str, Any]] = {}  # what it indexes now
        self._nodes: dict[str, tuple[Mapping[str, Any], Facts]] = {}  # node -> its inventory, read
        self._listing: dict[str, dict[str, Mapping[str, Any]]] = {}  # name -> node -> inventory
        self._held: dict[str, dict[str, dict[str, Holding]]] = {}  # name -> node -> digest -> holding
        self._answers: dict[str, tuple[str, dict[str, Holding]]] = {}  # name -> (digest, its holdings)

    def update(self, inventories: Mapping[str, Mapping[str, Any]], facts: Callable[[Mapping[str, Any]], Facts]) -> None:
        """Index ``inventories`` (node -> inventory) now; ``facts``: what an inventory says."""
        self.inventories = inventories
        for node in [n for n in self._nodes if n not in inventories]:
            self._drop(node)
        for node, inv in inventories.items():
            known = self._nodes.get(node)
            if known is not None and known[0] is inv:
                continue
            if known is not None:
                self._drop(node)
            found = facts(inv)
            self._nodes[node] = (inv, found)
            for name, versions in found.held.items():
                self._listing.setdefault(name, {})[node] = inv
                self._held.setdefault(name, {})[node] = versions
                answer = self._answers.get(name)
                if answer is not None and answer[0] in versions:  # the answer given follows the node
                    answer[1][node] = versions[answer[0]]

    def _drop(self, node: str) -> None:
        for name in self._nodes.pop(node)[1].held:
            for index in (self._listing, self._held):
                nodes = index[name]
                del nodes[node]
                if not nodes:
                    del index[name]
            if name not in self._held:
                self._answers.pop(name, None)
            elif (answer := self._answers.get(name)) is not None:
                answer[1].pop(node, None)

    def listing(self, name: str) -> Mapping[str, Mapping[str, Any]]:
        """node -> inventory, for the inventories that list ``name``."""
        return self._listing.get(name, {})

    def holdings(self, name: str, digest: str | None) -> dict[str, Holding]:
        """What :func:`dsagent.controller.cachestate.holdings` answers of every inventory
        (read-only: the answer is kept, and brought up to date as the inventories listing
        ``name`` change, while the Dataset asks for the same digest)."""
        held = self._held.get(name)
        if not digest or held is None:
            return {}
        known = self._answers.get(name)
        if known is not None and known[0] == digest:
            return known[1]
        found = {node: versions[digest] for node, versions in held.items() if digest in versions}
        self._answers[name] = (digest, found)
        return found


class InventoryReader:
    """The inventories one controller's passes read, and what it keeps from pass to pass
    (the module docstring); :meth:`next_pass` at the start of each."""

    def __init__(self) -> None:
        self._texts: dict[str, tuple[str, dict[str, Any]]] = {}  # node -> its inventory's text, parsed
        self._stamps: dict[str, float | None] = {}  # published-at stamp -> its time, read this pass
        # by the inventory's id (the inventory kept with them, so its id is not reused): what
        # it says, for the inventories read this pass and for those of the last pass
        self._facts: dict[int, tuple[Mapping[str, Any], Facts]] = {}
        self._facts_before: dict[int, tuple[Mapping[str, Any], Facts]] = {}
        # version -> (its holders, their keeper), this pass and the last
        self._keepers: dict[Key, tuple[tuple[str, ...], str]] = {}
        self._keepers_before: dict[Key, tuple[tuple[str, ...], str]] = {}
        self._index = DatasetIndex()

    def next_pass(self) -> None:
        """What the last pass read is kept for this one; what it did not read, forgotten."""
        self._facts_before, self._facts = self._facts, {}
        self._keepers_before, self._keepers = self._keepers, {}

    def fresh(self, nodes: Sequence[Mapping[str, Any]], now: float, max_age: float) -> dict[str, dict[str, Any]]:
        """node -> its inventory, for the nodes whose inventory parses and is not stale (its
        ``dsagent.io/published-at`` within ``max_age`` of ``now``): nothing is decided on an
        older one (docs/operator-guide/tenancy.md)."""
        inventories = {}
        parsed, self._texts = self._texts, {}
        stamps, self._stamps = self._stamps, {}
        read_stamp = partial(self._stamp, before=stamps)
        for node in nodes:
            meta = node.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            if published.stale(annotations, now, max_age, parse=read_stamp):
                continue
            name, raw = meta.get("name", ""), annotations.get(published.INVENTORY)
            known = parsed.get(name) if isinstance(raw, str) else None
            # the same text as last pass: the same inventory (read-only), not parsed again
            inv = known[1] if known is not None and known[0] == raw else parse_inventory(raw)
            if inv is not None:
                inventories[name] = inv
                if isinstance(raw, str):
                    self._texts[name] = (raw, inv)
        return inventories

    def _stamp(self, raw: Any, before: dict[str, float | None]) -> float | None:
        """:func:`dsplatform.kubetime.parse_or_none` of a published-at stamp, read again only
        when it is not one read the last pass."""
        if not isinstance(raw, str):
            return parse_or_none(raw)
        if raw in self._stamps:
            return self._stamps[raw]
        found = self._stamps[raw] = before[raw] if raw in before else parse_or_none(raw)
        return found

    def facts(self, inventory: Mapping[str, Any]) -> Facts:
        """:class:`Facts` of ``inventory``, read again only from an inventory not read last pass."""
        key = id(inventory)
        known = self._facts.get(key) or self._facts_before.get(key)
        found = known[1] if known is not None and known[0] is inventory else facts_of(inventory)
        self._facts[key] = (inventory, found)
        return found

    def held_copies(self, inventory: Mapping[str, Any]) -> Mapping[Key, Mapping[str, Any]]:
        """:func:`dsagent.policy.copies.held_copies` of ``inventory`` (its :class:`Facts`)."""
        return self.facts(inventory).ready

    def ready_versions(self, inventory: Mapping[str, Any]) -> Mapping[Key, Mapping[str, Any]]:
        """:func:`dsagent.policy.copies.ready_versions` of ``inventory`` (its :class:`Facts`)."""
        return self.facts(inventory).versions

    def keeper(self, version: Key, holders: Sequence[str]) -> str:
        """:func:`dsagent.policy.copies.keeper` of ``version`` among ``holders``, worked out
        again only when they are not the holders of the last pass."""
        nodes = tuple(holders)
        known = self._keepers.get(version) or self._keepers_before.get(version)
        if known is not None and known[0] == nodes:
            chosen = known[1]
        else:
            chosen = copies.keeper(f"{version[0]}@{version[1]}", nodes)
        self._keepers[version] = (nodes, chosen)
        return chosen

    def index(self, inventories: Mapping[str, Mapping[str, Any]]) -> DatasetIndex:
        """The :class:`DatasetIndex` of ``inventories`` (the one this reader keeps, brought up
        to date)."""
        self._index.update(inventories, self.facts)
        return self._index


__all__ = ["DatasetIndex", "Facts", "InventoryReader", "facts_of", "parse_inventory"]
