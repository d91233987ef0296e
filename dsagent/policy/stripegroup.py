"""Which nodes form a striped version's group: pure functions (docs/design-striping.md#group).

Who calls it: the Dataset controller, for a Dataset whose version does not fit one node (or
that asks for striping): it gathers the nodes and their inventories, asks :func:`choose_group`
for the members, records them in the Dataset status (``status.stripe.nodes``) and holds each
member's share with a leased ``PUT /v1/stripes/<name>`` it renews each pass, as replicas
are held with renewed tasks (docs/design.md#replication). In which order a node's agent gives
a share's space back is the eviction rule's (:func:`dsagent.policy.eviction.eviction_class`,
docs/design-striping.md#eviction). Nothing here reads the clock or the cluster.

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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload

from dsagent.policy.eviction import EVICT_RATIO


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


class Candidates(Sequence[Candidate]):
    """Nodes a group is chosen over, with what a choice reads of all of them worked out at
    most once: the nodes by name, the holders of the version's bytes and of whole copies,
    the ranking by room, the smallest cache. :func:`choose_group` and
    :func:`dsagent.policy.holding.choose_placement` make one of any sequence they are given.

    A caller choosing for many versions over the same nodes (the controller: every striped
    Dataset of a pass) makes one of the nodes as a version they hold nothing of sees them,
    and from it, with :meth:`but`, one per version, changed where that version differs (the
    few nodes holding some of it, those left out). A node's room is its own, the same for
    every version, so the ranking is made once, not once a version: at 5,000 nodes a choice
    then reads the nodes it takes, not all of them. The answers are those of the plain
    sequence: a changed node whose room differs has the ranking made again."""

    __slots__ = ("_nodes", "_by_name", "_index", "_ranked", "_holders", "_whole", "_smallest")

    def __init__(self, nodes: Iterable[Candidate]) -> None:
        self._nodes = list(nodes)
        self._by_name: dict[str, Candidate] | None = None
        self._index: dict[str, int] | None = None
        self._ranked: list[str] | None = None
        self._holders: list[str] | None = None
        self._whole: set[str] | None = None
        self._smallest: int | None = -1  # -1: not worked out yet

    @classmethod
    def of(cls, nodes: Sequence[Candidate]) -> Candidates:
        """``nodes`` as :class:`Candidates` (themselves when they are)."""
        return nodes if isinstance(nodes, Candidates) else cls(nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, at: int) -> Candidate: ...

    @overload
    def __getitem__(self, at: slice) -> Sequence[Candidate]: ...

    def __getitem__(self, at: int | slice) -> Candidate | Sequence[Candidate]:
        return self._nodes[at]

    def __iter__(self) -> Iterator[Candidate]:
        return iter(self._nodes)

    @property
    def by_name(self) -> dict[str, Candidate]:
        """name -> its candidate (the last of a name given twice). Read-only."""
        if self._by_name is None:
            self._by_name = {n.name: n for n in self._nodes}
        return self._by_name

    @property
    def holders(self) -> list[str]:
        """The nodes holding bytes of the version, most first."""
        if self._holders is None:
            self._holders = _by_held(n for n in self.by_name.values() if n.held_bytes > 0)
        return self._holders

    @property
    def whole(self) -> set[str]:
        """The nodes holding the version whole (:attr:`Candidate.holds_whole`). Read-only."""
        if self._whole is None:
            self._whole = {n.name for n in self.by_name.values() if n.holds_whole}
        return self._whole

    @property
    def smallest_cache(self) -> int | None:
        """The smallest known cache (None: none is known)."""
        if self._smallest == -1:
            self._smallest = min((n.cache_bytes for n in self.by_name.values() if n.cache_bytes > 0), default=None)
        return self._smallest

    def ranked(self) -> Iterator[Candidate]:
        """The nodes, the most room first (:func:`_room`; then by name)."""
        by_name = self.by_name
        return (by_name[name] for name in self._ranking() if name in by_name)

    def _ranking(self) -> list[str]:
        if self._ranked is None:
            self._ranked = [n.name for n in sorted(self.by_name.values(), key=lambda n: (-_room(n), n.name))]
        return self._ranked

    def but(self, changed: Iterable[Candidate] = (), *, without: Iterable[str] = ()) -> Candidates:
        """These nodes with ``changed`` in place of the nodes of their names (added where
        there is none) and without the nodes named in ``without``."""
        new = {n.name: n for n in changed}
        gone = {name for name in without if name in self.by_name or name in new}
        if not new and not gone:
            return self
        if self._index is None:
            self._index = {n.name: at for at, n in enumerate(self._nodes)}
        nodes, added = list(self._nodes), False
        for name, node in new.items():
            at = self._index.get(name)
            if at is None:
                nodes.append(node)
                added = True
            else:
                nodes[at] = node
        if gone:
            nodes = [n for n in nodes if n.name not in gone]
        out = Candidates(nodes)
        by_name = out._by_name = dict(self.by_name)
        by_name.update(new)
        for name in gone:
            del by_name[name]
        touched = new.keys() | gone
        out._holders = _by_held(
            [
                *(by_name[n] for n in self.holders if n not in touched),
                *(n for n in new.values() if n.name not in gone and n.held_bytes > 0),
            ]
        )
        out._whole = (self.whole - touched) | {n.name for n in new.values() if n.name not in gone and n.holds_whole}
        before = self.by_name
        if not added and all(_same_room(node, before[name]) for name, node in new.items()):
            out._ranked = self._ranking()  # the same rooms: the same ranking (the gone skipped)
            if not gone:
                out._smallest = self.smallest_cache
        return out


def _by_held(nodes: Iterable[Candidate]) -> list[str]:
    return [n.name for n in sorted(nodes, key=lambda n: (-n.held_bytes, n.name))]


def _same_room(a: Candidate, b: Candidate) -> bool:
    """Whether two candidates rank alike and count alike for caches."""
    return (a.free_bytes, a.spare_bytes, a.cache_bytes) == (b.free_bytes, b.spare_bytes, b.cache_bytes)


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
    fixed: bool = False,
) -> Group:
    """The group's members, in order (fewer when fewer qualify; none for no nodes), and
    which of them own no bundle.

    ``members``: how many (:func:`dsagent.policy.holding.members_wanted`, or a Dataset's
    ``fixed`` count); a group has at least as many members as ``job_nodes`` among ``nodes``
    (each is one). Where fewer than ``members`` can own, more than ``members`` may, each a
    smaller share (:func:`_more_owners`), unless the count is ``fixed``. A node of the
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
    seen = Candidates.of(nodes)
    by_name = seen.by_name
    job = [n for n in dict.fromkeys(job_nodes) if n in by_name]
    group = _choose(seen, job, before, no_share_before, members, size_bytes, ratio, without_share=True, fixed=fixed)
    if group is not None and group.no_share and not all(by_name[m].takes_no_share for m in group.members):
        group = None  # a member's agent is of an earlier release (an upgrade rolling): all own
    if group is None:  # too few other nodes have room to own in their place
        group = _choose(
            seen, job, before, no_share_before, members, size_bytes, ratio, without_share=False, fixed=fixed
        )
    assert group is not None
    return group


def _choose(
    nodes: Candidates,
    job: list[str],
    before: Sequence[str],
    no_share_before: Sequence[str],
    members: int,
    size_bytes: int,
    ratio: float,
    *,
    without_share: bool,
    fixed: bool,
) -> Group | None:
    """:func:`choose_group`'s choice for ``members`` wanted; None when some of the job's nodes
    would join without a share (``without_share``) but too few others can own instead."""
    by_name = nodes.by_name
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
    for name in nodes.holders:
        take(name)
    subnet = by_name[chosen[0]].subnet if chosen else None
    # the nodes with room, in the nodes' one ranking (the most room first), read only as far
    # as owners are missing: at thousands of nodes most of a choice is made by then
    for node in _roomy(nodes, need):
        if full():
            break
        if subnet is None or node.subnet == subnet:
            take(node.name)
    for node in _roomy(nodes, need):
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
        for node in nodes.ranked():
            if full():
                break
            if node.cache_bytes - node.in_use_bytes >= need:
                take(node.name)
    if not shareless and not full() and not fixed:
        # fewer still: more owners, each a smaller share, where that many have the room now,
        # or where the owners found would each be asked for more than a member's cache
        # (refused for good, read from the store every epoch)
        need_bytes = ratio * max(0, size_bytes)
        chosen.extend(_more_owners(nodes, chosen, need_bytes, owners, anyway=_too_big(nodes, chosen, need_bytes)))
    # the earlier members first, in their earlier order: the order is part of the group (a
    # rank's buckets are homed by position, dsplatform.stripe.bucket_of), and an agent takes a
    # reordered list for a new group; shares filling must not reorder it
    ordered = [n for n in before if n in chosen] + [n for n in chosen if n not in before]
    return Group(ordered, [n for n in ordered if n in shareless])


def _too_big(nodes: Candidates, chosen: Sequence[str], need_bytes: float) -> bool:
    """Whether a share of ``need_bytes`` over the ``chosen`` owners is larger than the cache
    of one of them (a cache of unknown size is not counted)."""
    caches = [c for c in (nodes.by_name[n].cache_bytes for n in chosen) if c > 0]
    return bool(chosen) and bool(caches) and need_bytes / len(chosen) > min(caches)


def _more_owners(
    nodes: Candidates, chosen: Sequence[str], need_bytes: float, owners: int, *, anyway: bool
) -> list[str]:
    """The nodes that join the ``chosen`` owners where too few could be found: the fewest
    nodes, the most room beside their pods' data (``cache_bytes - in_use_bytes``) first, such
    that each one added has room for a share of ``need_bytes`` over all the owners. Where no
    number of them has, none; or, ``anyway`` (each owner found would be asked for more than a
    member's whole cache), as many as make ``owners`` (the rule's count, whose shares fit
    half a cache), the most such room first: such a share is refused only while its node's
    pods fill that cache, and the controller hands its bundles on to a node with room
    meanwhile, where a share larger than every cache could never be held
    (docs/design-striping.md#group)."""
    taken = set(chosen)
    spare = sorted(
        ((n.cache_bytes - n.in_use_bytes, n.name) for n in nodes if n.name not in taken), key=lambda x: (-x[0], x[1])
    )
    have = len(chosen)
    for extra in range(max(1, owners - have), len(spare) + 1):
        if spare[extra - 1][0] >= need_bytes / (have + extra):
            return [name for _, name in spare[:extra]]
    return [name for _, name in spare[: max(0, owners - have)]] if anyway else []


def _roomy(nodes: Candidates, need: int) -> Iterator[Candidate]:
    """The nodes with at least ``need`` bytes of room, the most first."""
    for node in nodes.ranked():
        if _room(node) < need:
            return
        yield node


def _room(node: Candidate) -> int:
    """What a node can give a share without evicting a last copy (its free bytes where that
    is not known)."""
    return node.free_bytes if node.spare_bytes is None else node.spare_bytes


def _short(node: Candidate, need: int) -> bool:
    return node.spare_bytes is not None and node.spare_bytes < need


__all__ = ["Candidate", "Candidates", "Group", "choose_group"]
