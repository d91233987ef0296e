"""Space: reservations, free-space accounting, and applying the eviction policy (docs/design.md#eviction).

Who calls it: :mod:`dsagent.cache.versions` reserves before every fetch and takes the lock
around making a copy ready; :mod:`dsagent.cache.service` runs operator evictions, the sweep's
idle evictions, superseded-version collection and the space report through it. The
choice of victims is :mod:`dsagent.policy.eviction` (pure); this module gathers its inputs and
applies its answer.

The rules that keep a version safe from eviction:

- a version bound to a task with a live lease (the catalog), claimed by a task not yet
  bound (:mod:`dsagent.cache.claims`), being fetched, or pinned as the origin a fetch links
  bundles from, is never chosen;
- every deletion happens under :attr:`Space.lock`, and right before it the version's
  protection is checked again (claims, fetches and pins in memory; task bindings in the
  same catalog transaction as the delete), because the plan was made on an earlier view;
- space is counted once: a version committed ready whose reservation is not yet released
  counts as reserved, not also as held;
- this node's shares of striped versions (:mod:`dsagent.cache.striped.stripes`, set as
  :attr:`Space.shares`) count against the capacity like versions, and a fetch that needs
  room ranks each as a whole copy of its version here would, by the copies other nodes
  hold (docs/design-striping.md#eviction): with the replicated copies where the cluster
  holds the version elsewhere, else with the last copies, the least recently used first;
  a share being filled or read (by a reader through the agent, or by pods on this node
  that name its Dataset) is not chosen;
- space is disk use, on the capacity side as on the disk side: a version counts its bytes
  plus its files' blocks and inodes (:meth:`Store.allocated`), so ``DSAGENT_CAPACITY``,
  ``usedBytes`` and what an eviction frees are all in those units.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from dsagent.cache.catalog import VersionRow
from dsagent.cache.layout import Key, validate_name
from dsagent.cache.node import Node
from dsagent.errors import Conflict, InsufficientSpace, InvalidInput, NotFound
from dsagent.policy import eviction
from dsplatform.units import format_size

log = logging.getLogger("dsagent")


#: How :meth:`Space.make_room` makes room: by evicting, only from free room, or not at all,
#: saying only whether evicting could make it
RoomHow = Literal["evict", "free", "possible"]


class Shares(Protocol):
    """What the space reads of this node's stripe shares (:class:`dsagent.cache.striped.stripes.StripeShares`)."""

    # key, bytes, last used, busy, kept (a whole copy with no lease)
    def usage(self) -> Sequence[tuple[Key, int, float, bool, bool]]: ...

    def total_bytes(self) -> int: ...

    def pending_bytes(self, exclude: Key | None = None) -> int: ...

    async def drop(self, key: Key, *, reason: str) -> bool: ...


@dataclass(frozen=True)
class EvictionResult:
    evicted: tuple[eviction.Candidate, ...]
    dry_run: bool
    freed_bytes: int


class Space:
    """The cache's space: one lock orders every reservation and deletion."""

    def __init__(self, node: Node) -> None:
        self.settings, self.pools, self.store, self.clock = node.settings, node.pools, node.store, node.clock
        self._catalog = node.catalog
        self.metrics, self.claims, self.flights, self.progress = node.metrics, node.claims, node.flights, node.progress
        self.lock = asyncio.Lock()
        self.reservations: dict[Key, int] = {}
        self._pins: Counter[Key] = Counter()  # versions a fetch hard-links bundles from
        self._overheads: dict[Key, int] = {}  # reserved disk beyond the bytes (blocks, inodes)
        self.copies = node.copies  # other nodes' ready copies (docs/design.md#cluster-eviction)
        self.shares: Shares | None = None  # this node's stripe shares, set by the service

    # -- reservations -----------------------------------------------------------------

    async def reserve(self, key: Key, size: int, *, overhead: int = 0, staged: int = 0) -> None:
        """Reserve ``size`` bytes for ``key``, evicting LRU unused datasets to reach ratio x size.

        ``overhead``: what the files take on disk beyond their bytes (blocks, inodes; see
        :meth:`Store.allocated`), counted against the disk's free space
        and against the capacity, which counts disk use too, not logical bytes.
        ``staged``: disk the version's own staging already takes (a resumed fetch); it is
        part of the version, so it counts once (it counted as held
        *and* was reserved again)."""
        async with self.lock:
            await self._evict_for(key, size, overhead=overhead, staged=staged)
            self.reservations[key] = size
            self._overheads[key] = overhead

    async def make_room(self, key: Key, size: int, *, how: RoomHow = "evict") -> None:
        """Evict LRU unused data until ``size`` more bytes fit at the ratio, for this
        node's share ``key`` of a striped version about to be filled (never that share
        itself). The room stays taken while the share fills: what it still misses counts
        as reserved (:attr:`shares`' ``pending_bytes``), what it holds as used
        (``total_bytes``). ``how``: ``"free"``, only where the room is free already, the
        eviction's headroom included (a bundle asked of the peers, who may not have it, is no
        reason to evict, nor to fill the disk past the ratio every other fill keeps);
        ``"possible"``, evict nothing, only say whether evicting could make the room (a
        share that takes its room as its bundles arrive). Else :class:`InsufficientSpace`."""
        async with self.lock:
            if how == "evict":
                await self._evict_for(key, size, keep=key)
                return
            if how == "free":
                free = await self.free_bytes(exclude=key)
                plan = eviction.plan_for_fetch((), size=size, free=free, ratio=self.settings.evict_ratio)
                if not plan.sufficient:
                    raise InsufficientSpace(
                        f"{plan.needed_bytes} bytes ({self.settings.evict_ratio}x {size}) for {key[0]}'s share"
                        f" are not free ({free} are)"
                    )
                return
            await self._plan(key, size, spared={key})  # raises where evicting could not make it

    async def _evict_for(
        self, key: Key, size: int, *, overhead: int = 0, staged: int = 0, keep: Key | None = None
    ) -> None:
        """Under :attr:`lock`: evict by :func:`eviction.plan_for_fetch` until ``size`` fits
        (:class:`InsufficientSpace` when it cannot); ``keep`` is never chosen."""
        spared: set[Key] = {keep} if keep is not None else set()  # never chosen (again)
        while True:
            plan = await self._plan(key, size, spared=spared, staged=staged, overhead=overhead)
            for victim in plan.victims:
                if not await self.evict_one(victim, reason="space"):
                    spared.add((victim.name, victim.digest))
            if not spared.intersection((v.name, v.digest) for v in plan.victims):
                return
            # plan again on the new view; it ends, since each round spares one more version

    async def _plan(
        self, key: Key, size: int, *, spared: set[Key], staged: int = 0, overhead: int = 0
    ) -> eviction.Plan:
        """Under :attr:`lock`: the eviction plan that makes ``size`` fit for ``key`` on the
        node as it is now, ``spared`` never chosen; :class:`InsufficientSpace` when none can."""
        candidates = [
            dataclasses.replace(c, in_use=True) if (c.name, c.digest) in spared else c for c in await self.candidates()
        ]
        free = await self.free_bytes(exclude=key, staged=staged, overhead=overhead)
        plan = eviction.plan_for_fetch(candidates, size=size, free=free, ratio=self.settings.evict_ratio)
        if not plan.sufficient:
            raise _insufficient(key[0], size, plan, overhead=overhead)
        return plan

    def release(self, key: Key) -> None:
        self.reservations.pop(key, None)
        self._overheads.pop(key, None)

    def move(self, old: Key, new: Key, size: int) -> None:
        """A copy reserved under a pending key now has its version's key."""
        self.reservations[new] = self.reservations.pop(old, size)
        self._overheads[new] = self._overheads.pop(old, 0)

    def pin(self, keys: Iterable[Key]) -> None:
        self._pins.update(keys)

    def unpin(self, keys: Iterable[Key]) -> None:
        self._pins.subtract(keys)
        self._pins = +self._pins

    async def free_bytes(self, *, exclude: Key | None = None, staged: int = 0, overhead: int = 0) -> int:
        """Free bytes for new data: disk free and capacity left, minus pending reservations.

        Both sides count what files take on disk, blocks and inodes included (a
        reservation's ``overhead``, a held version's :meth:`Store.allocated`): a capacity
        of 100 GB holds 100 GB of disk, however small the files. ``exclude``: a version
        about to be reserved, whose own row must not count as held; ``staged``: the disk
        its staging takes already (free again for it on the disk side: it is part of it;
        the capacity side never counts it, its row being excluded); ``overhead``: its own
        disk overhead, taken from both sides."""
        disk = await self.pools.work(self.store.disk_usage)
        pending = sum(
            max(0, size + self._overheads.get(key, 0) - self.progress.bytes_done(key))
            for key, size in self.reservations.items()
            if key != exclude
        )
        # a share being filled has its missing bundles' room taken, as a reservation: on
        # the disk side its bundles in flight count twice (partly written, and still
        # missing) for as long as they download, the safe side of a full disk
        pending += self.shares.pending_bytes(exclude) if self.shares is not None else 0
        free = (
            disk.free - pending + staged - overhead - self.settings.disk_floor(disk.total)
        )  # never into the kubelet's eviction zone
        if self.settings.capacity_bytes is not None:
            rows = await self.pools.db(self._catalog().versions)
            reserved = sum(
                size + self._overheads.get(key, 0) for key, size in self.reservations.items() if key != exclude
            )
            # every version counts, once and by its disk use (bytes, blocks, inodes): as
            # reserved while a fetch holds its reservation (also just after its ready
            # commit), else as held - a failed or interrupted one too, since its staging
            # stays on disk for a resume and evicting it is credited with that size
            held = sum(
                self.store.allocated(r.size_bytes, r.files)
                for r in rows
                if (r.name, r.digest) not in self.reservations and (r.name, r.digest) != exclude
            )
            shares = self.shares.total_bytes() + self.shares.pending_bytes(exclude) if self.shares is not None else 0
            free = min(free, self.settings.capacity_bytes - held - shares - reserved - overhead)
        return free

    async def report(self) -> dict[str, int]:
        rows = await self.pools.db(self._catalog().versions)
        disk = await self.pools.work(self.store.disk_usage)
        used = sum(self.store.allocated(r.size_bytes, r.files) for r in rows if r.state == "ready")
        used += self.shares.total_bytes() if self.shares is not None else 0
        capacity = (
            self.settings.capacity_bytes
            if self.settings.capacity_bytes is not None
            else disk.total - self.settings.disk_floor(disk.total)
        )
        return {"capacityBytes": capacity, "freeBytes": max(0, await self.free_bytes()), "usedBytes": used}

    # -- eviction ---------------------------------------------------------------------

    async def candidates(self) -> list[eviction.Candidate]:
        rows = await self.pools.db(self._catalog().versions)
        in_use = await self.pools.db(self._catalog().in_use, self.clock()) | self.claims.held()
        fetching = self.flights.fetching() | set(self._pins)
        now = self.clock()
        # a share ranks by the copies the cluster holds of its version as a whole copy here
        # would, the count less one: one holding every bundle is such a copy (the controller
        # counts it), and any other goes with the replicated copies only where at least two
        # other nodes hold the version whole (docs/design-striping.md#eviction)
        shares = [
            eviction.Candidate(
                name,
                digest,
                size,
                last_used,
                fetching=busy,
                striped=True,
                kept=kept,
                copies=self.copies.others(name, digest, ready_here=True, now=now),
            )
            for (name, digest), size, last_used, busy, kept in (self.shares.usage() if self.shares is not None else ())
        ]
        return shares + [
            eviction.Candidate(
                r.name,
                r.digest,
                self.store.allocated(r.size_bytes, r.files),  # what deleting it frees
                r.last_used or r.created_at,
                in_use=(r.name, r.digest) in in_use,
                fetching=(r.name, r.digest) in fetching or r.state == "fetching",
                copies=self.copies.others(r.name, r.digest, ready_here=r.state == "ready", now=now),
            )
            for r in rows
            if r.state in ("ready", "failed")
        ]

    def busy(self, key: Key) -> bool:
        """Being fetched, or the origin a fetch links bundles from: not even force evicts it."""
        return self._pins[key] > 0 or self.flights.is_fetching(key)

    def protected(self, key: Key) -> bool:
        """Busy, or claimed by a task not yet bound to it."""
        return self.busy(key) or key in self.claims

    async def evict_one(self, victim: eviction.Candidate, *, reason: str, force: bool = False) -> bool:
        """Delete one version chosen by a plan, unless it became protected since (then
        False). Under :attr:`lock` only, so no two deletions of one version overlap and
        no fetch publishes a version while it is being removed."""
        key = (victim.name, victim.digest)
        if victim.striped:  # a share: only its own bundles go (readers fetch them again)
            if self.shares is None or not await self.shares.drop(key, reason=reason):
                return False
            log.info("evicted the share of %s@%s (%s, %s)", *key, format_size(victim.size_bytes), reason)
            self.metrics.evicted(reason, victim.size_bytes)
            return True
        if self.busy(key) or (not force and self.protected(key)):
            return False  # force overrides a task's use, never a fetch's
        unless = None if force else self.clock()
        removed = False
        try:
            deleted = await self.pools.db(self._catalog().delete_version, *key, unless_in_use_at=unless)
        except InsufficientSpace:
            # a full disk: even the catalog cannot write. Free the version's files first
            # (reads still work: check it is not in use), then record the deletion
            if not force and key in await self.pools.db(self._catalog().in_use, self.clock()):
                return False
            await self.pools.work(self.store.remove, *key)
            removed = True
            deleted = await self.pools.db(self._catalog().delete_version, *key, unless_in_use_at=None)
        if not deleted and not force:
            return False  # a task was bound to it after the plan was made
        log.info("evicting %s@%s (%s, %s)", victim.name, victim.digest[:12], format_size(victim.size_bytes), reason)
        if not removed:
            await self.pools.work(self.store.remove, *key)
        self.metrics.evicted(reason, victim.size_bytes)
        return True

    async def collect_superseded(self, name: str | None = None) -> None:
        """Delete old versions no task holds: a name keeps, per source, its current version
        (the one its latest consistency check of that source resolved to) and the versions
        tasks still use. Per source, because two namespaces may each have a Dataset of one
        name with its own source: one's new version must never supersede the other's
        (docs/operator-guide/tenancy.md)."""
        async with self.lock:
            rows = await self.pools.db(self._catalog().versions, name)
            current: dict[tuple[str, str], VersionRow] = {}
            for row in rows:  # by resolved_at: the last ready one wins
                if row.state == "ready":
                    current[(row.name, row.source)] = row
            sources = {(r.name, r.digest): r.source for r in rows}
            for c in await self.candidates():
                key = (c.name, sources.get((c.name, c.digest), ""))
                if (
                    not c.striped
                    and (name is None or c.name == name)
                    and c.evictable
                    and key in current
                    and current[key].digest != c.digest
                ):
                    await self.evict_one(c, reason="superseded")

    async def evict(
        self,
        *,
        names: Sequence[str] = (),
        mode: str = "names",
        force: bool = False,
        dry_run: bool = False,
        free_bytes: int = 0,
        tenant: str | None = None,
    ) -> EvictionResult:
        """Operator eviction: named datasets, ``idle`` ones, ``unused`` ones, or enough for ``space``.

        ``tenant`` (named datasets only, docs/operator-guide/tenancy.md): the eviction acts for that
        namespace alone. A version goes only when ``tenant`` is the one namespace that asked
        for its source; where other namespaces asked for it too, ``tenant``'s claim is dropped
        and the bytes stay; a version ``tenant`` never asked for is not touched."""
        async with self.lock:
            candidates = await self.candidates()
            shared: list[eviction.Candidate] = []
            if tenant is not None:
                if mode != "names":
                    raise InvalidInput("an eviction for a namespace names its datasets", hint="use mode 'names'")
                candidates, shared = await self._tenant_candidates(candidates, names, tenant)
            scope = None if tenant is None else {(c.name, c.digest) for c in candidates + shared}
            victims = await self._choose(
                candidates, names=names, mode=mode, force=force, free_bytes=free_bytes, scope=scope
            )
            if not dry_run:
                reason = "operator" if mode == "names" else mode
                victims = [
                    v for v in victims if await self.evict_one(v, reason=reason, force=force and mode == "names")
                ]
                for version in shared:  # only this namespace's claim on shared bytes goes
                    if not version.in_use or force:
                        await self._forget_tenant(version, tenant)
        return EvictionResult(tuple(victims), dry_run, sum(v.size_bytes for v in victims))

    async def _tenant_candidates(
        self, candidates: list[eviction.Candidate], names: Sequence[str], tenant: str
    ) -> tuple[list[eviction.Candidate], list[eviction.Candidate]]:
        """The versions of ``names`` that ``tenant`` alone asked for (its to evict), and those it
        asked for beside other namespaces (shared: its claim goes, the bytes stay)."""
        catalog = self._catalog()
        sources = {(r.name, r.digest): r.source for r in await self.pools.db(catalog.versions)}
        alone: list[eviction.Candidate] = []
        shared: list[eviction.Candidate] = []
        for candidate in candidates:
            source = sources.get((candidate.name, candidate.digest))
            if candidate.name not in names or source is None:
                continue
            asked = await self.pools.db(catalog.tenants_of, candidate.name, source)
            if asked == {tenant}:
                alone.append(candidate)
            elif tenant in asked:
                shared.append(candidate)
        return alone, shared

    async def _forget_tenant(self, version: eviction.Candidate, tenant: str | None) -> None:
        catalog = self._catalog()
        row = await self.pools.db(catalog.version, version.name, version.digest)
        if row is not None and tenant is not None:
            await self.pools.db(catalog.forget_tenant, version.name, row.source, tenant)

    async def _choose(
        self,
        candidates: list[eviction.Candidate],
        *,
        names: Sequence[str],
        mode: str,
        force: bool,
        free_bytes: int,
        scope: set[Key] | None = None,
    ) -> list[eviction.Candidate]:
        if mode == "idle":
            return list(eviction.idle_victims(candidates, now=self.clock(), idle_ttl=self.settings.idle_ttl))
        if mode == "unused":
            return list(eviction.unused_victims(candidates))
        if mode == "space":
            plan = eviction.plan_for_fetch(candidates, size=free_bytes, free=await self.free_bytes(), ratio=1.0)
            return list(plan.victims)
        if mode != "names":
            raise InvalidInput(f"unknown eviction mode {mode!r}", hint="use names, idle, unused or space")
        return await self._named_victims(candidates, names, force, scope=scope)

    async def _named_victims(
        self, candidates: list[eviction.Candidate], names: Sequence[str], force: bool, *, scope: set[Key] | None = None
    ) -> list[eviction.Candidate]:
        """``scope``: the versions one namespace asked for (an eviction for it); the others
        (their fetches included) are none of its business: they neither conflict nor count as found."""
        victims: list[eviction.Candidate] = []
        rows = await self.pools.db(self._catalog().versions)
        if scope is not None:
            rows = [r for r in rows if (r.name, r.digest) in scope]
        for name in names:
            validate_name(name)
            mine = [c for c in candidates if c.name == name and not c.striped]  # shares: dsctl stripe release
            if not mine and not any(r.name == name for r in rows):
                raise NotFound(f"no dataset {name!r} in the cache")
            if any(r.name == name and r.state == "fetching" for r in rows) or any(c.fetching for c in mine):
                raise Conflict(f"dataset {name!r} is being fetched", hint="wait for the fetch to finish, then evict")
            if any(c.in_use for c in mine) and not force:
                raise await self._held(name)
            victims += mine
        return victims

    async def _held(self, name: str) -> Conflict:
        """The refusal to evict ``name`` while tasks hold it: which tasks, and how to release them."""
        holders = await self.pools.db(self._catalog().holders, name, self.clock())
        if not holders:
            return Conflict(f"dataset {name!r} is in use by a task", hint="release the task first, or pass --force")
        shown = ", ".join(holders[:3]) + (f" and {len(holders) - 3} more" if len(holders) > 3 else "")
        return Conflict(
            f"dataset {name!r} is in use by task {shown}",
            hint=f"release it: dsctl release {holders[0]} (or evict anyway: --force)",
        )


def _insufficient(name: str, size: int, plan: eviction.Plan, *, overhead: int = 0) -> InsufficientSpace:
    """The refusal, every figure in one unit: space on the cache disk. The plan compares the
    eviction rule's target (``ratio`` x the bytes) with free space less the version's own
    disk overhead (blocks, inodes); said that way, a small dataset of many files read
    "free -114 MB". Here the overhead is added back to both sides, the comparison unchanged,
    and free space never goes below zero."""
    needed = plan.needed_bytes + overhead
    free = max(0, plan.free_bytes + overhead)
    return InsufficientSpace(
        f"not enough space to cache {name} ({format_size(size)}): "
        f"needs {format_size(needed)} of cache disk, {format_size(free)} is free"
        f" and {format_size(plan.evictable_bytes)} could be evicted",
        hint="release tasks that no longer need their datasets, or give the cache more space",
        needed=needed,
        free=free,
        evictable=plan.evictable_bytes,
    )


__all__ = ["EvictionResult", "Space"]
