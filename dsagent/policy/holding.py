"""How a version is held on a node, and how many nodes hold a version that no node can: the
one decision the agent, the Dataset controller and the cluster simulator all call
(docs/design-striping.md#holding). Pure: no clock, no disk, no cluster.

The rule:

- **A version that fits a node is copied whole onto each node that trains on it**
  (:data:`WHOLE`): its ``ratio`` times its size fits the node's cache, and the node can make
  that room. Its pods start at once and read through the node's window until the local
  copy is whole; the copy is filled from the group's members and the peers holding the
  version before the store, so every epoch after the first reads local disk.
- **Only a version larger than a node's cache is held as shares** (:data:`SHARE`), or one
  the node cannot make room for: its bundles are spread over a group, and the group is the
  job's own nodes wherever they can hold it (:func:`members_wanted`), so that each rank reads
  its own node's share from local disk. More members join only in three cases. Where the
  job's nodes are too few to hold the version with the rule's headroom and per-member
  budget (a one-node job's version larger than its node, always): then the group has at
  least :data:`WINDOW_MEMBERS` members, the roomiest nodes joining the job's, so that what
  the job's nodes read through the window (all but their own shares) is served by that
  many uploads, each a fraction of what one node's disk and network serve, instead of by
  the few members the budget alone would ask for. Where a job's node will read a version
  through the window that other nodes hold whole: those nodes join (they own their part
  without moving a byte), so its reads are spread over every copy the cluster holds
  instead of one node's upload. And where a version that fits a node is read through the
  window because a job's node has no room for it: it has at least :data:`WINDOW_MEMBERS`
  members too, and so has a larger version where a job's node joins without a share (it
  has no room for one): that node, too, reads every byte through the window. An earlier
  member that still holds its share stays when the next job reads the version on other
  nodes: its bytes are not fetched from the store again, and the cache's eviction, not the
  group, decides when they go. A member holding the version whole keeps it whole while it
  stays a member, whether or not its pods still read it; one the group lets go keeps its
  copy (the controller releases it with ``keep=whole``) until the cache evicts it.
- **A job's node that started on a share is made whole later only once it has paid for
  it** (:func:`worth_whole`): when room appears, the node would fetch every bundle it lacks
  while its pods go on reading; it does so once its readers have taken at least that many
  bytes through the window. Renting until the rent reaches the price, then buying, never
  moves more than twice the bytes the better choice in hindsight would (the ski-rental
  rule), without knowing how long the job will read: a short job near its end is not sent
  a whole copy it will not read, a long one is.

Who calls it: :meth:`dsagent.cache.striped.stripes.StripeShares.hold` (a node asked to hold a
version whole checks that it can, else it holds its share), :func:`choose_placement` from
:mod:`dsagent.controller.striping` (which members, and which of them hold the version whole),
and ``tools/sim/reads.py`` / ``tools/sim/stripereads.py`` (the simulator's ``ours+stripe``
policies call :func:`holding` and :func:`members_wanted`, never a rule of their own;
``tests/tools/test_sim_product_decision.py`` holds them to it).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from dsagent.policy.eviction import EVICT_RATIO
from dsagent.policy.stripegroup import Candidate, Candidates, choose_group
from dsplatform.stripe import group_size

#: the most of its cache a member gives one version's share (:func:`dsplatform.stripe.group_size`):
#: the striping proposal's default, half a node's disk for one version, not chosen in the cluster
#: simulator. Every owner holds an equal share (ownership is not weighted by room), so a one-node
#: job reads about 1/k of a larger version from its own disk (docs/simulator.md, known limits)
SHARE_BUDGET = 0.5

#: the fewest members of a version a job's node reads through the window where the group
#: reaches past the job's nodes anyway: one that fits a node but that a job's node has no
#: room for (it holds a share, or none), or a larger one the job's nodes are too few to
#: hold (:func:`choose_placement`): each member serves its part of every
#: epoch from its own disk and upload, a few
#: GB/s over TCP (tools/sim/rates.py, ``node_serve_bytes_per_s``: 3 GB/s). A node of 8 GPUs
#: reading 300 MB/s each (2.4 GB/s) then takes about 150 MB/s from each of 16 members, and
#: one member serves some 20 such readers at once; with the job's 2 nodes alone, each read
#: the other's whole upload. Chosen in the cluster simulator on its tuning seeds
#: (docs/simulator.md#window-members)
WINDOW_MEMBERS = 16


class Holding(str, enum.Enum):
    """How a node holds a version."""

    WHOLE = "whole"  # every bundle on its disk: a whole local copy
    SHARE = "share"  # the bundles it owns in the group; the others read through its window


WHOLE = Holding.WHOLE
SHARE = Holding.SHARE


def holding(size_bytes: int, *, cache_bytes: int, room_bytes: int | None = None, ratio: float = EVICT_RATIO) -> Holding:
    """:data:`WHOLE` where ``ratio x size_bytes`` fits a cache of ``cache_bytes`` and the
    node can make that room (``room_bytes``: what it can free without evicting the last copy
    of another version, and its free bytes; None: not known, taken as enough); else
    :data:`SHARE`. A cache of unknown size (0) is not taken as fitting."""
    need = ratio * max(0, size_bytes)
    if cache_bytes <= 0 or need > cache_bytes:
        return SHARE
    if room_bytes is not None and room_bytes < need:
        return SHARE
    return WHOLE


def worth_whole(window_bytes: int, lacking_bytes: int) -> bool:
    """Whether a job's node reading a version through its group's window (a share, or none)
    should now fetch it whole, room allowing: once the bytes its readers took through the
    window reach the bytes it lacks (the ski-rental rule, module docstring)."""
    return max(0, window_bytes) >= max(0, lacking_bytes)


def members_wanted(
    size_bytes: int,
    cache_bytes: int,
    job_nodes: int,
    *,
    ratio: float = EVICT_RATIO,
    copies: int = 0,
    kept: int = 0,
    through: bool = False,
) -> int:
    """How many members a version held as shares has: the job's nodes, or, where they are too
    few to hold it with the headroom and :data:`SHARE_BUDGET`, as many as that needs
    (:func:`dsplatform.stripe.group_size` over ``cache_bytes``, the smallest member cache);
    plus ``copies``, the nodes outside the job holding the version whole where a job's node
    will read it through the window, and ``kept``, the earlier members outside the job that
    still hold their share of it (:func:`choose_placement` counts both); at least
    :data:`WINDOW_MEMBERS` where a job's node reads it ``through`` the window and the group
    reaches past the job's nodes anyway (:func:`choose_placement` says when). A member that holds
    its share stays: dropping it would have the next reader fetch those bytes from the store
    again, while keeping it costs only the disk the cache's eviction takes back when it
    needs the room (a member whose share was evicted holds nothing and leaves; one holding
    the version whole keeps its copy when let go, and is not counted)."""
    need = budget_members(size_bytes, cache_bytes, ratio=ratio)
    return max(need, job_nodes + max(0, copies) + max(0, kept), WINDOW_MEMBERS if through else 1)


def budget_members(size_bytes: int, cache_bytes: int, *, ratio: float = EVICT_RATIO) -> int:
    """The members a version needs so that none gives it more than :data:`SHARE_BUDGET` of
    a ``cache_bytes`` cache with the headroom (:func:`dsplatform.stripe.group_size`); 1
    where the cache size is not known (0)."""
    return group_size(size_bytes, cache_bytes, headroom=ratio, budget=SHARE_BUDGET) if cache_bytes > 0 else 1


class Placement(NamedTuple):
    """The group's members in order, those that own no bundle, and those that hold every
    bundle (a whole local copy: the job's nodes the version fits)."""

    members: list[str]
    no_share: list[str]
    whole: list[str]


def choose_placement(
    nodes: Sequence[Candidate],
    *,
    size_bytes: int,
    job_nodes: Sequence[str] = (),
    before: Sequence[str] = (),
    no_share_before: Sequence[str] = (),
    share_before: Sequence[str] = (),
    members: int | None = None,
    ratio: float = EVICT_RATIO,
) -> Placement:
    """Where a version lives: the group (``members``: a Dataset's fixed count, or None for
    :func:`members_wanted` over the smallest cache among the job's nodes, else among ``nodes``) chosen by
    :func:`dsagent.policy.stripegroup.choose_group`, the job's nodes first, and which of the
    job's nodes hold it whole (:func:`holding` on each one's cache and room). A job's node
    that took part on a share before (``share_before``: it answered, not holding the
    version whole) holds it whole only once :func:`worth_whole` says so. A member outside
    the job that holds the version whole keeps it whole: a group that changes does not make
    it drop bundles a later job would read again (the cache's eviction decides when they go)."""
    if not nodes:
        return Placement([], [], [])
    nodes = Candidates.of(nodes)  # what every choice over them reads, worked out once
    by_name = nodes.by_name
    job = [n for n in dict.fromkeys(job_nodes) if n in by_name]
    was_share = set(share_before)

    def whole_here(name: str) -> bool:  # a job's node that holds it whole, else it reads through the window
        node = by_name[name]
        fits = holding(size_bytes, cache_bytes=node.cache_bytes, room_bytes=_room(node), ratio=ratio) is WHOLE
        return fits and (name not in was_share or _paid(node, size_bytes))

    whole_job = {n for n in job if whole_here(n)}
    spread_shareless = members is None  # the count is the rule's, not the Dataset's
    if members is None:
        # the smallest cache among the members to be: the job's nodes where there are any
        # (one small node elsewhere in the cluster does not add owners to every group)
        caches = [by_name[n].cache_bytes for n in job if by_name[n].cache_bytes > 0]
        smallest = min(caches) if caches else nodes.smallest_cache
        through = len(whole_job) < len(job)
        # a job's node reads through the window and the group reaches past the job's nodes
        # anyway: a version that fits a node (the job's node has no room for it), or a larger
        # one the job's nodes are too few to hold. Its window reads are then spread over
        # WINDOW_MEMBERS uploads; a larger version the job's nodes can hold is their shares.
        spread = (
            through and smallest is not None and smallest > 0
            and (
                holding(size_bytes, cache_bytes=smallest, ratio=ratio) is WHOLE
                or budget_members(size_bytes, smallest, ratio=ratio) > len(job)
            )
        )  # fmt: skip
        copies = nodes.whole.difference(job) if through else set()
        kept = _kept(by_name, before, no_share_before, skip={*job, *copies})
        members = (
            members_wanted(size_bytes, smallest, len(job), ratio=ratio, copies=len(copies), kept=kept, through=spread)
            if smallest is not None
            else len(nodes)
        )
    group = choose_group(
        nodes, size_bytes=size_bytes, job_nodes=job, before=before, no_share_before=no_share_before,
        members=members, ratio=ratio, fixed=not spread_shareless,
    )  # fmt: skip
    if spread_shareless and members < WINDOW_MEMBERS and not set(group.no_share).isdisjoint(job):
        # a job's node that joins without a share reads every byte through the window,
        # whatever the version's size: its reads are spread over WINDOW_MEMBERS uploads too
        group = choose_group(
            nodes, size_bytes=size_bytes, job_nodes=job, before=before, no_share_before=no_share_before,
            members=WINDOW_MEMBERS, ratio=ratio,
        )  # fmt: skip
    whole = [
        name
        for name in group.members
        if name not in group.no_share and (name in whole_job if name in job else by_name[name].holds_whole)
    ]
    return Placement(group.members, group.no_share, whole)


def _kept(
    by_name: dict[str, Candidate], before: Sequence[str], no_share_before: Sequence[str], *, skip: set[str]
) -> int:
    """The earlier members, other than ``skip``, that own a share and still hold bytes of it
    (:func:`members_wanted`'s ``kept``). One holding the version whole is not counted: let
    go, it keeps its copy anyway (released with ``keep=whole``)."""
    shareless = set(no_share_before)
    return sum(
        1 for name in dict.fromkeys(before)
        if name not in skip and name not in shareless and name in by_name
        and by_name[name].held_bytes > 0 and not by_name[name].holds_whole
    )  # fmt: skip


def _paid(node: Candidate, size_bytes: int) -> bool:
    """A member reading through the window has taken as many bytes through it as it lacks;
    one whose agent does not count them (an earlier release) is taken as having paid: it is
    made whole once it has room, as before the count existed."""
    return node.window_bytes is None or worth_whole(node.window_bytes, size_bytes - node.held_bytes)


def _room(node: Candidate) -> int | None:
    """What a node can free for a version without evicting another's last copy, plus the
    bytes of the version it holds already (None: not known)."""
    return None if node.spare_bytes is None else node.spare_bytes + node.held_bytes


__all__ = [
    "Holding", "Placement", "SHARE", "SHARE_BUDGET", "WHOLE", "WINDOW_MEMBERS", "choose_placement", "holding",
    "members_wanted", "worth_whole",
]  # fmt: skip
