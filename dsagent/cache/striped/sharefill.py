"""Filling this node's stripe shares: which bundles a share holds, in which order they are
fetched, and who waits for whom (docs/design-striping.md#agent, #holding).

Who calls it: :class:`dsagent.cache.striped.stripes.StripeShares`, which mixes in
:class:`ShareFill` and owns the shares' records (:class:`Share`). What it owns:

- a whole copy's bundles (:meth:`ShareFill._whole`): every bundle, this node's own first,
  where :func:`dsagent.policy.holding.holding` says the version fits and the cache made the
  room, else the node's share;
- the fill (:meth:`ShareFill._fill`): ``fetch_workers`` bundles at once in order, each one
  fetched once whoever asks first (:meth:`ShareFill._bring`: the fill, a reader of this
  node, or a peer through :meth:`ShareFill.pending`);
- a share held ``storeOnDemand`` (:attr:`Share.on_demand`): its fill asks the peers only,
  again every ``stripe_on_demand_retry`` seconds until it is complete; the store is read
  only for a bundle a reader waits for (this node's reader, a peer's asking with the
  marker of :mod:`dsplatform.wire.peerbundle`, or the first ``readyAfter`` bundles its pods
  wait for), so that a version is read from the store as far as it is read; and it takes
  the cache's room as its bundles arrive (:meth:`Share.reserved_bytes`), evicting only for a
  bundle that may read the store, so that it holds the room as far as it is read;
- where a bundle comes from (:meth:`ShareFill._fetch_owned`): an owned bundle from the
  members ranked next by HRW, the copies, the store, claimed meanwhile; a whole copy's
  bundle owned elsewhere from its owner first, never claimed (an owner and a whole copy
  would wait on each other);
- a verified bundle's done marker (:func:`write_marker`), written and synced after its files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dsagent.cache.layout import Key
from dsagent.cache.peers import PeerFetcher
from dsagent.cache.pools import Pools
from dsagent.cache.settings import Settings
from dsagent.cache.space import RoomHow
from dsagent.cache.striped.stripefetch import BundleSources
from dsagent.cache.striped.stripereaders import Holder
from dsagent.errors import DsagentError, InsufficientSpace
from dsagent.format import durable
from dsagent.format.manifest import BundleRef, Manifest
from dsagent.format.storageconfig import Options
from dsagent.policy.holding import WHOLE, holding
from dsplatform.data import DONE_DIR
from dsplatform.stripe import StripeBundle, StripeLayout, owners

log = logging.getLogger("dsagent.stripes")

#: A share held on demand waits at most this many retry intervals between passes.
ON_DEMAND_BACKOFF = 8


def on_demand_wait(retry: float, idle: int) -> float:
    """Seconds before a share held on demand asks its peers again, after ``idle`` passes in
    a row that brought nothing: the interval after the first, twice as long after each
    further one (peers that lack the bundles are asked less), at most
    :data:`ON_DEMAND_BACKOFF` intervals."""
    return retry * min(1 << min(max(idle - 1, 0), 30), ON_DEMAND_BACKOFF)


PREVIOUS_OWNERS = 2  # members asked for an owned bundle before the store (the next in HRW order)


class MakeRoom(Protocol):
    """The cache's room for a share's bundles (:meth:`dsagent.cache.space.Space.make_room`)."""

    def __call__(self, key: Key, size: int, *, how: RoomHow = "evict") -> Awaitable[None]: ...


@dataclass
class Share:
    """One striped version this node takes part in."""

    layout: StripeLayout
    manifest: Manifest
    store: str
    storage_options: Options
    peers: dict[str, str]  # member -> base URL of its agent
    ready_after: int
    held: set[str] = field(default_factory=set)
    handover: set[str] = field(default_factory=set)  # held under an earlier group: served until dropped
    error: str | None = None
    task: asyncio.Task[None] | None = None
    expires: float = math.inf  # wall-clock seconds: dropped unless held again before (the lease)
    lease: float = 0.0  # the last hold's lease: a share whose lease lapsed goes once unused this long
    # wall-clock seconds: last read by this node's readers or pods, or served to a peer (not
    # its renewals: a copy kept after its job ends ages for the eviction's LRU order)
    last_used: float = 0.0
    readers: int = 0  # streams of its bundles to this node's readers now
    owned: tuple[StripeBundle, ...] = ()  # this node's bundles under its layout
    no_share: frozenset[str] = frozenset()  # members owning no bundle (weight 0)
    holders: set[Holder] = field(default_factory=set)  # the Datasets it is held for: whose pods read it
    whole: bool = False  # every bundle held here, not only the owned ones (``owned`` lists them all)
    inflight: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # bundles being fetched into it
    # bundles being fetched into its window, each with the event that stops its fetch
    visits: dict[asyncio.Future[None], threading.Event] = field(default_factory=dict)
    on_demand: bool = False  # storeOnDemand: the store is read only for bundles a reader waits for
    window_bytes: int = 0  # bytes this node's readers took through the window since the share was held
    kept_bytes: int = 0  # the version's manifest kept beside it, for a restart (ShareRecords._prepare)
    # set once its fill is stopped (let go, re-planned): the fetches under way, on threads no
    # cancel reaches, end at their next step (stripefetch.BundleSources.fetch)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> Key:
        return (self.layout.name, self.layout.digest)

    @property
    def takes_room_as_read(self) -> bool:
        """A share held ``storeOnDemand`` takes its room bundle by bundle as they arrive, as
        a version is read from the store as far as it is read: reserving every bundle at
        once would evict data the cluster reads again for bundles nobody may read."""
        return self.on_demand and not self.whole

    def reserved_bytes(self, disk: Callable[[int, int], int]) -> int:
        """Disk the bundles it misses and whose room is taken will take (``disk(bytes,
        files)``): all of them, or, taking its room as read, those its pods wait for (the
        first ``ready_after``) and those being fetched."""
        missing = [b for b in self.owned if b.digest not in self.held]
        if self.takes_room_as_read:
            coming = {b.digest for b in self.owned[: self.ready_after]} | set(self.inflight)
            missing = [b for b in missing if b.digest in coming]
        return sum(disk(b.size, b.count) for b in missing)

    @property
    def complete_whole(self) -> bool:
        """A whole copy with every bundle on disk: the eviction ranks it as a whole copy."""
        return self.whole and all(b.digest in self.held for b in self.layout.bundles)

    @property
    def filling(self) -> bool:
        return self.task is not None and not self.task.done() and self.error is None

    @property
    def fetching(self) -> bool:
        """Filling with bundles on their way: a share held ``storeOnDemand`` between two passes
        of its fill is not (it may fill for as long as it is held)."""
        return self.filling and (not self.on_demand or bool(self.inflight))

    def disk_bytes(self, disk: Callable[[int, int], int]) -> int:
        """Disk its held and handed-over bundles and its kept manifest take (``disk(bytes, files)``)."""
        bundles = sum(
            disk(b.size, b.count) for b in self.layout.bundles if b.digest in self.held or b.digest in self.handover
        )
        return bundles + (disk(self.kept_bytes, 1) if self.kept_bytes else 0)


class ShareFill:
    """Filling a node's shares (mixed into :class:`~dsagent.cache.striped.stripes.StripeShares`,
    whose attributes it uses): which bundles a share holds (its own, or every bundle for a
    whole copy), fetching them in order or when a reader or a peer asks first, and telling
    a peer to wait for a bundle this node owns and is about to have."""

    settings: Settings
    pools: Pools
    sources: BundleSources
    peers: PeerFetcher
    disk: Callable[[int, int], int]
    capacity: Callable[[], Awaitable[int]] | None
    make_room: MakeRoom
    _shares: dict[Key, Share]

    def share_dir(self, key: Key) -> Path:
        raise NotImplementedError

    async def _whole(
        self, layout: StripeLayout, owned: Sequence[StripeBundle], done: set[str]
    ) -> list[StripeBundle] | None:
        """Every bundle of ``layout``, this node's own first, when the version fits this node
        (:func:`dsagent.policy.holding.holding` on the cache's capacity) and the cache made
        the room for those not on disk yet; None where it does not fit or the room cannot be
        made (this node then holds its share)."""
        size = sum(self.disk(b.size, b.count) for b in layout.bundles)
        capacity = await self.capacity() if self.capacity is not None else 0
        if holding(size, cache_bytes=capacity) is not WHOLE:
            return None
        mine = {b.digest for b in owned}
        everything = [*owned, *(b for b in layout.bundles if b.digest not in mine)]
        try:
            await self.make_room(
                (layout.name, layout.digest),
                sum(self.disk(b.size, b.count) for b in everything if b.digest not in done),
            )
        except InsufficientSpace as exc:
            log.info("%s@%s held as a share, not whole: %s", layout.name, layout.digest[:12], exc)
            return None
        return everything

    async def _fill(self, share: Share) -> None:
        """Fetch this node's bundles not held yet, in layout order, ``fetch_workers`` at once.
        A share held ``storeOnDemand`` asks the peers only, and asks them again every
        ``stripe_on_demand_retry`` seconds for what none had (twice as long after each pass
        that brought nothing, up to :data:`ON_DEMAND_BACKOFF` times), until it is complete (or
        dropped): the store only for its first ``readyAfter`` bundles, which its pods wait for."""
        gate = asyncio.Semaphore(self.settings.fetch_workers)
        waited = {b.digest for b in share.owned[: share.ready_after]}  # readyEnough: its pods wait for them

        async def one(digest: str) -> None:
            async with gate:
                await self._bring(share, digest, demand=digest in waited)

        idle = 0  # passes in a row that brought nothing
        try:
            while todo := [b for b in share.owned if b.digest not in share.held]:
                had = len(share.held)
                await asyncio.gather(*(one(b.digest) for b in todo))  # held, or raised, unless on demand
                if share.on_demand and any(b.digest not in share.held for b in todo):
                    idle = 0 if len(share.held) > had else idle + 1
                    await asyncio.sleep(on_demand_wait(self.settings.stripe_on_demand_retry, idle))
            if share.handover:  # the new owners fetch them from here meanwhile (bounded in time)
                await asyncio.sleep(self.settings.stripe_handover)
                share.handover.clear()
                await self.pools.work(self._drop_unowned, share)
        except asyncio.CancelledError:
            raise
        except DsagentError as exc:
            share.error = str(exc)
            log.warning("share of %s@%s stopped: %s", share.key[0], share.key[1][:12], exc)

    async def _bring(self, share: Share, digest: str, *, demand: bool = False) -> None:
        """Bundle ``digest`` of the share held on disk: at once when it is, else its fetch,
        started now unless it is under way (the fill's turn, or a reader that asked for it
        first: a reader of a bundle this node is to hold waits for that one fetch rather than
        fetch it into the window as well). ``demand``: a reader waits for it, so the store
        may be read for it in a share held ``storeOnDemand`` too, and the peers are told;
        such a fetch found under way from the peers only is waited for, then, where it left
        the bundle missing, one that may read the store follows."""
        store = demand or not share.on_demand
        for _ in range(2):  # a second time only after a fetch from the peers only
            if digest in share.held:
                return
            task = share.inflight.get(digest)
            if task is None:
                task = share.inflight[digest] = asyncio.ensure_future(
                    self._take(share, digest, store=store, reader=demand)
                )
                await asyncio.shield(task)
                return
            await asyncio.shield(task)
            if not store:
                return

    async def _take(self, share: Share, digest: str, *, store: bool, reader: bool) -> None:
        """One fetch of bundle ``digest`` into the share (:meth:`_fetch_owned`), held when it
        arrived; ``store``: the store may be read for it; ``reader``: a reader waits."""
        ref = bundle_of(share.manifest, digest)
        assert ref is not None  # a bundle of the share's layout: its manifest's
        try:
            if share.takes_room_as_read:  # its room now: this bundle's and the others' arriving
                try:  # evicting only for a fetch that may read the store (a reader waits for it)
                    await self.make_room(share.key, share.reserved_bytes(self.disk), how="evict" if store else "free")
                except InsufficientSpace:
                    if reader:
                        raise  # the reader takes it through the window
                    return  # missing: a reader asks for it again
            copies = await self.sources.copies(*share.key)
            if await self.pools.work(self._fetch_owned, share, ref, copies, store=store, reader=reader):
                share.held.add(digest)
        finally:
            self.peers.release(digest)  # held (served from the share) or not at all
            share.inflight.pop(digest, None)

    def _fetch_owned(
        self, share: Share, bundle: BundleRef, copies: Sequence[str], *, store: bool = True, reader: bool = False
    ) -> bool:
        """An owned bundle, verified, then its marker (the files first, so a marker always
        means the files are there). Asked first of the nodes ranked highest by rendezvous
        hashing over the members and the other peers listed (a draining node the controller
        lists as a peer but not a member owned the bundle before, so it ranks first): after a
        member joins, the one ranked second owned the bundle before, and after a drain the
        leaving node did, so a group change moves shares over P2P; then the agents holding or
        fetching a whole copy (``copies``); then the store, the durable copy. Claimed
        meanwhile, so that a whole copy arriving elsewhere waits for it rather than read it
        from the store too. Whether it arrived: ``store`` False (a share held
        ``storeOnDemand``, no reader waiting) asks the peers only, unclaimed (nobody is to wait
        for a fetch that reads no store), and leaves it missing when none has it; ``reader``:
        the peers are told that a reader waits (an owner filling on demand then reads it)."""
        directory = self.share_dir(share.key)
        ranked = sorted({*share.layout.members, *share.peers})
        order = owners(bundle.digest, ranked, replicas=1 + PREVIOUS_OWNERS)
        placed = next((b for b in share.layout.bundles if b.digest == bundle.digest), None)
        if placed is None or placed.owner == self.settings.node_name:
            stop = share.stop
            if store:
                self.sources.fetch_claimed(share, bundle, directory, order, copies=copies, reader=reader, stop=stop)
            elif not self.sources.fetch(share, bundle, directory, order, copies=copies, store=False, stop=stop):
                return False
        else:  # a whole copy's bundle owned elsewhere: its owner first, claimed only once it
            # reads the store (asking the peers, this node makes nobody wait: the owner asking
            # it back would wait on it while it waits on the owner; reading the store, it
            # waits on nobody, and an owner that starts meanwhile waits for it instead of
            # reading the store too). The owner is asked once more right before: one whose
            # fill began while the others were asked has claimed it, and is waited for
            order = [placed.owner, *(m for m in order if m != placed.owner)]
            with self.peers.claim(bundle.digest, "unclaimed") as claim:
                if not self.sources.fetch(
                    share, bundle, directory, order, copies=copies, store=store, reader=reader,
                    before_store=claim.downloading, again=[placed.owner], stop=share.stop,
                ):  # fmt: skip
                    return False
                claim.finished()
        write_marker(directory / DONE_DIR / bundle.digest)
        return True

    def _drop_unowned(self, share: Share) -> None:
        """Markers (then files) of bundles this node held under an earlier group."""
        directory = self.share_dir(share.key)
        mine = {b.digest for b in share.owned}
        for marker in list((directory / DONE_DIR).iterdir()):
            if marker.name not in mine:
                marker.unlink()  # the marker first: the files are no longer promised
                ref = bundle_of(share.manifest, marker.name)
                for entry in share.manifest.bundle_entries(ref) if ref is not None else ():
                    with contextlib.suppress(FileNotFoundError):
                        (directory / entry.path).unlink()

    def pending(self, digest: str, *, reader: bool = False) -> bool:
        """Whether a share filling here owns bundle ``digest`` (this node is its owner in the
        layout) without holding it yet. A peer asking for it then waits for this fill (425)
        rather than read the store as well, and its ask brings the bundle's fetch forward. Only
        the owner says so, never a node copying the version whole: two copies waiting on each
        other would wait out the peer bound. A share held ``storeOnDemand`` says so only when
        ``reader`` (the peer says a reader waits for it): the owner then reads it from the store
        for the cluster, once; a background fill's ask is answered "not here" (404) and reads
        nothing."""
        node = self.settings.node_name
        for share in self._shares.values():
            if not share.filling or digest in share.held or (share.on_demand and not reader):
                continue
            if any(b.digest == digest and b.owner == node for b in share.owned):
                task = asyncio.ensure_future(self._bring(share, digest, demand=reader))
                task.add_done_callback(_quiet)
                return True
        return False


def _quiet(task: asyncio.Future[None]) -> None:
    """A fetch brought forward for a peer: its failure is the fill's to report."""
    if not task.cancelled():
        task.exception()


def bundle_of(manifest: Manifest, digest: str) -> BundleRef | None:
    return next((b for b in manifest.bundles if b.digest == digest), None)


def write_marker(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        durable.fsync(fd, path)
    finally:
        os.close(fd)
    durable.fsync_dir(path.parent)


__all__ = ["PREVIOUS_OWNERS", "MakeRoom", "Share", "ShareFill", "bundle_of", "write_marker"]
