"""This node's shares of striped versions, and the bounded window it reads the rest through.

Who calls it: :class:`dsagent.cache.service.CacheService` owns one :class:`StripeShares`,
asks it for bundles it serves to peers (:meth:`StripeShares.locate`, after the ready
versions), and :mod:`dsagent.api.striperoutes` drives it: an operator (the controller, or
``dsctl``) asks this node to hold its share of a version, the node's pods read bundles
through it. Design: docs/design-striping.md.

What it owns, under ``<root>/stripes/<name>/<digest>/``:

- ``share/``: the bundles this node owns by rendezvous hashing over the group (every bundle
  for a whole copy; how it is filled, in which order and from whom: :mod:`.sharefill`)
  (:func:`dsplatform.stripe.owner`), each fetched from a peer that held it before, or one
  holding or fetching a whole copy, else the store (:mod:`dsagent.cache.striped.stripefetch`:
  every file verified by digest, published
  whole), after the cache made room for them as for a fetch
  (:meth:`dsagent.cache.space.Space.make_room`: 1.2x, LRU, never the share itself; the
  bundles still missing stay reserved while it fills, :meth:`StripeShares.pending_bytes`; a
  share held ``storeOnDemand`` takes its room bundle by bundle as they arrive), then
  marked done by an empty file ``share/.stripe/done/<bundle>`` written and synced after
  the files; the layout file (``stripe-layout.jsonl``) beside them. It is what
  a striped CSI volume shows: the share as files, and where the rest lives;
- ``hold.json``, the kept ``manifest`` and holding the shares again after a restart:
  :mod:`.sharerecords`;
- ``window/<bundle>/``: bundles owned elsewhere, fetched for this node's readers from the
  owner over the peer protocol (then the other members, the agents holding or fetching a
  whole copy, then the store), verified the same way. Which of them stay, within
  ``stripe_window_bytes``, is :class:`~dsagent.cache.striped.stripewindow.StripeWindow`'s. The
  window never takes a share's bundle and a share never waits for the window.

Each share records the Datasets it is held for (:meth:`StripeShares.hold`'s ``holders``):
which pods read its bundles is :mod:`~dsagent.cache.striped.stripereaders`' rule
(:meth:`StripeShares.check_reader`), and every stream to a reader is admitted, bounded per
caller and ended when left unread by :mod:`~dsagent.cache.striped.readerstreams`.

A share never counts as a ready version: :meth:`status` reports how many of its bundles are
held, and ``ready_enough`` says whether the first ``ready_after`` of them are (a reader may
start there; a whole-tree volume of a striped version is never offered, see the design).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from dsagent.cache.layout import Key
from dsagent.cache.metrics import Metrics
from dsagent.cache.peers import PeerFetcher, ServedBundle
from dsagent.cache.pools import Pools
from dsagent.cache.settings import Settings
from dsagent.cache.striped.handoff import PeerFetches
from dsagent.cache.striped.readerstreams import OPERATORS, ReaderStream, ReaderStreams
from dsagent.cache.striped.sharefill import MakeRoom, Share, ShareFill, bundle_of
from dsagent.cache.striped.sharerecords import ShareRecords, remove_version
from dsagent.cache.striped.stripecurrent import CurrentVersions
from dsagent.cache.striped.stripefetch import BundleSources
from dsagent.cache.striped.stripereaders import Holder, PodReader, refusal
from dsagent.cache.striped.stripewindow import StripeWindow
from dsagent.errors import DsagentError, FetchStopped, Forbidden, InsufficientSpace, InvalidInput, NotFound
from dsagent.format.manifest import BundleRef, FileEntry, Manifest, read_manifest
from dsagent.format.storageconfig import with_config
from dsplatform.stripe import StripeLayout
from dsplatform.wire.stripehold import HOLDING_SHARE, HOLDING_WHOLE

log = logging.getLogger("dsagent.stripes")

STRIPES_DIR = "stripes"


class ShareUsage(NamedTuple):
    """One share as the cache's space sees it (:meth:`StripeShares.usage`)."""

    key: Key
    size_bytes: int
    last_used: float
    busy: bool
    kept: bool = False  # a whole copy no group holds (released keep=whole): no lease, idle like any copy


class StripeShares(ShareRecords, ShareFill):
    """The striped versions of this node: shares held, peers served, readers fed."""

    def __init__(
        self,
        settings: Settings,
        pools: Pools,
        peers: PeerFetcher,
        *,
        clock: Callable[[], float] = time.time,
        make_room: MakeRoom,
        disk: Callable[[int, int], int],
        capacity: Callable[[], Awaitable[int]] | None = None,
        pods_reported: bool = False,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics  # the agent's: what its readers read from the share and the window
        self.pools = pools
        self.peers = peers
        self.clock = clock
        self.make_room = make_room  # evicts for a share about to be filled (the cache's Space)
        self.disk = disk  # the disk (bytes, files) take: the unit of the capacity (Store.allocated)
        self.capacity = capacity  # the cache's capacity in bytes (None: not known, no whole copies)
        self.root = settings.root / STRIPES_DIR
        self._shares: dict[Key, Share] = {}
        self.counts = {"store_bundles": 0, "peer_bundles": 0, "window_hits": 0, "served_local": 0}
        self.window = StripeWindow(settings, pools, self.counts)
        self.readers = ReaderStreams(settings)  # each caller's streams: bounded, ended when idle
        # Datasets the node's running pods name (read_by); None: not reported yet (``pods_reported``:
        # a layer above reports them, and until it first has, no lapsed share is dropped)
        self.reading: frozenset[Holder] | None = None if pods_reported else frozenset()
        self.sources = BundleSources(settings, peers, self.counts)
        self.current = CurrentVersions(pools)
        self.peer_fetches = PeerFetches()  # peers' asks for share bundles: what a stopping agent waits on
        self._hold_locks: dict[Key, asyncio.Lock] = {}  # hold() of one version at a time

    # -- holding a share --------------------------------------------------------------------

    async def hold(
        self,
        name: str,
        store: str,
        members: Sequence[str],
        peers: Mapping[str, str],
        *,
        no_share: Sequence[str] = (),
        digest: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        ready_after: int = 1,
        lease: float | None = None,
        holders: Iterable[Holder] = (),
        whole: bool = False,
        store_on_demand: bool = False,
        manifest: Manifest | None = None,
        window_bytes: int = 0,
        last_used: float | None = None,
    ) -> dict[str, Any]:
        """Take part in the stripe group ``members`` of ``name`` (its current manifest in
        ``store``, or version ``digest``): write the layout, start fetching this node's share,
        answer its status. Repeating it is harmless, and is the renewal: a share not held
        again within ``lease`` seconds (``stripe_lease`` by default) is dropped by
        :meth:`expire`, as a task's lease lapses. A changed group re-plans the share
        (bundles this node no longer owns are still served to their new owners for
        ``stripe_handover`` seconds after this node's new share is held, then dropped).
        ``no_share``: members that own no bundle (weight 0 in the owner rule): a job's node
        with no room for a share but by evicting another version's last copy takes part so
        that its pods read through its window (docs/design-striping.md#group); this node,
        when listed, holds nothing and is complete at once. ``holders``: the Datasets
        (namespace, name) it is held for, added to those it was held for before: only pods
        of their namespaces read its bundles (:mod:`.stripereaders`). ``whole``: hold every
        bundle, this node's own first, the others from their owners (then the other members,
        the copies, the store), where :func:`dsagent.policy.holding.holding` says the version
        fits this node and the cache can make the room; else this node's share, and the
        status says which (``holding``: docs/design-striping.md#holding). ``store_on_demand``:
        fill from the peers only and read the store only for bundles a reader waits for
        (:mod:`.sharefill`); a change of it applies to the bundles the fill has not started.
        ``manifest``: the version's, kept beside its share (:meth:`recover`): the store is not
        read, and may hold a newer version by now. ``window_bytes`` and ``last_used``: what the
        share's record said before a restart (:meth:`recover`), the bytes its readers took
        through the window (the placement weighs them) and when it was last used (the
        eviction's order); the share counts no fewer bytes, and was used no later, from the
        moment it is held, so that neither a reader of it nor its record sees them start over."""
        lease = self.settings.stripe_lease if lease is None else lease
        if not 0 < lease <= 30 * 86400:
            raise InvalidInput(f"a share's lease is 1 s to 30 days, not {lease:g} s")
        node = self.settings.node_name
        if node not in members:
            raise InvalidInput(f"this node ({node}) is not a member of the stripe group", hint="list it in members")
        shareless = frozenset(no_share)
        if not shareless <= set(members) or shareless >= set(members):
            raise InvalidInput("noShare lists members only, and not all of them", hint="some member must own bundles")
        self.settings.source_policy.check(store, storage_options)
        options = with_config(storage_options, self.settings.storage_config, self.settings.egress_policy)
        for member, url in peers.items():
            if not url.startswith(("http://", "https://")):
                raise InvalidInput(f"peer {member!r} needs an http(s) base URL, not {url!r}")
        if manifest is None:
            manifest = await self.pools.work(
                read_manifest, store, name, storage_options=options, max_files=self.settings.max_dataset_files
            )
        if digest is not None and manifest.digest != digest:
            raise NotFound(f"the store's {name!r} is version {manifest.digest}, not {digest}")
        if not manifest.bundles:
            raise InvalidInput(f"{name!r} is not packed: only a packed version can be striped")
        layout = StripeLayout.create(
            name,
            manifest.digest,
            members,
            [(b.digest, b.first, b.count, b.size) for b in manifest.bundles],
            manifest.entries.paths,
            [e.size for e in manifest.entries],
            weights=dict.fromkeys(shareless, 0.0) or None,
        )
        key = (name, manifest.digest)
        # one hold of a version at a time: a restart's recover() and the controller's renewal
        # may ask together, and two would each prepare its directory and start a fill
        async with self._hold_locks.setdefault(key, asyncio.Lock()):
            share = self._shares.get(key)
            now = self.clock()
            same_group = share is not None and (share.layout.members, share.no_share) == (layout.members, shareless)
            if share is not None and same_group and share.error is None and (share.whole or not whole):
                share.on_demand = store_on_demand  # the fill's next bundles follow it
                share.window_bytes = max(share.window_bytes, window_bytes)
                if last_used is not None:
                    share.last_used = min(share.last_used, last_used)
                share.peers.update(peers)
                share.holders.update(holders)
                share.expires, share.lease = now + lease, lease  # a renewal is no use: last_used stays
                if not share.filling and any(b.digest not in share.held for b in share.owned):
                    # a part kept with no lease (its fill stopped), held again: it fills on
                    share.task = asyncio.create_task(self._fill(share), name=f"stripe-{name}")
                await self.pools.work(self._remember, share)
                return self.status(key)
            if share is not None:  # a new group: the old plan's fill and its fetches end first
                await self._stop_fill(share)
            owned = layout.held_by(node)
            mine = sum(self.disk(b.size, b.count) for b in owned)
            if self.settings.capacity_bytes is not None and mine > self.settings.capacity_bytes:
                raise InsufficientSpace(
                    f"this node's share of {name!r} is {mine} bytes, over the cache's {self.settings.capacity_bytes}",
                    hint="choose a larger stripe group",
                )
            done = await self.pools.work(self._done_markers, key)
            everything = await self._whole(layout, owned, done) if whole else None
            if everything is None:  # the cache makes room for what is missing, as for a fetch (1.2x, LRU)
                missing = [b for b in owned if b.digest not in done]
                if store_on_demand:  # for the bundles its pods wait for; the others take theirs as
                    # they arrive, where evicting could make it (else refused, as any share)
                    await self.make_room(key, sum(self.disk(b.size, b.count) for b in missing), how="possible")
                    missing = [b for b in owned[: max(0, ready_after)] if b.digest not in done]
                await self.make_room(key, sum(self.disk(b.size, b.count) for b in missing))
            share = Share(
                layout, manifest, store, options, dict(peers), max(0, ready_after), owned=tuple(everything or owned),
                no_share=shareless, holders={*(share.holders if share is not None else ()), *holders},
                whole=everything is not None, on_demand=store_on_demand,
                window_bytes=max(window_bytes, share.window_bytes if share is not None else 0),
                # a new group re-plans the share but is no use of it
                last_used=min(share.last_used if share is not None else now, now if last_used is None else last_used),
            )  # fmt: skip
            share.expires, share.lease = now + lease, lease
            self._shares[key] = share
            await self.pools.work(self._prepare, share, done)
            await self.pools.work(self._remember, share)
            share.task = asyncio.create_task(self._fill(share), name=f"stripe-{name}")
            return self.status(key)

    async def held(self, key: Key) -> Share:
        """The share of ``key`` held here; else Superseded (:mod:`.stripecurrent`) or NotFound."""
        share = self._shares.get(key)
        if share is None:
            await self.current.check(key[0], key[1], (s for k, s in self._shares.items() if k[0] == key[0]))
            raise NotFound(f"this node holds no share of {key[0]}@{key[1][:12]}")
        return share

    async def check_reader(self, key: Key, reader: PodReader) -> None:
        """Refuse (:class:`Forbidden`, 403) a pod that may not read the share of ``key``
        (:func:`.stripereaders.refusal`: another namespace's, or a version it does not name);
        404 or 410 first when no share of it is held here."""
        share = await self.held(key)
        refused = refusal(reader, key[0], key[1], share.store, share.holders)
        if refused is not None:
            raise Forbidden(refused[0], hint=refused[1])

    def status(self, key: Key) -> dict[str, Any]:
        share = self._shares.get(key)
        if share is None:
            raise NotFound(f"this node holds no share of {key[0]}@{key[1][:12]}")
        mine = share.owned
        held = [b for b in mine if b.digest in share.held]
        first = mine[: share.ready_after]
        return {
            "name": key[0],
            "digest": key[1],
            "members": list(share.layout.members),
            "bundles_owned": len(mine),
            "bundles_held": len(held),
            "bytes_owned": sum(b.size for b in mine),
            "bytes_held": sum(b.size for b in held),
            "complete": len(held) == len(mine),
            "ready_enough": all(b.digest in share.held for b in first),
            "error": share.error,
            "share_dir": str(self.share_dir(key)),
            "holding": HOLDING_WHOLE if share.whole else HOLDING_SHARE,
            "store_on_demand": share.on_demand,
        }

    def held_bytes(self) -> dict[Key, int]:
        """Bytes of each striped version this node holds (for the inventory)."""
        return {
            key: sum(b.size for b in share.layout.bundles if b.digest in share.held)
            for key, share in self._shares.items()
        }

    # -- leases, release, space ---------------------------------------------------------------

    def usage(self) -> list[ShareUsage]:
        """Per share what :class:`dsagent.cache.space.Space` counts and evicts: the bytes it
        takes (held and handed-over bundles, and its window), when it was last used (now,
        while pods on this node read it), whether it is busy (bundles on their way into it,
        streamed to a reader now, or pods on this node reading it; a share held
        ``storeOnDemand`` between two passes of its fill is not), and whether it is a whole
        copy no group holds any more (kept: no lease, idle like any copy)."""
        window = self.window.bytes_by_version()
        now = self.clock()
        out = []
        for key, share in self._shares.items():
            read = not share.holders.isdisjoint(self.reading or ())  # read_by stores the use once they end
            busy = share.readers > 0 or share.fetching or read
            out.append(ShareUsage(key, share.disk_bytes(self.disk) + window.get(key, 0),
                                  now if read else share.last_used, busy, math.isinf(share.expires)))  # fmt: skip
        return out

    def read_by(self, datasets: Collection[Holder]) -> None:
        """The Datasets (namespace, name) that pods running on this node name now (the
        cluster agent's pod watch tells it at each change): a share held for one of them,
        now or once it is held, is in use, which is what a whole copy read from local disk
        shows the agent; it was last used when the last of those pods ended."""
        now = self.clock()
        for share in self._shares.values():
            if not share.holders.isdisjoint(self.reading or ()) or not share.holders.isdisjoint(datasets):
                share.last_used = now
        self.reading = frozenset(datasets)

    def total_bytes(self) -> int:
        """Disk the shares and the window take (counted against the cache's capacity)."""
        return sum(share.disk_bytes(self.disk) for share in self._shares.values()) + self.window.bytes

    def pending_bytes(self, exclude: Key | None = None) -> int:
        """Disk the shares being filled still miss, their room made when they were held
        (:meth:`hold`; held ``storeOnDemand``, the bundles its pods wait for and those on
        their way: :meth:`Share.reserved_bytes`): reserved for them, so that a fetch starting
        meanwhile cannot take it. ``exclude``: a share whose room is being made again."""
        return sum(
            share.reserved_bytes(self.disk) for key, share in self._shares.items() if key != exclude and share.filling
        )

    async def drop(self, key: Key, *, reason: str) -> bool:
        """Stop holding one share: its fill stops, its window bundles and files go (the
        markers with them, so nothing is promised that is not there). A hole costs the
        group only this node's bundles: readers and the new owners fetch them again."""
        share = self._shares.get(key)
        if share is None:
            return False
        await self._stop_fill(share)
        share.held.clear()  # promised no more, to peers and readers, before the files go
        share.handover.clear()
        await self.window.forget(key)
        log.info("dropping the share of %s@%s (%s)", key[0], key[1][:12], reason)
        await self.pools.work(remove_version, self.version_dir(key))
        if self._shares.get(key) is share:
            del self._shares[key]
            self.sources.forget(*key)
        lock = self._hold_locks.get(key)
        if lock is not None and not lock.locked():
            del self._hold_locks[key]
        return True

    async def release(self, name: str, digest: str | None = None, *, keep_whole: bool = False) -> list[str]:
        """``DELETE /v1/stripes/<name>``: drop this node's shares of ``name`` (of one
        version with ``digest``); the digests let go. :class:`NotFound` when none is held.
        ``keep_whole`` (the controller, taking the node out of a group): a share holding
        the version whole is kept instead, a copy with no lease, which the cache's eviction
        (and the idle sweep) removes when it needs the room; it still serves its bundles, and
        a group that holds it again re-plans it with no byte moved. A whole copy let go
        before it was complete keeps the bundles it holds and stops filling (nobody asked for
        the rest); one that holds none goes."""
        keys = [k for k in self._shares if k[0] == name and (digest is None or k[1] == digest)]
        if not keys:
            raise NotFound(f"this node holds no share of {name}" + (f"@{digest[:12]}" if digest else ""))
        for key in keys:
            share = self._shares[key]
            if keep_whole and share.whole and share.held:
                await self._keep(share)
                log.info(
                    "keeping the whole copy of %s@%s after its group let it go (%d of %d bundles)",
                    key[0], key[1][:12], len(share.held), len(share.layout.bundles),
                )  # fmt: skip
            else:
                await self.drop(key, reason="released")
        return [k[1] for k in keys]

    async def _keep(self, share: Share) -> None:
        """Keep a share holding the version whole as a copy with no lease, recorded: one not yet
        complete stops filling (nobody asked for the rest) and keeps the bundles it holds."""
        if not share.complete_whole:
            await self._stop_fill(share)
            share.stop.clear()  # held again, it fills anew
        share.expires = math.inf
        await self.pools.work(self._remember, share)

    @staticmethod
    async def _stop_fill(share: Share) -> None:
        """Stop a share's fill and wait for it to end, and for the bundle fetches under way
        into its directory, its own and its window's (each runs on a thread no cancel stops:
        one left running would write into a directory being removed). They are told to stop
        (:attr:`Share.stop`, left set: a fetch asked for meanwhile ends at once too; a share
        kept and filled again clears it) and end at their next step, not after a busy peer's
        wait or a whole bundle: a release or a new group waits at most for one read. The
        bundles it holds stay (a kept part), and nothing is reserved for the rest
        (:meth:`pending_bytes` counts filling shares)."""
        share.stop.set()
        for stop in share.visits.values():  # the window's fetches for this share's readers
            stop.set()
        if share.task is not None:
            share.task.cancel()
            await asyncio.gather(share.task, return_exceptions=True)
        # a fetch a reader or a peer brought forward ends as the fill's; a window fetch as well
        while share.inflight or share.visits:
            await asyncio.gather(*share.inflight.values(), *share.visits, return_exceptions=True)

    async def expire(self) -> list[Key]:
        """Drop the shares whose lease lapsed (the sweep calls it): nobody held them again, and
        nobody used them for a lease either. A version a running job still reads keeps its
        share after the controller stops renewing it (a superseded version: the controller
        holds the Dataset's current one only, docs/design-striping.md#superseded): pods on
        this node name it, a reader or a peer read it within its last lease. It lapses one
        lease after its last use. A lapsed share the node's pods read is recorded as used now,
        so that an agent restarted meanwhile holds it again (:meth:`recover`). Until the node's
        pods are first reported (``pods_reported``), nothing lapses: which of them still read
        a share is not known yet."""
        now, reading = self.clock(), self.reading
        if reading is None:
            return []
        for share in self._shares.values():
            if share.expires <= now and not share.holders.isdisjoint(reading):
                share.last_used = now
                await self.pools.work(self._remember, share)
        gone = [
            key for key, share in self._shares.items()
            if share.expires <= now and share.readers == 0 and share.holders.isdisjoint(reading)
            and now - share.last_used >= share.lease
        ]  # fmt: skip
        for key in gone:
            await self.drop(key, reason="its lease lapsed")
        return gone

    def inventory(self) -> dict[str, Any]:
        """The inventory's ``stripes`` section: per name, the newest version this node takes part in."""
        out: dict[str, Any] = {}
        for key, share in self._shares.items():
            out[key[0]] = {
                "digest": key[1],
                "sizeBytes": share.layout.total_bytes,
                "heldBytes": sum(b.size for b in share.layout.bundles if b.digest in share.held),
                "windowBytes": share.window_bytes,
                "members": len(share.layout.members),
                # the owners only: a reader computes each bundle's owner over this list, and a
                # member without a share owns nothing (weight 0 is the same as not listed)
                "group": [m for m in share.layout.members if m not in share.no_share],
            }
        return out

    async def stop(self) -> None:
        """Every share's fill stopped, and its bundle fetches under way ended."""
        await asyncio.gather(*(self._stop_fill(share) for share in self._shares.values()))

    # -- serving peers ----------------------------------------------------------------------

    async def locate(self, digest: str) -> ServedBundle | None:
        """A held share bundle with ``digest``, for a peer (window bundles are not held: a
        member serves only what it owns and holds). Shares are outside the eviction of
        versions, so nothing is pinned; its key is ``("stripe/<name>", digest)``, which names
        no version. Each one found counts in :attr:`peer_fetches` until its stream ends."""
        for key, share in self._shares.items():
            if digest in share.held or digest in share.handover:
                ref = bundle_of(share.manifest, digest)
                if ref is not None:
                    share.last_used = self.clock()  # serving the group is a use of it
                    self.peer_fetches.asked(self.clock())
                    return ServedBundle(
                        (f"stripe/{key[0]}", key[1]),
                        self.share_dir(key),
                        list(share.manifest.bundle_entries(ref)),
                        ended=lambda whole: self.peer_fetches.ended(self.clock(), whole),
                    )
        return None

    def bundles_served(self) -> int:
        """The share bundles this node serves to peers now (held, or handed over and not yet dropped)."""
        return sum(len(share.held | share.handover) for share in self._shares.values())

    # -- feeding this node's readers ----------------------------------------------------------

    async def open_bundle(
        self, name: str, digest: str, bundle: str, *, caller: str = OPERATORS
    ) -> tuple[Path, list[FileEntry], ReaderStream]:
        """Where this node's reader ``caller`` (a pod UID, or the operators) finds ``bundle``
        (held, or fetched into the window) and its stream, which holds the bundle until it is
        closed (:mod:`.readerstreams`: bounded per caller, closed when left unread).
        :class:`NotFound` unless a share of the version is held here."""
        key = (name, digest)
        share = await self.held(key)
        ref = bundle_of(share.manifest, bundle)
        if ref is None:
            raise NotFound(f"version {name}@{digest[:12]} has no bundle {bundle}")
        entries = list(share.manifest.bundle_entries(ref))
        if bundle not in share.held and share.filling and any(b.digest == bundle for b in share.owned):
            with contextlib.suppress(DsagentError):  # not fetched: the window asks the others, then the store
                await self._bring(share, bundle, demand=True)
        local = bundle in share.held
        stream = await self.readers.admit(caller, 0 if local else self.disk(ref.size, ref.count))
        try:
            if self._shares.get(key) is not share:  # dropped while the caller waited for its turn
                raise NotFound(f"this node holds no share of {name}@{digest[:12]}")
            share.last_used = self.clock()
            if local and bundle in share.held:
                self.counts["served_local"] += 1
                if self.metrics is not None:
                    self.metrics.stripe_read("share", ref.size)
                share.readers += 1
                stream.holding(lambda: _done_reading(share))
                return self.share_dir(key), entries, stream

            async def fetch(directory: Path, stop: threading.Event) -> None:
                # stopped when no reader waits for it any more (the window), or when the share is
                # let go (_stop_fill sets the event of every fetch listed, until its thread has ended)
                copies = await self.sources.copies(*key)
                if share.stop.is_set():  # let go during the lookup: no thread, no directory under it
                    raise FetchStopped(
                        f"the share of {name}@{digest[:12]} was let go while bundle {bundle[:12]} was asked for"
                    )
                # on a thread a cancel does not stop: a release waits for it (_stop_fill)
                work = asyncio.ensure_future(self.pools.work(self._fetch_visiting, share, ref, directory, copies, stop))
                share.visits[work] = stop
                work.add_done_callback(lambda done: share.visits.pop(done, None))
                await asyncio.shield(work)

            directory = self.window_dir(key) / bundle
            where, release = await self.window.open((key, bundle), directory, self.disk(ref.size, ref.count), fetch)
            # in the bytes heldBytes counts (the layout's sizes are the manifest's), so the
            # placement weighs one against the other
            share.window_bytes += ref.size
            if self.metrics is not None:
                self.metrics.stripe_read("window", ref.size)
            stream.holding(release)
            return where, entries, stream
        except BaseException:
            stream.close()
            raise

    def _fetch_visiting(
        self, share: Share, ref: BundleRef, directory: Path, copies: Sequence[str], stop: threading.Event
    ) -> None:
        """A bundle owned elsewhere into the window: the owner, the other members, the store;
        each peer told that a reader waits for it (an owner filling on demand then reads it).
        Ended at its next step once ``stop`` is set."""
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        bundle = next(b for b in share.layout.bundles if b.digest == ref.digest)
        order = [bundle.owner, *(m for m in share.layout.members if m != bundle.owner)]
        self.sources.fetch(share, ref, directory, order, copies=copies, fresh=True, reader=True, stop=stop)


def _done_reading(share: Share) -> None:
    share.readers = max(0, share.readers - 1)


__all__ = ["STRIPES_DIR", "StripeShares"]
