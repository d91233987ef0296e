"""Which nodes form a striped version's group, and in which order a node gives space back:
pure functions (docs/design-striping.md#group, docs/design-striping.md#eviction).

Who calls it: the Dataset controller, for a Dataset whose version does not fit one node (or
that asks for striping): it gathers the nodes and their inventories, asks :func:`choose_group`
for the members, records them in the Dataset status (``status.stripe.nodes``) and holds each
member's share with a leased ``PUT /v1/stripes/<name>`` it renews each pass, as replicas
are held with renewed tasks (docs/design.md#replication). A node's agent orders its eviction candidates with
:func:`eviction_class`. Nothing here reads the clock or the cluster.

The group: ``k = group_size(S, C)`` members (:func:`dsplatform.stripe.group_size`), or the
``members`` a Dataset asks for, and at least every node of the job: a pod reads a striped
version through its own node's share (its agent serves it the others' bundles through the
window), so a job's node left out of the group would have nothing to read through. In this
order:

1. the job's own nodes (its ranks then read their share from local disk);
2. nodes that hold bundles of the version already (their share moves least), most bytes first;
3. nodes with room for a share (free bytes at least ``ratio x S / k``) in the RoCE subnet of
   the first member chosen, most free bytes first; then, only if the subnet has too few,
   nodes with room anywhere.

Members chosen before stay while they qualify (no flapping): a group change moves ~1/k of the
bundles (rendezvous hashing), but every change moves some. They also keep their order: the
list's order is part of the group (readers home their buckets by position), so the members
chosen before come first, as they were, and the new ones after them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dsagent.cache import eviction
from dsagent.cache.eviction import LAST_COPY, REPLICATED, STRIPE_SHARE
from dsplatform.stripe import group_size


@dataclass(frozen=True)
class Candidate:
    """One node as the group choice sees it."""

    name: str
    free_bytes: int
    held_bytes: int = 0  # bytes of the version's bundles it holds now
    subnet: str | None = None  # its RoCE subnet (class set), None: unknown
    cache_bytes: int = 0  # its whole cache


def choose_group(
    nodes: Sequence[Candidate],
    *,
    size_bytes: int,
    job_nodes: Sequence[str] = (),
    before: Sequence[str] = (),
    members: int | None = None,
    budget: float = 0.5,
    ratio: float = 1.2,
) -> list[str]:
    """The group's members, in the order chosen (fewer when fewer qualify; empty for no nodes).

    ``members`` defaults to ``group_size(size, smallest cache)`` with ``budget``; a group has
    at least as many members as ``job_nodes`` among ``nodes`` (each is one). A node of the
    job or of ``before`` is taken without a room check (its share is the point of the group,
    or is there already); any other needs ``ratio x size / k`` free bytes."""
    if not nodes:
        return []
    by_name = {n.name: n for n in nodes}
    if members is None:
        caches = [n.cache_bytes for n in nodes if n.cache_bytes > 0]
        members = group_size(size_bytes, min(caches), budget=budget, headroom=ratio) if caches else len(nodes)
    k = max(1, min(max(members, len({n for n in job_nodes if n in by_name})), len(nodes)))
    need = math.ceil(ratio * max(0, size_bytes) / k)
    chosen: list[str] = []

    def take(name: str) -> None:
        if name in by_name and name not in chosen and len(chosen) < k:
            chosen.append(name)

    for name in job_nodes:
        take(name)
    for name in sorted(before, key=lambda n: (-by_name[n].held_bytes if n in by_name else 0, n)):
        take(name)
    for node in sorted(nodes, key=lambda n: (-n.held_bytes, n.name)):
        if node.held_bytes > 0:
            take(node.name)
    subnet = by_name[chosen[0]].subnet if chosen else None
    roomy = sorted((n for n in nodes if n.free_bytes >= need), key=lambda n: (-n.free_bytes, n.name))
    for node in roomy:
        if subnet is None or node.subnet == subnet:
            take(node.name)
    for node in roomy:
        take(node.name)
    # the earlier members first, in their earlier order: the order is part of the group (a
    # rank's buckets are homed by position, dsplatform.stripe.bucket_of), and an agent takes a
    # reordered list for a new group; shares filling must not reorder it
    return [n for n in before if n in chosen] + [n for n in chosen if n not in before]


def eviction_class(*, striped: bool, other_copies: int | None) -> int:
    """Where a candidate stands in the eviction order (the rule is
    :func:`dsagent.cache.eviction.eviction_class`): whole copies that other nodes also hold
    go first (:data:`REPLICATED`), then stripe shares (:data:`STRIPE_SHARE`), then last
    copies (:data:`LAST_COPY`)."""
    return eviction.eviction_class(eviction.Candidate("", "", 0, 0.0, copies=other_copies, striped=striped))


def eviction_order(candidates: Sequence[tuple[str, bool, int | None, float]]) -> list[str]:
    """Names of ``(name, striped, other_copies, last_used)`` candidates in eviction order
    (:func:`dsagent.cache.eviction.eviction_order`)."""
    return [
        c.name
        for c in eviction.eviction_order(
            eviction.Candidate(name, "", 0, last_used, copies=copies, striped=striped)
            for name, striped, copies, last_used in candidates
        )
    ]


__all__ = ["Candidate", "LAST_COPY", "REPLICATED", "STRIPE_SHARE", "choose_group", "eviction_class", "eviction_order"]
