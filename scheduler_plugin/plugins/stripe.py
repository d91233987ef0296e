"""Partial holdings and striped versions: how much of a pod's share a node holds.

Who calls it: nothing in :mod:`scheduler_plugin.framework` yet (it is a pure score with its
inputs parsed by :mod:`scheduling.nodeinfo`: the inventory's ``heldBytes`` of a copy
being fetched and its ``stripes`` section); docs/design-striping.md#scheduler says how it is
meant to join the combined score. It stays a score, never a filter.

Raw score of a node for one dataset of a pod of an ``N``-worker job (``S`` the version's
bytes, so each worker reads about ``S / N``):

- ``local = min(1, (held + fetching_weight * fetching) / (S / N))``: bytes on the node's
  disk (a whole copy, or its stripe share), and a copy still arriving at a discount;
- a member of the version's stripe group whose other members share its RoCE subnet earns
  ``peer_credit * (1 - local)`` on top: the rest of its share comes from a peer over the
  subnet, not from the store; a non-member earns nothing for peers;
- summed over the pod's datasets, each counting at most 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_plugin.plugins import normalize_to_max

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


def normalize(raws: Sequence[float]) -> list[int]:
    """0..10 over the candidates, best first (the dataset score's rule)."""
    return normalize_to_max(raws)


__all__ = ["FETCHING_WEIGHT", "Held", "PEER_CREDIT", "normalize", "raw", "share_score"]
