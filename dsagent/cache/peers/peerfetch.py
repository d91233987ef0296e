"""Peer-to-peer bundles: agents serving the bundles of their ready versions to each other.

Who calls it: :class:`dsagent.cache.service.CacheService` (which owns one :class:`PeerServer`
and one :class:`PeerFetcher`), the ``GET /v1/peer/bundles/{digest}`` route, and
:mod:`dsagent.cache.versions`, which asks peers for each bundle before the store.
Design and the measured choice between kept and re-packed bundles: docs/design.md#peers.

Serving. A cached version is unpacked: its bundles' ``.tar.zst`` objects are not kept. A
bundle's digest is over its *member records* (path, size, file digest), never over the
compressed bytes, and the receiver verifies members exactly as it verifies a store bundle.
So a peer re-packs the bundle's files from its ready directory into a fresh tar+zstd
stream (:mod:`dsagent.format.repack`: the same member order and headers
:mod:`dsagent.format.bundle` writes) and streams it; it hashes each file again as it reads
it and cuts the stream on a mismatch, so a damaged cache copy is never passed on as good.
Ready versions are served, pinned against eviction while a stream runs; so is a version
still being fetched, for the bundles it has finished (verified, synced and in place in its
staging directory), and answers 425 for one it is downloading right now, so that agents
starting together share the work (below).

Limits: at most ``peer_max_uploads`` streams at once (503 beyond), ``peer_max_uploads_per_peer``
to one peer (429 beyond), and ``peer_upload_rate`` bytes/s to one peer (a token bucket).

Fetching. Before a version's bundles are fetched, the agents that hold it ready are found
(the configured peers' inventories, and in cluster mode the node inventories), each bundle
is asked of them in turn (rotated by bundle index, so requests spread) and unpacked as it
arrives (:func:`dsagent.format.extract.unpack_bundle_stream`: no temporary copy on disk,
and decompression, hashing and writing overlap the transfer), verified like any bundle and
published only whole. Any error, refusal,
timeout (``peer_timeout`` per read, and a deadline from ``peer_min_rate``), oversize or
mismatch drops that peer for the rest of the fetch and moves on; after the peers, the store.

Starting together (:class:`PeerSwarm`). Agents that fetch the same version at once also count
each other as holders (their inventories list it as fetching), refreshed every few seconds.
Each takes the bundles in its own rotation (from its node name), marks the one it works on,
and asks the others first: a peer that has it sends it, a peer downloading it answers 425 and
the bundle is put off to a second round, where the agent waits up to ``peer_wait`` for that
peer before reading the store. Two agents asking each other for the same bundle at the same
moment settle it by :func:`precedes` (a hash of node name and bundle: the one first downloads,
and which one that is differs from bundle to bundle). So ~one agent reads each bundle from
the store however many start together, and the reads spread over them (docs/design.md#peers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tarfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import xxhash

from dsagent.cache.inventory import PEER_INVENTORY_MAX_BYTES
from dsagent.cache.layout import Key, Store
from dsagent.cache.metrics import Metrics
from dsagent.cache.progress import FetchProgress
from dsagent.cache.settings import Settings
from dsagent.errors import (
    DsagentError,
    IntegrityError,
    NotFound,
    TransientError,
)
from dsagent.format.extract import unpack_bundle_stream
from dsagent.format.manifest import BundleRef, FileEntry, Manifest
from dsagent.format.repack import repack, repack_at
from dsplatform import boundedjson

log = logging.getLogger("dsagent.peers")

PEER_HEADER = "X-Dsagent-Peer"
_BLOCK = tarfile.BLOCKSIZE


class PeerBusy(TransientError):
    """This peer already streams its share of bundles to the asking agent."""

    http_status = 429
    code = "peer_busy"


class BundleInFlight(TransientError):
    """This agent is downloading that bundle right now: ask again shortly."""

    http_status = 425
    code = "peer_fetching"


class PeerOverloaded(TransientError):
    """This agent already streams as many bundles as it serves at once."""

    http_status = 503
    code = "peer_overloaded"


# --------------------------------------------------------------------------- serving


class _Bucket:
    """A token bucket: ``rate`` bytes per second, bursts of one second."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            self.tokens = min(float(self.rate), self.tokens + (now - self.stamp) * self.rate) - n
            self.stamp = now
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


@dataclass
class UploadLimits:
    """Concurrent uploads in all and per peer, and each peer's bandwidth."""

    total: int
    per_peer: int
    rate: int
    _running: int = 0
    _by_peer: dict[str, int] = field(default_factory=dict)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, peer: str) -> _Bucket:
        with self._lock:
            if self._running >= self.total:
                raise PeerOverloaded(f"already serving {self._running} bundles", hint="ask another peer or the store")
            if self._by_peer.get(peer, 0) >= self.per_peer:
                raise PeerBusy(
                    f"already serving {self.per_peer} bundles to {peer!r}", hint="ask another peer or the store"
                )
            self._running += 1
            self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
            return self._buckets.setdefault(peer, _Bucket(self.rate))

    def release(self, peer: str) -> None:
        with self._lock:
            self._running -= 1
            self._by_peer[peer] -= 1
            if not self._by_peer[peer]:
                del self._by_peer[peer]

    @property
    def running(self) -> int:
        with self._lock:
            return self._running


@dataclass(frozen=True)
class ServedBundle:
    """A bundle found in a version: where its files are (``ready_dir``, else ``fallback``:
    a staging directory may be renamed into place at any moment) and which they are."""

    key: Key
    ready_dir: Path
    members: Sequence[FileEntry]
    fallback: Path | None = None

    def open_dir(self) -> int:
        """A descriptor of the directory holding the files (:class:`NotFound` if neither is there)."""
        for directory in (self.ready_dir, self.fallback):
            if directory is None:
                continue
            with contextlib.suppress(FileNotFoundError):
                return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        raise NotFound(f"the files of version {self.key[0]}@{self.key[1][:12]} are gone")


class PeerServer:
    """Finds bundles in ready versions and streams them under the upload limits.

    ``locate(digest, peer)`` is the service's lookup (pinned until ``unpin``): a ready version,
    or the finished bundle of one being fetched; it raises :class:`BundleInFlight` for a
    bundle this agent is downloading for ``peer`` to wait for.
    """

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        locate: Callable[[str, str], Awaitable[ServedBundle | None]],
        unpin: Callable[[Key], None],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.limits = UploadLimits(
            settings.peer_max_uploads, settings.peer_max_uploads_per_peer, settings.peer_upload_rate
        )
        self._locate = locate
        self._unpin = unpin

    async def open(self, digest: str, peer: str) -> tuple[Iterator[bytes], Callable[[], None]]:
        """The stream of bundle ``digest`` for ``peer`` and the call that ends it (idempotent;
        the stream also calls it when it ends). :class:`NotFound` unless a version holds it
        finished, :class:`BundleInFlight` while this agent downloads it, :class:`PeerBusy` /
        :class:`PeerOverloaded` over the limits (so 429 and 503 mean: held here, ask again)."""
        found = await self._locate(digest, peer)
        if found is None:
            raise NotFound(f"no version here holds bundle {digest} finished", hint="ask another peer or the store")
        try:
            bucket = self.limits.acquire(peer)
        except BaseException:
            self._unpin(found.key)
            raise
        try:
            root = found.open_dir()
        except BaseException:
            self._unpin(found.key)
            self.limits.release(peer)
            raise
        ended = threading.Event()
        end_lock = threading.Lock()

        def end() -> None:
            with end_lock:
                if ended.is_set():
                    return
                ended.set()
            os.close(root)
            self._unpin(found.key)
            self.limits.release(peer)

        def stream() -> Iterator[bytes]:
            try:
                for chunk in repack_at(root, found.members):
                    bucket.take(len(chunk))
                    self.metrics.peer_transfer("served", len(chunk))
                    yield chunk
            except Exception as exc:  # the status is sent: cutting the stream is the only signal left
                log.warning("stream of bundle %s to %s cut: %s", digest, peer, exc)
                raise
            finally:
                end()

        return stream(), end


def find_bundle(manifests: Sequence[tuple[Key, Manifest]], digest: str) -> tuple[Key, Sequence[FileEntry]] | None:
    """The first ready version (of ``manifests``) that holds bundle ``digest``, and its members."""
    for key, manifest in manifests:
        for bundle in manifest.bundles:
            if bundle.digest == digest:
                return key, manifest.bundle_entries(bundle)
    return None


# --------------------------------------------------------------------------- fetching


class PeerRefused(TransientError):
    """A peer refused a bundle (busy, overloaded, not held): ask the next, keep it for later ones."""

    code = "peer_refused"


class PeerFetchingIt(PeerRefused):
    """A peer answered 425 (it is downloading that bundle right now), or 429 / 503 (it holds
    it but serves as many streams as it may): ask it again shortly."""


#: How a bundle went with the peers: one delivered it; one is downloading it or is busy
#: (wait, or read the store); none has it.
Outcome = Literal["delivered", "fetching", "none"]
#: Seconds between two looks for more holders of a version during its fetch, and between two
#: requests to a peer that is downloading a bundle this agent waits for.
REFRESH_EVERY = 2.0
POLL_EVERY = 0.25
#: In cluster mode a look is a list of every Node: no more often than the agents publish
#: their inventories (``DSAGENT_PUBLISH_INTERVAL``, 10 s by default).
CLUSTER_REFRESH_EVERY = 10.0


@dataclass
class PeerSession:
    """One version's fetch from peers: who holds it, who failed, what came from peers.

    At most ``per_peer`` bundles are asked of one peer at once (the peers' own
    ``peer_max_uploads_per_peer``, so a well-configured peer never answers 429).
    ``refresh`` (blocking) finds the holders again, for :meth:`maybe_refresh`: agents that
    started the same version after this one began.
    """

    holders: list[str]
    per_peer: int = 4
    failed: set[str] = field(default_factory=set)
    bundles: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    refresh: Callable[[], list[str]] | None = None
    refresh_every: float = REFRESH_EVERY
    _slots: dict[str, threading.Semaphore] = field(default_factory=dict)
    _refreshed: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._slots = {peer: threading.Semaphore(self.per_peer) for peer in self.holders}

    def order(self, index: int) -> list[str]:
        with self.lock:
            alive = [p for p in self.holders if p not in self.failed]
        if not alive:
            return []
        start = index % len(alive)
        return alive[start:] + alive[:start]

    @contextlib.contextmanager
    def slot(self, index: int) -> Iterator[list[str]]:
        """Peers to ask in order, the first holding one of its slots for this call:
        a free one if any, else the bundle's own peer (waiting for it)."""
        order = self.order(index)
        chosen = next((p for p in order if self._slots[p].acquire(blocking=False)), None)
        if chosen is None and order:
            chosen = order[0]
            self._slots[chosen].acquire()
        try:
            yield [] if chosen is None else [chosen] + [p for p in order if p != chosen]
        finally:
            if chosen is not None:
                self._slots[chosen].release()

    def drop(self, peer: str) -> None:
        with self.lock:
            self.failed.add(peer)

    def maybe_refresh(self, *, force: bool = False) -> None:
        """Look for holders again when ``refresh_every`` seconds passed since the last look (or ``force``)."""
        if self.refresh is None:
            return
        with self.lock:
            now = time.monotonic()
            if not force and now - self._refreshed < self.refresh_every:
                return
            self._refreshed = now
        try:
            found = self.refresh()
        except Exception as exc:  # noqa: BLE001 - no new holders this time; the fetch goes on
            log.debug("looking for more holders failed: %s", exc)
            return
        with self.lock:
            for peer in found:
                if peer not in self._slots:
                    self._slots[peer] = threading.Semaphore(self.per_peer)
                    self.holders.append(peer)


def precedes(node: str, other: str, digest: str) -> bool:
    """Whether agent ``node`` goes before ``other`` for bundle ``digest`` when both ask for it at
    once: an order by a hash of node and bundle, the same on every agent and different per
    bundle, so that the store reads of agents starting together spread over all of them."""
    rank = xxhash.xxh3_64_intdigest
    return (rank(f"{node}/{digest}".encode()), node) < (rank(f"{other}/{digest}".encode()), other)


class Claim:
    """This agent working on one bundle (:meth:`PeerFetcher.claim`)."""

    def __init__(self, fetcher: PeerFetcher, digest: str) -> None:
        self._fetcher, self._digest = fetcher, digest
        self.done = False

    def downloading(self) -> bool:
        """Move on to downloading it; False when an agent that :func:`precedes` this one asked
        for it meanwhile (:meth:`PeerFetcher.in_flight`): that one reads the store, this one waits."""
        return self._fetcher._start_download(self._digest)

    def finished(self) -> None:
        """It is in place: keep answering 425 until it is recorded done (:meth:`PeerFetcher.release`)."""
        self.done = True


class PeerFetcher:
    """Asks peers for bundles before the store (blocking calls run in the fetch workers).

    It also keeps which bundles this agent is working on (:meth:`claim`): the peer server
    answers 425 for those, so that other agents wait instead of reading the store too.
    """

    def __init__(self, settings: Settings, store: Store, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        #: cluster mode: more holders of ``(name, digest)`` (base URLs), from the node inventories
        self.cluster_holders: Callable[[str, str], Awaitable[list[str]]] | None = None
        timeout = httpx.Timeout(settings.peer_timeout)
        self._client = httpx.Client(
            timeout=timeout, limits=httpx.Limits(max_connections=64, max_keepalive_connections=16)
        )
        self._headers = {"Authorization": f"Bearer {settings.peer_token}", PEER_HEADER: settings.node_name}
        # bundle digest -> "asking" | "yielded" | "downloading" | "finishing" (see claim, in_flight)
        self._working: dict[str, str] = {}
        self._working_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.peer_token is not None and (bool(self.settings.peers) or self.cluster_holders is not None)

    def close(self) -> None:
        self._client.close()

    async def holders(self, name: str, digest: str) -> list[str]:
        """The peers to ask for the bundles of ``name@digest`` (base URLs), best first: those
        holding it ready, those fetching it, then the other configured peers (a short list,
        and one that starts the same version a moment later is then asked all the same; a
        peer that does not answer is dropped for the fetch). In cluster mode, the agents
        whose node inventories list it ready or fetching."""
        ready: list[str] = []
        fetching: list[str] = []
        others: list[str] = []
        if self.settings.peers:
            async with httpx.AsyncClient(timeout=httpx.Timeout(min(self.settings.peer_timeout, 5.0))) as client:
                answers = await asyncio.gather(
                    *(self._holds(client, peer, name, digest) for peer in self.settings.peers)
                )
            for peer, state in zip(self.settings.peers, answers, strict=True):
                (ready if state == "ready" else fetching if state == "fetching" else others).append(peer)
        if self.cluster_holders is not None:
            with contextlib.suppress(Exception):
                ready += [p for p in await self.cluster_holders(name, digest) if p not in ready + fetching + others]
        return ready + fetching + others

    async def session(self, name: str, digest: str) -> PeerSession | None:
        """The fetch of ``name@digest`` from peers (None when peers are off): the holders found
        now, and a way to find more while it runs."""
        if not self.enabled:
            return None
        loop = asyncio.get_running_loop()

        def refresh() -> list[str]:  # from a fetch worker: the lookup runs on this loop
            return asyncio.run_coroutine_threadsafe(self.holders(name, digest), loop).result(timeout=30)

        return PeerSession(
            await self.holders(name, digest),
            per_peer=self.settings.peer_max_uploads_per_peer,
            refresh=refresh,
            refresh_every=REFRESH_EVERY if self.cluster_holders is None else CLUSTER_REFRESH_EVERY,
        )

    async def _holds(self, client: httpx.AsyncClient, peer: str, name: str, digest: str) -> str | None:
        """How ``peer``'s inventory lists ``name@digest``; None for a peer that does not answer
        or answers anything but a bounded, well-formed inventory (the fetch goes on without it)."""
        try:
            async with client.stream("GET", f"{peer}/v1/inventory") as response:
                response.raise_for_status()
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > PEER_INVENTORY_MAX_BYTES:
                        break  # refused by loads below, without reading the rest
            inventory = boundedjson.loads(bytes(body), what="peer inventory", max_bytes=PEER_INVENTORY_MAX_BYTES)
            return holds(inventory, name, digest)
        except Exception as exc:  # noqa: BLE001 - whatever a peer sends, it is only unusable for this fetch
            log.debug("peer %s did not answer its inventory: %s", peer, exc)
            return None

    # -- what this agent works on ------------------------------------------------------

    @contextlib.contextmanager
    def claim(self, digest: str, phase: str) -> Iterator[Claim]:
        """Mark bundle ``digest`` as worked on here (``phase`` "asking" its peers, or
        "downloading" it) for as long as the block runs, and after it, once the block said
        :meth:`Claim.finished`, until :meth:`release` (the bundle is recorded done: only
        then is it served)."""
        claim = Claim(self, digest)
        with self._working_lock:
            self._working[digest] = phase
        try:
            yield claim
        finally:
            with self._working_lock:
                if claim.done:
                    self._working[digest] = "finishing"
                else:
                    self._working.pop(digest, None)

    def _start_download(self, digest: str) -> bool:
        with self._working_lock:
            if self._working.get(digest) == "yielded":
                return False
            self._working[digest] = "downloading"
            return True

    def phase(self, digest: str) -> str | None:
        with self._working_lock:
            return self._working.get(digest)

    def release(self, digest: str) -> None:
        """A finished bundle is recorded done (it is served from now on): no more 425 for it."""
        with self._working_lock:
            self._working.pop(digest, None)

    def in_flight(self, digest: str, peer: str) -> bool:
        """Whether ``peer`` asking for bundle ``digest`` should wait for this agent (425).

        Yes while this agent downloads it. While this agent is still asking its own peers,
        of the two the one that :func:`precedes` goes on: a later ``peer`` waits; an earlier
        one is told no (404), and this agent then yields (:meth:`Claim.downloading` says
        False), so that of agents asking each other at once exactly one reads the store."""
        me = self.settings.node_name
        first = precedes(peer, me, digest)
        with self._working_lock:
            phase = self._working.get(digest)
            if phase == "asking" and first:
                self._working[digest] = phase = "yielded"
        later = not first and peer != me  # the same name (hostnames by default): neither waits
        return phase in ("downloading", "finishing") or (phase == "asking" and later)

    # -- fetching ---------------------------------------------------------------------

    def fetch(
        self,
        session: PeerSession,
        manifest: Manifest,
        bundle: BundleRef,
        index: int,
        staging: Path,
        progress: FetchProgress,
        *,
        wait: float = 0.0,
    ) -> Outcome:
        """Unpack ``bundle`` into ``staging`` from the first peer that delivers it verified;
        while a peer is downloading it, ask again for up to ``wait`` seconds."""
        deadline = time.monotonic() + wait

        def fetch_one(peer: str) -> None:
            self._fetch_one(peer, manifest, bundle, staging, progress)

        while True:
            outcome = self._ask(session, index, bundle.digest[:12], fetch_one)
            if outcome != "fetching" or time.monotonic() >= deadline:
                return outcome
            time.sleep(POLL_EVERY)

    def _ask(self, session: PeerSession, index: int, what: str, fetch_one: Callable[[str], None]) -> Outcome:
        """One pass over the peers for bundle ``what`` (``fetch_one(peer)`` raises unless that peer delivered)."""
        outcome: Outcome = "none"
        with session.slot(index) as peers:
            for peer in peers:
                try:
                    fetch_one(peer)
                except PeerFetchingIt:
                    outcome = "fetching"
                    continue
                except PeerRefused as exc:
                    log.info("peer %s refused bundle %s (%s); trying the next source", peer, what, exc)
                    continue
                except Exception as exc:  # noqa: BLE001 - any failure of a peer means: next source
                    session.drop(peer)
                    log.warning(
                        "bundle %s from peer %s failed (%s); not asking it again for this version", what, peer, exc
                    )
                    continue
                with session.lock:
                    session.bundles += 1
                return "delivered"
        return outcome

    def _fetch_one(
        self, peer: str, manifest: Manifest, bundle: BundleRef, staging: Path, progress: FetchProgress
    ) -> None:
        counted = [0, 0]

        def count(nbytes: int, nfiles: int = 0) -> None:
            counted[0] += nbytes
            counted[1] += nfiles
            progress.add(nbytes, nfiles)

        # compressed bytes: the tar's records and headers, and zstd's frame, on top of the files
        limit = bundle.size + 3 * _BLOCK * (bundle.count + 2) + bundle.size // 64 + (1 << 20)
        deadline = time.monotonic() + self.settings.peer_timeout + limit / max(self.settings.peer_min_rate, 1)
        url = f"{peer}/v1/peer/bundles/{bundle.digest}"
        try:
            with self._client.stream("GET", url, headers=self._headers) as response:
                if response.status_code in (425, 429, 503):
                    raise PeerFetchingIt(f"peer answered {response.status_code}")
                if response.status_code == 404:
                    raise PeerRefused(f"peer answered {response.status_code}")
                if response.status_code != 200:
                    raise DsagentError(f"peer answered {response.status_code}")
                # the body as the network delivers it: httpx re-chunking to 1 MiB copied every byte
                # twice more (0.9-1.1 CPU-s per 703 MB received against 0.26-0.42 s unchunked)
                body = _PeerBody(response.iter_raw(), limit, deadline, self.settings.peer_min_rate, bundle)
                unpack_bundle_stream(body, manifest, bundle, staging, progress=count)  # type: ignore[arg-type]
        except BaseException:
            progress.add(-counted[0], -counted[1])
            raise
        self.metrics.peer_transfer("fetched", body.received)


@dataclass
class PeerSwarm:
    """One version fetched with peers, bundle by bundle (what :func:`dsagent.cache.fetch.fetch_bundles`
    calls): peers first, then the store, with the bundles other agents are downloading put
    off to a second round (see the module's "Starting together")."""

    fetcher: PeerFetcher
    session: PeerSession
    manifest: Manifest
    staging: Path
    progress: FetchProgress

    @property
    def offset(self) -> int:
        """Where this agent starts in the version's bundle list (agents starting together spread)."""
        return xxhash.xxh3_64_intdigest(self.fetcher.settings.node_name.encode())

    def unpack(self, bundle: BundleRef, index: int, *, second: bool, from_store: Callable[[], None]) -> bool:
        """Bring ``bundle`` in from a peer or the store; False: put off (another agent downloads it).
        A bundle brought in stays claimed until :meth:`recorded`."""
        fetcher = self.fetcher
        if not second:
            self.session.maybe_refresh()
            with fetcher.claim(bundle.digest, "asking") as claim:
                outcome = fetcher.fetch(self.session, self.manifest, bundle, index, self.staging, self.progress)
                if outcome == "fetching" or (outcome == "none" and not claim.downloading()):
                    return False  # another agent downloads it: the second round waits for it
                if outcome == "none":
                    from_store()
                claim.finished()
            return True
        outcome = fetcher.fetch(
            self.session, self.manifest, bundle, index, self.staging, self.progress, wait=fetcher.settings.peer_wait
        )
        with fetcher.claim(bundle.digest, "downloading") as claim:
            if outcome != "delivered":
                from_store()  # waited long enough (or nobody has it any more)
            claim.finished()
        return True

    def recorded(self, bundle: BundleRef) -> None:
        """``bundle`` is recorded done: it is served from now on."""
        self.fetcher.release(bundle.digest)

    def close(self) -> None:
        """The fetch ended: release what it finished but could not record (it failed or was cancelled)."""
        for bundle in self.manifest.bundles:
            if self.fetcher.phase(bundle.digest) == "finishing":
                self.fetcher.release(bundle.digest)


class _PeerBody:
    """A peer's response body as the ``read(n)`` stream the unpacker takes, cut with an
    error once it is longer than any honest bundle (``limit``) or later than ``deadline``
    (a peer too slow to finish at ``min_rate``)."""

    def __init__(self, chunks: Iterator[bytes], limit: int, deadline: float, min_rate: int, bundle: BundleRef) -> None:
        self._chunks, self._limit, self._deadline, self._min_rate = chunks, limit, deadline, min_rate
        self._bundle = bundle
        self._chunk, self._offset = b"", 0
        self.received = 0

    def read(self, size: int = -1) -> bytes:
        if self._offset >= len(self._chunk):
            self._chunk, self._offset = next(self._chunks, b""), 0
            if time.monotonic() > self._deadline:
                raise TransientError(f"peer slower than {self._min_rate} bytes/s")
            self.received += len(self._chunk)
            if self.received > self._limit:
                raise IntegrityError(f"peer sent more than {self._limit} bytes for a bundle of {self._bundle.size}")
        if self._offset == 0 and (size < 0 or size >= len(self._chunk)):
            self._offset = len(self._chunk)
            return self._chunk  # the usual case: the unpacker asks for a chunk's worth, no copy
        end = len(self._chunk) if size < 0 else min(len(self._chunk), self._offset + size)
        out, self._offset = self._chunk[self._offset : end], end
        return out


def holds(inventory: Mapping[str, Any], name: str, digest: str) -> str | None:
    """``"ready"`` or ``"fetching"``: how an inventory report (``GET /v1/inventory``, the Node
    annotation) lists ``name@digest``; None when it does not."""
    datasets = inventory.get("datasets") if isinstance(inventory, Mapping) else None
    entry = datasets.get(name) if isinstance(datasets, Mapping) else None
    if not isinstance(entry, Mapping):
        return None
    versions = entry.get("versions") or [entry]
    if not isinstance(versions, list):
        return None
    states = {v.get("state") for v in versions if isinstance(v, Mapping) and v.get("digest") == digest}
    return "ready" if "ready" in states else "fetching" if "fetching" in states else None


def bundle_options(settings: Settings, store: str, options: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``options`` for reading bundles from ``store``, through its configured proxy if any.

    Only bundle downloads use the proxy: bundles are immutable and named by digest, what
    a P2P engine's proxy (Dragonfly's dfdaemon, Kraken's agent) caches best; manifests,
    which change under the same name, are read from the store directly.
    """
    proxy = next(
        (
            p
            for prefix, p in settings.store_proxies.items()
            if store == prefix or store.startswith(prefix.rstrip("/") + "/")
        ),
        None,
    )
    if proxy is None:
        return options
    merged = dict(options or {})
    if store.startswith(("http://", "https://")):
        merged["proxy"] = proxy  # fsspec's HTTP filesystem passes it to every aiohttp request
    elif store.startswith(("s3://", "s3a://")):
        config = dict(merged.get("config_kwargs") or {})
        config["proxies"] = {"http": proxy, "https": proxy}
        merged["config_kwargs"] = config
    else:
        log.warning("a proxy is configured for %s, but only http(s):// and s3:// stores can use one", store)
    return merged


__all__ = [
    "PEER_HEADER",
    "BundleInFlight",
    "Claim",
    "Outcome",
    "PeerBusy",
    "PeerFetcher",
    "PeerFetchingIt",
    "PeerOverloaded",
    "PeerRefused",
    "PeerServer",
    "PeerSession",
    "PeerSwarm",
    "ServedBundle",
    "UploadLimits",
    "bundle_options",
    "find_bundle",
    "holds",
    "precedes",
    "repack",
    "repack_at",
]
