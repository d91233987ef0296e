"""Partial holdings and striped versions: how much of a pod's share a node holds.

Who calls it: :meth:`scheduler_plugin.framework.Framework.dataset_scores`, in place of the
all-or-nothing dataset affinity whenever a candidate holds part of a wanted dataset (a copy
still being fetched, the inventory's ``heldBytes``, or a share of a striped version, its
``stripes`` section; both parsed by :mod:`scheduling.nodeinfo`, ``Inventory.partial``). :func:`helds` reads those
from the candidates. It stays a score, never a filter.

Raw score of a node for one dataset of a pod of an ``N``-worker job (``S`` the version's
bytes, so each worker reads about ``S / N``):

- ``local = min(1, (held + fetching_weight * fetching) / (S / N))``: bytes on the node's
  disk (a whole copy, or its stripe share), and a copy still arriving at a discount;
- a member of the version's stripe group whose other members share its RoCE subnet earns
  ``peer_credit * (1 - local)`` on top: the rest of its share comes from a peer over the
  subnet, not from the store; a non-member earns nothing for peers. The other members are
  the candidates holding a share, and the group the member's inventory lists (members that
  are no candidates: no free GPUs, or filtered out, still serve their bundles);
- summed over the pod's datasets, each counting at most 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler_plugin.plugins import normalize_to_max
from scheduling.nodeinfo import Inventory
from scheduling.podspec import DatasetWant

FETCHING_WEIGHT = 0.5
PEER_CREDIT = 0.5


@dataclass(frozen=True)
class Held:
    """What one node holds of one wanted version."""

    size_bytes: int  # the version's whole size S
    held_bytes: int = 0  # on this node's disk, verified
    fetching_bytes: int = 0  # arriving now (a copy being fetched)
    group_member: bool = False  # the node is in the version's stripe group
    peers_in_subnet: bool = False  # other group members share its RoCE subnet


def share_score(
    held: Held, workers: int, *, fetching_weight: float = FETCHING_WEIGHT, peer_credit: float = PEER_CREDIT
) -> float:
    """One dataset's raw score in 0..1 (see the module docstring)."""
    if held.size_bytes <= 0:
        return 0.0
    share = held.size_bytes / max(1, workers)
    local = min(1.0, (held.held_bytes + fetching_weight * held.fetching_bytes) / share)
    if held.group_member and held.peers_in_subnet:
        local += peer_credit * (1.0 - local)
    return max(0.0, local)


def raw(helds: Sequence[Held], workers: int) -> float:
    """A node's raw score for a pod: the sum over its wanted datasets."""
    return sum(share_score(h, workers) for h in helds)


def helds(
    wants: Sequence[DatasetWant],
    inventories: Sequence[Inventory | None],
    subnets: Callable[[int], frozenset[str]],
    *,
    names: Sequence[str] | None = None,
    subnets_of: Callable[[str], frozenset[str]] | None = None,
) -> list[list[Held] | None]:
    """Per candidate, what it holds of each wanted dataset (None: it would replace a version
    that running tasks use, which the dataset score never rewards). ``subnets(i)``: the RoCE
    subnets of candidate ``i``; a stripe member earns peer credit when another candidate in
    the same group shares one, or, with ``names`` (the candidates' node names) and
    ``subnets_of`` (any node's subnets by name, empty when unknown), another member of the
    group its inventory lists."""
    sizes: dict[str, int] = {}
    members: dict[str, list[int]] = {}
    by_subnet: dict[tuple[str, ...], dict[str, set[str]]] = {}  # a listed group's members per subnet

    def listed_near(i: int, group: tuple[str, ...]) -> bool:
        """Another member of the listed ``group`` shares a subnet with candidate ``i``."""
        if names is None or subnets_of is None or not group:
            return False
        index = by_subnet.get(group)
        if index is None:  # once per group, not per candidate: a group may list thousands
            index = by_subnet[group] = {}
            for m in group:
                for s in subnets_of(m):
                    index.setdefault(s, set()).add(m)
        return any(index.get(s, set()) - {names[i]} for s in subnets(i))

    for i, inventory in enumerate(inventories):
        if inventory is None:
            continue
        for want in wants:
            share = inventory.stripes.get(want.name)
            if share is not None and (want.digest is None or want.digest == share.digest):
                members.setdefault(want.name, []).append(i)
                sizes[want.name] = max(sizes.get(want.name, 0), share.size_bytes)
            holding = inventory.datasets.get(want.name)
            if holding is not None and holding.size_bytes and (want.digest is None or want.digest == holding.digest):
                sizes[want.name] = max(sizes.get(want.name, 0), holding.size_bytes)
    sizes.update({w.name: w.size_bytes for w in wants if w.size_bytes})
    out: list[list[Held] | None] = []
    for i, inventory in enumerate(inventories):
        if inventory is None:
            out.append([])
            continue
        row: list[Held] = []
        replaces_in_use = False
        for want in wants:
            size = sizes.get(want.name, 0)
            held = fetching = 0
            holding = inventory.datasets.get(want.name)
            if holding is not None:
                current = want.digest is None or want.digest == holding.digest
                if not current and holding.in_use:
                    replaces_in_use = True
                    break
                if current and holding.ready:
                    held = size
                elif current:
                    fetching = holding.held_bytes or 0
            group = members.get(want.name, ())
            member = i in group
            near = False
            if member:
                held = max(held, inventory.stripes[want.name].held_bytes)
                near = any(j != i and subnets(i) & subnets(j) for j in group)
                near = near or listed_near(i, inventory.stripes[want.name].group)
            row.append(Held(size, held, fetching, group_member=member, peers_in_subnet=near))
        out.append(None if replaces_in_use else row)
    return out


def scores(helds_: Sequence[list[Held] | None], workers: int) -> list[int]:
    """0..10 per candidate: :func:`raw` over its helds, normalized."""
    return normalize([raw(h, workers) if h is not None else 0.0 for h in helds_])


def normalize(raws: Sequence[float]) -> list[int]:
    """0..10 over the candidates, best first (the dataset score's rule)."""
    return normalize_to_max(raws)


__all__ = [
    "FETCHING_WEIGHT",
    "Held",
    "PEER_CREDIT",
    "helds",
    "normalize",
    "raw",
    "scores",
    "share_score",
]
