"""Striped versions: who owns which bundle, which rank reads which sample, and the layout file.

Who calls it: the agent (:mod:`dsagent.cache.striped.stripes`: which bundles this node holds, which
member to ask for the others), the rank-aware reader (:mod:`dsplatform.data`: which samples
a rank reads, in which order), the controller (the group it records) and the extender (the
share a member is expected to hold). Each computes the same answer from the same plain
inputs, so no per-bundle directory exists anywhere (docs/design-striping.md#ownership).

What it owns, all pure (no I/O, no clock):

- **ownership**: weighted rendezvous (HRW) hashing of a bundle digest over a group's members
  (:func:`owners`). A member change moves only the bundles whose top choice changed, about
  1/k of them for a group of k;
- **canonical buckets** (:func:`bucket_of`, :func:`assign`): a version's bundles fall into
  ``buckets`` fixed groups, each homed on the member that owns its bundles; ranks receive
  whole buckets, those on their own node first, then samples are moved only as far as needed
  to give every rank the same count (within one). A bucket's content and its order within
  an epoch depend on the seed and the epoch, never on the world size;
- **the layout file** (:class:`StripeLayout`): what a striped version's CSI volume carries
  beside the node's share, so a reader knows where the rest lives. One JSON header line,
  then one ``[path, size]`` line per file in path order; versioned (``format``
  ``dsplatform-stripe-layout``, ``version`` 1), bounded on read.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO

import xxhash

from dsplatform.errors import VocabularyError
from dsplatform.names import DIGEST_HINT, NAME_HINT, is_digest, is_name

LAYOUT_FORMAT = "dsplatform-stripe-layout"
LAYOUT_VERSION = 1
LAYOUT_FILE = "stripe-layout.jsonl"
MAX_LAYOUT_HEADER = 64 << 20  # bytes of the header line (bundles and members)
MAX_LAYOUT_FILES = 10_000_000
MAX_MEMBERS = 4096
DEFAULT_BUCKETS_PER_MEMBER = 8
_TWO64 = float(1 << 64)


class LayoutError(VocabularyError):
    """A stripe layout or group that breaks the format's rules (a name, a digest, the tiling)."""


# -- ownership (docs/design-striping.md#ownership) ------------------------------------------


def _unit(member: str, key: str) -> float:
    """A uniform number in (0, 1) from ``member`` and ``key``: the HRW draw."""
    h = xxhash.xxh3_64_intdigest(f"{member}\0{key}".encode("utf-8", "surrogateescape"))
    return (h + 0.5) / _TWO64


def hrw_score(member: str, key: str, weight: float = 1.0) -> float:
    """Weighted rendezvous score: ``-weight / ln(u)``. The member with the highest score owns
    ``key``; with equal weights this is the plain highest-hash rule, with unequal weights a
    member wins a share proportional to its weight (a weight of 0 never wins)."""
    if weight <= 0:
        return -math.inf
    return -weight / math.log(_unit(member, key))


def owners(
    key: str, members: Sequence[str], weights: Mapping[str, float] | None = None, *, replicas: int = 1
) -> list[str]:
    """The ``replicas`` members that own ``key``, best first (fewer when the group is smaller).
    Ties (equal scores) are broken by member name, so every caller agrees."""
    candidates = [m for m in members if weights is None or weights.get(m, 1.0) > 0]
    scored = sorted(
        candidates,
        key=lambda m: (-hrw_score(m, key, 1.0 if weights is None else weights.get(m, 1.0)), m),
    )
    return scored[: max(1, replicas)]


def owner(key: str, members: Sequence[str], weights: Mapping[str, float] | None = None) -> str | None:
    """The one owner of ``key`` (None for an empty group or all weights 0)."""
    found = owners(key, members, weights)
    return found[0] if found else None


def owned(
    bundles: Iterable[str], member: str, members: Sequence[str], weights: Mapping[str, float] | None = None
) -> list[str]:
    """The bundles (digests, in the order given) that ``member`` owns in the group ``members``."""
    return [b for b in bundles if owner(b, members, weights) == member]


def group_size(version_bytes: int, cache_bytes: int, *, headroom: float, budget: float = 0.5) -> int:
    """How many members a version needs: ``ceil(headroom * S / (budget * C))``, at least 1,
    so that no member gives one version more than ``budget`` of its cache. ``headroom`` is
    the eviction rule's ratio (the agent's, :data:`dsagent.policy.eviction.EVICT_RATIO` by
    default): the room a member needs for its share."""
    if cache_bytes <= 0 or budget <= 0:
        raise LayoutError("a stripe group needs a positive cache size and budget")
    return max(1, math.ceil(headroom * version_bytes / (budget * cache_bytes)))


# -- the layout file (docs/design-striping.md#layout) ----------------------------------------


@dataclass(frozen=True)
class StripeBundle:
    """One bundle of a striped version: its digest, its range of files in path order, its
    uncompressed bytes and its owner in the group."""

    digest: str
    first: int
    count: int
    size: int
    owner: str


@dataclass(frozen=True)
class Placement:
    """Where a version's bundles live: the group's members, the bucket count and the owner of
    each bundle, in bundle order. Small (a name per bundle), so ranks can exchange it."""

    members: tuple[str, ...]
    buckets: int
    owners: tuple[str, ...]

    def key(self) -> str:
        """A short digest of the placement, for ranks to compare theirs."""
        return xxhash.xxh3_128_hexdigest(json.dumps([self.members, self.buckets, self.owners]).encode())


@dataclass(frozen=True)
class StripeLayout:
    """Where each bundle of a striped version lives: the group, the owner of each bundle, the
    files in path order (``paths``/``sizes``, tiled by the bundles) and the bucket count."""

    name: str
    digest: str
    members: tuple[str, ...]
    bundles: tuple[StripeBundle, ...]
    paths: tuple[str, ...] = field(repr=False)
    sizes: tuple[int, ...] = field(repr=False)
    buckets: int = 0

    def __post_init__(self) -> None:
        if not is_name(self.name):
            raise LayoutError(f"stripe layout names an invalid dataset {self.name!r}: {NAME_HINT}")
        if not is_digest(self.digest):
            raise LayoutError(f"stripe layout has an invalid version digest {self.digest!r}: {DIGEST_HINT}")
        if not self.members or len(self.members) > MAX_MEMBERS or len(set(self.members)) != len(self.members):
            raise LayoutError(f"a stripe group needs 1-{MAX_MEMBERS} distinct members")
        if any(not isinstance(m, str) or not m or "\0" in m for m in self.members):
            raise LayoutError("a stripe group member is a non-empty node name")
        if len(self.paths) != len(self.sizes):
            raise LayoutError("stripe layout: paths and sizes differ in length")
        member_set = set(self.members)
        position = 0
        for bundle in self.bundles:
            if not is_digest(bundle.digest):
                raise LayoutError(f"stripe layout has an invalid bundle digest {bundle.digest!r}")
            if bundle.first != position or bundle.count < 1:
                raise LayoutError("stripe layout: the bundles do not tile the files in order")
            if bundle.owner not in member_set:
                raise LayoutError(f"bundle {bundle.digest} is owned by {bundle.owner!r}, not a group member")
            if sum(self.sizes[bundle.first : bundle.first + bundle.count]) != bundle.size:
                raise LayoutError(f"bundle {bundle.digest}: its size does not match its files")
            position += bundle.count
        if position != len(self.paths):
            raise LayoutError("stripe layout: the bundles do not cover every file")
        if self.buckets < 0:
            raise LayoutError("stripe layout: a negative bucket count")

    @classmethod
    def create(
        cls,
        name: str,
        digest: str,
        members: Sequence[str],
        bundles: Iterable[tuple[str, int, int, int]],
        paths: Sequence[str],
        sizes: Sequence[int],
        *,
        weights: Mapping[str, float] | None = None,
        buckets: int | None = None,
    ) -> StripeLayout:
        """The layout of a version from its bundle index (``digest, first, count, size``),
        owners computed by HRW over ``members``."""
        group = tuple(members)
        striped = tuple(StripeBundle(d, f, c, s, owner(d, group, weights) or "") for d, f, c, s in bundles)
        count = buckets if buckets is not None else DEFAULT_BUCKETS_PER_MEMBER * len(group)
        return cls(name, digest, group, striped, tuple(paths), tuple(sizes), count)

    @property
    def placement(self) -> Placement:
        """What :func:`assign` reads of the layout besides its files: the members, the bucket
        count and each bundle's owner. Two layouts of one version with the same placement
        give every rank the same samples."""
        return Placement(self.members, self.buckets, tuple(b.owner for b in self.bundles))

    def placed(self, placement: Placement) -> StripeLayout:
        """This version's layout with ``placement`` (checked as any layout)."""
        if len(placement.owners) != len(self.bundles):
            raise LayoutError(f"a placement of {len(placement.owners)} bundles for a version of {len(self.bundles)}")
        bundles = tuple(replace(b, owner=o) for b, o in zip(self.bundles, placement.owners))
        return replace(self, members=tuple(placement.members), buckets=placement.buckets, bundles=bundles)

    @property
    def total_bytes(self) -> int:
        return sum(b.size for b in self.bundles)

    def held_by(self, member: str) -> list[StripeBundle]:
        """The bundles ``member`` owns."""
        return [b for b in self.bundles if b.owner == member]

    def files(self, bundle: StripeBundle) -> list[tuple[str, int]]:
        """The ``(path, size)`` of each file of ``bundle``, in path order."""
        end = bundle.first + bundle.count
        return list(zip(self.paths[bundle.first : end], self.sizes[bundle.first : end]))

    def dump(self) -> Iterator[bytes]:
        """The layout file, a line at a time."""
        header = {
            "format": LAYOUT_FORMAT,
            "version": LAYOUT_VERSION,
            "name": self.name,
            "digest": self.digest,
            "members": list(self.members),
            "buckets": self.buckets,
            "files": len(self.paths),
            "bundles": [[b.digest, b.first, b.count, b.size, b.owner] for b in self.bundles],
        }
        yield json.dumps(header, separators=(",", ":")).encode() + b"\n"
        for path, size in zip(self.paths, self.sizes):
            yield json.dumps([path, size], ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    def dumps(self) -> bytes:
        return b"".join(self.dump())

    @classmethod
    def load(cls, stream: IO[bytes], *, max_files: int = MAX_LAYOUT_FILES) -> StripeLayout:
        """Read a layout file; every line bounded, every field checked (:class:`LayoutError`)."""
        line = stream.readline(MAX_LAYOUT_HEADER + 1)
        if len(line) > MAX_LAYOUT_HEADER or not line.endswith(b"\n"):
            raise LayoutError("stripe layout: the header line is missing, cut or too long")
        try:
            header = json.loads(line)
        except ValueError as exc:
            raise LayoutError(f"stripe layout: the header is not JSON: {exc}") from exc
        if not isinstance(header, dict) or header.get("format") != LAYOUT_FORMAT:
            raise LayoutError(f"not a stripe layout (format is not {LAYOUT_FORMAT!r})")
        if header.get("version") != LAYOUT_VERSION:
            raise LayoutError(
                f"stripe layout version {header.get('version')!r} is not supported (this reader knows {LAYOUT_VERSION})"
            )
        try:
            files = int(header["files"])
            if not 0 <= files <= max_files:
                raise LayoutError(f"stripe layout lists {files} files, over the limit of {max_files}")
            bundles = tuple(StripeBundle(str(d), int(f), int(c), int(s), str(o)) for d, f, c, s, o in header["bundles"])
            members = tuple(str(m) for m in header["members"])
            name, digest, buckets = str(header["name"]), str(header["digest"]), int(header["buckets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"stripe layout: malformed header: {exc}") from exc
        paths: list[str] = []
        sizes: list[int] = []
        for _ in range(files):
            raw = stream.readline(65536)
            try:
                path, size = json.loads(raw)
                if not isinstance(path, str) or not isinstance(size, int) or size < 0:
                    raise ValueError("expected [path, size]")
            except ValueError as exc:
                raise LayoutError(f"stripe layout: file line {len(paths) + 1} is malformed: {exc}") from exc
            if not _safe_path(path):
                raise LayoutError(f"stripe layout: unsafe path {path!r}")
            paths.append(path)
            sizes.append(size)
        if stream.read(1):
            raise LayoutError("stripe layout: data after the last file line")
        return cls(name, digest, members, bundles, tuple(paths), tuple(sizes), buckets)

    @classmethod
    def loads(cls, data: bytes) -> StripeLayout:
        import io

        return cls.load(io.BytesIO(data))


def _safe_path(path: str) -> bool:
    """Relative, no empty, ``.`` or ``..`` component, no NUL: what the manifest accepts."""
    if not path or path.startswith("/") or "\0" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


# -- buckets and ranks (docs/design-striping.md#reader) --------------------------------------


def bucket_of(layout: StripeLayout, bundle: StripeBundle) -> int:
    """The canonical bucket of ``bundle``: bucket ``j`` is homed on ``members[j % k]``, and a
    bundle falls, by HRW over its owner's buckets, into one of them. Depends on the layout
    alone, never on the world size."""
    k = len(layout.members)
    count = max(layout.buckets, k)
    home = layout.members.index(bundle.owner)
    homed = [str(j) for j in range(home, count, k)]
    return int(owner(bundle.digest, homed) or homed[0])


@dataclass(frozen=True)
class Assignment:
    """Which samples (file indices in path order) each rank reads, grouped by bundle:
    ``ranks[r]`` is a list of ``(bundle index, [file index, ...])``."""

    ranks: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]

    def samples(self, rank: int) -> int:
        return sum(len(files) for _, files in self.ranks[rank])


def assign(layout: StripeLayout, world_size: int, rank_nodes: Sequence[str | None] | None = None) -> Assignment:
    """Each sample to exactly one of ``world_size`` ranks, each rank's own node's buckets first.

    ``rank_nodes[r]`` is the node rank ``r`` runs on (None or unknown: no preference). Buckets
    homed on a node with ranks go round-robin to those ranks (bucket order), the others to the
    rank with the fewest samples so far. Then counts are evened to within one sample: each
    rank over its quota gives up the tail of its last buckets, which the ranks under theirs
    take in rank order. Deterministic: every rank computes the same answer."""
    if world_size < 1:
        raise LayoutError("world size must be at least 1")
    nodes = list(rank_nodes) if rank_nodes is not None else [None] * world_size
    if len(nodes) != world_size:
        raise LayoutError("rank_nodes must name a node (or None) for every rank")
    by_bucket: dict[int, list[int]] = {}
    for index, bundle in enumerate(layout.bundles):
        by_bucket.setdefault(bucket_of(layout, bundle), []).append(index)
    ranks_on: dict[str, list[int]] = {}
    for r, node in enumerate(nodes):
        if node is not None:
            ranks_on.setdefault(node, []).append(r)
    k = len(layout.members)
    per_rank: list[list[int]] = [[] for _ in range(world_size)]  # bundle indices
    load = [0] * world_size
    turn: dict[str, int] = {}
    homeless: list[int] = []
    for bucket in sorted(by_bucket):
        home = layout.members[bucket % k]
        local = ranks_on.get(home)
        if not local:
            homeless.append(bucket)
            continue
        r = local[turn.get(home, 0) % len(local)]
        turn[home] = turn.get(home, 0) + 1
        per_rank[r].extend(by_bucket[bucket])
        load[r] += sum(layout.bundles[i].count for i in by_bucket[bucket])
    for bucket in homeless:
        r = min(range(world_size), key=lambda x: (load[x], x))
        per_rank[r].extend(by_bucket[bucket])
        load[r] += sum(layout.bundles[i].count for i in by_bucket[bucket])
    total = len(layout.paths)
    quota = [total // world_size + (1 if r < total % world_size else 0) for r in range(world_size)]
    kept: list[list[tuple[int, list[int]]]] = []
    pool: list[tuple[int, list[int]]] = []
    for r in range(world_size):
        room = quota[r]
        mine: list[tuple[int, list[int]]] = []
        for bi in per_rank[r]:
            b = layout.bundles[bi]
            files = list(range(b.first, b.first + b.count))
            take = min(room, len(files))
            if take:
                mine.append((bi, files[:take]))
            if take < len(files):
                pool.append((bi, files[take:]))
            room -= take
        kept.append(mine)
    for r in range(world_size):
        short = quota[r] - sum(len(f) for _, f in kept[r])
        while short > 0 and pool:
            bi, files = pool[0]
            take = min(short, len(files))
            kept[r].append((bi, files[:take]))
            short -= take
            if take == len(files):
                pool.pop(0)
            else:
                pool[0] = (bi, files[take:])
    assert not pool, "quotas sum to the file count"
    return Assignment(tuple(tuple((bi, tuple(files)) for bi, files in mine) for mine in kept))


def epoch_order(
    layout: StripeLayout, assignment: Assignment, rank: int, *, seed: int, epoch: int
) -> list[tuple[int, list[int]]]:
    """Rank ``rank``'s samples for ``epoch``: its bundles in a seeded order and each bundle's
    files in a seeded order. The random streams are keyed by (seed, epoch, bundle digest), so a
    bundle's order is the same whichever rank reads it."""
    parts = list(assignment.ranks[rank])
    rng = random.Random(f"{seed}/{epoch}/{layout.digest}")
    order = sorted(parts, key=lambda part: (layout.bundles[part[0]].digest, part[1][0]))
    rng.shuffle(order)
    shuffled: list[tuple[int, list[int]]] = []
    for bi, files in order:
        inner = list(files)
        random.Random(f"{seed}/{epoch}/{layout.bundles[bi].digest}").shuffle(inner)
        shuffled.append((bi, inner))
    return shuffled


__all__ = [
    "Assignment",
    "LAYOUT_FILE",
    "LAYOUT_FORMAT",
    "LAYOUT_VERSION",
    "LayoutError",
    "Placement",
    "StripeBundle",
    "StripeLayout",
    "assign",
    "bucket_of",
    "epoch_order",
    "group_size",
    "hrw_score",
    "owned",
    "owner",
    "owners",
]
