"""Which nodes form a striped version's group, and in which order a node gives space back:
pure functions (docs/design-striping.md#group, docs/design-striping.md#eviction).

Who calls it: the Dataset controller, for a Dataset whose version does not fit one node (or
that asks for striping): it gathers the nodes and their inventories, asks :func:`choose_group`
for the members, records them in the Dataset status (``status.stripe.nodes``) and holds each
member's share with a leased ``PUT /v1/stripes/<name>`` it renews each pass, as replicas
are held with renewed tasks (docs/design.md#replication). A node's agent orders its eviction candidates with
:func:`eviction_class`. Nothing here reads the clock or the cluster.

The group: ``members`` nodes, as many as :func:`dsagent.policy.holding.members_wanted`
gives (the job's nodes, or as many as the version needs with the headroom and the
per-member budget), or the ``members`` a Dataset asks for, and at least every node of the
job: a pod reads a striped version through its own node's share (its agent serves it the
others' bundles through the window), so a job's node left out of the group would have
nothing to read through. In this order:

1. the job's own nodes (its ranks then read their share from local disk);
2. nodes that hold bundles of the version already (their share moves least), most bytes first;
3. nodes with room for a share (at least ``ratio x S / k`` of free bytes and idle whole
   copies that other nodes hold too) in the RoCE subnet of the first member chosen, most
   room first; then, only if the subnet has too few, nodes with room anywhere.

A node of the job joins **without a share** (it owns no bundle: weight 0 in the owner rule)
when it holds nothing of the version and has no room for its share but by evicting the last
copy of another version: that copy would be read from the store again the next time it is
used, while its pods lose only local reads of their share. Another node with room owns in
its place. A member keeps its part, share or none, while it stays.

Members chosen before stay while they qualify (no flapping): a group change moves ~1/k of the
bundles (rendezvous hashing), but every change moves some. They also keep their order: the
list's order is part of the group (readers home their buckets by position), so the members
chosen before come first, as they were, and the new ones after them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from dsagent.policy import eviction
from dsagent.policy.eviction import EVICT_RATIO, LAST_COPY, REPLICATED, STRIPE_SHARE


@dataclass(frozen=True)
class Candidate:
    """One node as the group choice sees it."""

    name: str
    free_bytes: int
    held_bytes: int = 0  # bytes of the version's bundles it holds now
    subnet: str | None = None  # its RoCE subnet (class set), None: unknown
    cache_bytes: int = 0  # its whole cache
    # what it can free without evicting the last copy of another version: free bytes and
    # idle whole copies other nodes hold ready too (None: not known, taken as enough)
    spare_bytes: int | None = None
    # its agent takes members that own no bundle (an agent of an earlier release refuses them)
    takes_no_share: bool = True
    # bytes of the version its readers took through the window (from other members) since
    # it took part in the group: what holding it whole would have saved so far (None: its
    # agent does not count them, an earlier release)
    window_bytes: int | None = 0
    # its share of the version holds every bundle (``holding: whole``): not a copy of another
    # kind (an unpacked ready copy counts in ``held_bytes`` but holds no bundle)
    holds_whole: bool = False
    # bytes of its cache its pods' data holds (no eviction frees them)
    in_use_bytes: int = 0


class Group(NamedTuple):
    """The members in order, and those of them that own no bundle (weight 0)."""

    members: list[str]
    no_share: list[str]


def choose_group(
    nodes: Sequence[Candidate],
    *,
    size_bytes: int,
    job_nodes: Sequence[str] = (),
    before: Sequence[str] = (),
    no_share_before: Sequence[str] = (),
    members: int,
    ratio: float = EVICT_RATIO,
) -> Group:
    """The group's members, in order (fewer when fewer qualify; none for no nodes), and
    which of them own no bundle.

    ``members``: how many (:func:`dsagent.policy.holding.members_wanted`, or a Dataset's
    fixed count); a group has at least as many members as ``job_nodes`` among ``nodes``
    (each is one). A node of the
    job or of ``before`` is taken without a room check (its share is the point of the group,
    or is there already); any other needs ``ratio x size / k`` bytes of room (``spare_bytes``
    where known, else free bytes). A node of the job
    that joins holding nothing of the version, and whose ``spare_bytes`` are short of its
    share, joins without one: taking a share there would evict the last copy of another
    version, which the store would then serve again. Its pods read through its window; a
    node with room takes the share instead, so that ``members`` still own the version. A
    member keeps its part (share or none) while it stays (``no_share_before``). Where too
    few other nodes have room to own in their place, or where a member's agent does not
    take members without a share (``takes_no_share``: a release from before them, while an
    upgrade rolls), the job's nodes take their shares after all (a share larger than its
    owner's room checked would be refused), and nodes whose caches can hold a share beside
    their pods' data (``in_use_bytes``) own where too few have room without evicting a last
    copy."""
    if not nodes:
        return Group([], [])
    by_name = {n.name: n for n in nodes}
    job = [n for n in dict.fromkeys(job_nodes) if n in by_name]
    group = _choose(by_name, nodes, job, before, no_share_before, members, size_bytes, ratio, without_share=True)
    if group is not None and group.no_share and not all(by_name[m].takes_no_share for m in group.members):
        group = None  # a member's agent is of an earlier release (an upgrade rolling): all own
    if group is None:  # too few other nodes have room to own in their place
        group = _choose(by_name, nodes, job, before, no_share_before, members, size_bytes, ratio, without_share=False)
    assert group is not None
    return group


def _choose(
    by_name: dict[str, Candidate],
    nodes: Sequence[Candidate],
    job: list[str],
    before: Sequence[str],
    no_share_before: Sequence[str],
    members: int,
    size_bytes: int,
    ratio: float,
    *,
    without_share: bool,
) -> Group | None:
    """:func:`choose_group`'s choice for ``members`` wanted; None when some of the job's nodes
    would join without a share (``without_share``) but too few others can own instead."""
    k = max(1, min(max(members, len(job)), len(nodes)))
    need = math.ceil(ratio * max(0, size_bytes) / k)
    kept = set(before) - set(no_share_before)
    shareless = [
        n for n in job
        if without_share
        and (n in no_share_before or (n not in kept and by_name[n].held_bytes == 0 and _short(by_name[n], need)))
    ]  # fmt: skip
    # the owners: every other node of the job, and others up to the size rule's count
    owners = max(1, min(max(members, len(job) - len(shareless)), len(nodes) - len(shareless)))
    if shareless and len(nodes) == len(shareless):
        return None
    need = math.ceil(ratio * max(0, size_bytes) / owners)
    chosen: list[str] = list(job)

    def full() -> bool:
        return len(chosen) - len(shareless) >= owners

    def take(name: str) -> None:
        if name in by_name and name not in chosen and not full():
            chosen.append(name)

    for name in sorted(before, key=lambda n: (-by_name[n].held_bytes if n in by_name else 0, n)):
        if name not in no_share_before:  # one that owned nothing leaves with its job
            take(name)
    for name in _holders(nodes):
        take(name)
    subnet = by_name[chosen[0]].subnet if chosen else None
    # the tiers below are ranked only while owners are missing: at thousands of nodes a
    # ranking is most of a choice that the earlier members and holders already made
    roomy = [] if full() else sorted((n for n in nodes if _room(n) >= need), key=lambda n: (-_room(n), n.name))
    for node in roomy:
        if full():
            break
        if subnet is None or node.subnet == subnet:
            take(node.name)
    for node in roomy:
        if full():
            break
        take(node.name)
    if shareless and not full():
        return None
    if not shareless and not full():
        # too few nodes have room without evicting a last copy (and no job node was spared
        # its share for that): nodes whose caches can hold a share beside their pods' data
        # own too, the most room first; their agents evict for it (idle copies first, last
        # copies last). A share refused for room would have its bundles read from the store
        # every epoch, where the copies evicted for it are read again only when next used
        for node in sorted(
            (n for n in nodes if n.cache_bytes - n.in_use_bytes >= need), key=lambda n: (-_room(n), n.name)
        ):
            take(node.name)
    # the earlier members first, in their earlier order: the order is part of the group (a
    # rank's buckets are homed by position, dsplatform.stripe.bucket_of), and an agent takes a
    # reordered list for a new group; shares filling must not reorder it
    ordered = [n for n in before if n in chosen] + [n for n in chosen if n not in before]
    return Group(ordered, [n for n in ordered if n in shareless])


def _holders(nodes: Sequence[Candidate]) -> list[str]:
    """The nodes holding bytes of the version, most first."""
    return [n.name for n in sorted((n for n in nodes if n.held_bytes > 0), key=lambda n: (-n.held_bytes, n.name))]


def _room(node: Candidate) -> int:
    """What a node can give a share without evicting a last copy (its free bytes where that
    is not known)."""
    return node.free_bytes if node.spare_bytes is None else node.spare_bytes


def _short(node: Candidate, need: int) -> bool:
    return node.spare_bytes is not None and node.spare_bytes < need


def eviction_class(*, striped: bool, other_copies: int | None) -> int:
    """Where a candidate stands in the eviction order (the rule is
    :func:`dsagent.policy.eviction.eviction_class`): whole copies that other nodes also hold
    go first (:data:`REPLICATED`), then stripe shares (:data:`STRIPE_SHARE`), then last
    copies (:data:`LAST_COPY`)."""
    return eviction.eviction_class(eviction.Candidate("", "", 0, 0.0, copies=other_copies, striped=striped))


def eviction_order(candidates: Sequence[tuple[str, bool, int | None, float]]) -> list[str]:
    """Names of ``(name, striped, other_copies, last_used)`` candidates in eviction order
    (:func:`dsagent.policy.eviction.eviction_order`)."""
    return [
        c.name
        for c in eviction.eviction_order(
            eviction.Candidate(name, "", 0, last_used, copies=copies, striped=striped)
            for name, striped, copies, last_used in candidates
        )
    ]


__all__ = [
    "Candidate", "Group", "LAST_COPY", "REPLICATED", "STRIPE_SHARE", "choose_group", "eviction_class", "eviction_order",
]  # fmt: skip
