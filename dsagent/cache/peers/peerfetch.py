"""The peer fetch: each bundle of a version asked of the agents that hold it, before the store.

Who calls it: :class:`dsagent.cache.service.CacheService`, which owns one :class:`PeerFetcher`
(:mod:`dsagent.nodeagent.clusteragent` plugs in the holders found in the node inventories);
:mod:`dsagent.cache.versions`, which opens a :class:`~dsagent.cache.peers.peersession.PeerSession`
per version with it and fetches the bundles through a
:class:`~dsagent.cache.peers.swarm.PeerSwarm`; and the peer server's lookup in the service,
which asks it which bundles this agent is working on (:meth:`PeerFetcher.in_flight`: 425).
Design: docs/design.md#peers.

Fetching. Before a version's bundles are fetched, the agents that hold it are found
(:meth:`PeerFetcher.holders`: the configured peers' inventories, and in cluster mode the node
inventories), each bundle is asked of them in turn (:class:`PeerSession`: rotated by bundle
index, so requests spread) and unpacked as it arrives
(:func:`dsagent.format.bundles.extract.unpack_bundle_stream`: no temporary copy on disk, and
decompression, hashing and writing overlap the transfer), verified like any bundle and
published only whole. Any error, timeout (``peer_timeout`` per read, and a deadline from
``peer_min_rate``), oversize or mismatch drops that peer for the rest of the fetch and moves
on; a refusal (:mod:`dsagent.cache.peers.peererrors`) moves on and keeps the peer; after the
peers, the store.

What this agent works on (:meth:`PeerFetcher.claim`): the bundles it is asking its peers for
or downloading, for which its peer server answers 425 so that the others wait instead of
reading the store too. Two agents asking each other for the same bundle at the same moment
settle it by :func:`precedes` (:meth:`PeerFetcher.in_flight`, :meth:`Claim.downloading`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import httpx
import xxhash

from dsagent.cache.fetchlinks import DEFAULT_ROUTE, Lease, transport_in
from dsagent.cache.inventory import PEER_INVENTORY_MAX_BYTES, holds
from dsagent.cache.layout import Store
from dsagent.cache.metrics import Metrics
from dsagent.cache.peers.peererrors import PeerFetchingIt, PeerRefused
from dsagent.cache.peers.peersession import REFRESH_EVERY, PeerSession
from dsagent.cache.progress import FetchProgress
from dsagent.cache.servicehooks import PeerHolder, PeerHolders
from dsagent.cache.settings import Settings
from dsagent.errors import DsagentError, FetchStopped, IntegrityError, TransientError
from dsagent.format.bundles.extract import unpack_bundle_stream
from dsagent.format.manifest import BundleRef, Manifest
from dsplatform import boundedjson
from dsplatform.wire import peerbundle
from dsplatform.wire.inventory import stripe_group

log = logging.getLogger("dsagent.peers")

#: the header a fetching agent names itself in (its node name)
PEER_HEADER = "X-Dsagent-Peer"
_BLOCK = tarfile.BLOCKSIZE

#: How a bundle went with the peers: one delivered it; one is downloading it or is busy
#: (wait, or read the store); none has it.
Outcome = Literal["delivered", "fetching", "none"]
#: Seconds between two requests to a peer that is downloading a bundle this agent waits for.
POLL_EVERY = 0.25
#: In cluster mode a look is a list of every Node: no more often than the agents publish
#: their inventories (``DSAGENT_PUBLISH_INTERVAL``, 10 s by default).
CLUSTER_REFRESH_EVERY = 10.0


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

    def __init__(
        self, settings: Settings, store: Store, metrics: Metrics, *, cluster_holders: PeerHolders | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        #: cluster mode: more holders of ``(name, digest)`` (base URLs), from the node inventories
        self.cluster_holders = cluster_holders
        self._client = self._new_client(None)
        # one client per local address of the fetch links (docs/design.md#links), made when first used
        self._bound: dict[str, httpx.Client] = {}
        self._bound_lock = threading.Lock()
        self._headers = {"Authorization": f"Bearer {settings.peer_token}", PEER_HEADER: settings.node_name}
        # bundle digest -> "asking" | "yielded" | "downloading" | "finishing" (see claim, in_flight)
        self._working: dict[str, str] = {}
        self._working_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.peer_token is not None and (bool(self.settings.peers) or self.cluster_holders is not None)

    def _new_client(self, address: str | None) -> httpx.Client:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
        timeout = httpx.Timeout(self.settings.peer_timeout)
        if address is None:
            return httpx.Client(timeout=timeout, limits=limits)
        where = self.settings.node_netns
        transport = (
            httpx.HTTPTransport(local_address=address, limits=limits)
            if where is None
            else transport_in(where, address, limits)
        )
        return httpx.Client(timeout=timeout, transport=transport)

    def _client_for(self, address: str | None) -> httpx.Client:
        """The client whose connections leave from ``address`` (None: the default route)."""
        if address is None:
            return self._client
        with self._bound_lock:
            client = self._bound.get(address)
            if client is None:
                client = self._bound[address] = self._new_client(address)
            return client

    def close(self) -> None:
        self._client.close()
        with self._bound_lock:
            for client in self._bound.values():
                client.close()

    async def holders(self, name: str, digest: str, *, shares: bool = True) -> list[str]:
        """The peers to ask for the bundles of ``name@digest`` (base URLs), best first: those
        holding it ready, those fetching it, those holding a share of it (the striped
        version's members: each serves its own bundles), then the other configured peers (a short list,
        and one that starts the same version a moment later is then asked all the same; a
        peer that does not answer is dropped for the fetch). In cluster mode, the agents
        whose node inventories list it. ``shares=False``: only the whole copies, ready or
        fetching (what a member of the version's stripe group asks beyond the group)."""
        return [h.url for h in await self.lookup(name, digest, shares=shares)]

    async def lookup(self, name: str, digest: str, *, shares: bool = True) -> list[PeerHolder]:
        """:meth:`holders` with what each peer said of itself: its node and, for a share,
        the version's stripe group (what :class:`PeerSession` asks a bundle's owner first by)."""
        ready: list[PeerHolder] = []
        fetching: list[PeerHolder] = []
        held_shares: list[PeerHolder] = []
        others: list[PeerHolder] = []
        if self.settings.peers:
            async with httpx.AsyncClient(timeout=httpx.Timeout(min(self.settings.peer_timeout, 5.0))) as client:
                answers = await asyncio.gather(
                    *(self._holds(client, peer, name, digest) for peer in self.settings.peers)
                )
            by_state = {"ready": ready, "fetching": fetching, "share": held_shares}
            for holder in answers:
                by_state.get(holder.state, others).append(holder)
        if self.cluster_holders is not None:
            with contextlib.suppress(Exception):
                known = {h.url for h in ready + fetching + held_shares + others}
                found = await self.cluster_holders(name, digest, shares=shares)
                ready += [h for h in found if h.url not in known]
        return ready + fetching + held_shares + others if shares else ready + fetching

    async def session(self, name: str, digest: str) -> PeerSession | None:
        """The fetch of ``name@digest`` from peers (None when peers are off): the holders found
        now, and a way to find more while it runs."""
        if not self.enabled:
            return None
        loop = asyncio.get_running_loop()

        def refresh() -> list[PeerHolder]:  # from a fetch worker: the lookup runs on this loop
            return asyncio.run_coroutine_threadsafe(self.lookup(name, digest), loop).result(timeout=30)

        return PeerSession.of(
            await self.lookup(name, digest),
            per_peer=self.settings.peer_max_uploads_per_peer,
            refresh=refresh,
            refresh_every=REFRESH_EVERY if self.cluster_holders is None else CLUSTER_REFRESH_EVERY,
        )

    async def _holds(self, client: httpx.AsyncClient, peer: str, name: str, digest: str) -> PeerHolder:
        """How ``peer``'s inventory lists ``name@digest`` (state ``""`` for a peer that does not
        list it, does not answer, or answers anything but a bounded, well-formed inventory:
        the fetch goes on without it)."""
        try:
            async with client.stream("GET", f"{peer}/v1/inventory") as response:
                response.raise_for_status()
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > PEER_INVENTORY_MAX_BYTES:
                        break  # refused by loads below, without reading the rest
            inventory = boundedjson.loads(bytes(body), what="peer inventory", max_bytes=PEER_INVENTORY_MAX_BYTES)
            state = holds(inventory, name, digest) or ""
            node = inventory.get("node") if isinstance(inventory, dict) else None
            group = stripe_group(inventory, name, digest) if state == "share" else ()
            return PeerHolder(peer, state, node if isinstance(node, str) and node else None, group)
        except Exception as exc:  # noqa: BLE001 - whatever a peer sends, it is only unusable for this fetch
            log.debug("peer %s did not answer its inventory: %s", peer, exc)
            return PeerHolder(peer, "")

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
        lease: Lease = DEFAULT_ROUTE,
        writers: int = 1,
    ) -> Outcome:
        """Unpack ``bundle`` into ``staging`` from the first peer that delivers it verified;
        while a peer is downloading it, ask again for up to ``wait`` seconds. Over ``lease``'s
        link (:mod:`dsagent.cache.fetchlinks`): a peer that fails over it is asked once more over another.
        ``writers``: the threads writing its files (:func:`~dsagent.format.bundles.extract.member_writers`)."""
        deadline = time.monotonic() + wait

        def fetch_one(peer: str) -> None:
            lease.attempt(
                lambda address: self._fetch_one(peer, manifest, bundle, staging, progress, address, writers=writers),
                source="peer",
                size=bundle.size,
                answers=(PeerRefused,),
            )

        while True:
            outcome = self._ask(session, index, bundle.digest, fetch_one)
            if outcome != "fetching" or time.monotonic() >= deadline:
                return outcome
            time.sleep(POLL_EVERY)

    def _ask(self, session: PeerSession, index: int, digest: str, fetch_one: Callable[[str], None]) -> Outcome:
        """One pass over the peers for bundle ``digest`` (``fetch_one(peer)`` raises unless that peer delivered)."""
        outcome: Outcome = "none"
        what = digest[:12]
        with session.slot(index, digest) as peers:
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

    def fetch_from(
        self, peer: str, manifest: Manifest, bundle: BundleRef, dest: Path, *, reader: bool = False,
        stop: threading.Event | None = None,
    ) -> None:  # fmt: skip
        """Bundle ``bundle`` from the one agent ``peer`` (a base URL) into ``dest``, verified as
        any peer download; for striped versions, which know the owner (docs/design-striping.md).
        ``reader``: a reader waits for it (:mod:`dsplatform.wire.peerbundle`: an owner whose
        share reads the store on demand reads it now rather than answer 404). ``stop``: once
        set, the download ends at its next piece with :class:`~dsagent.errors.FetchStopped`,
        nothing of the bundle left in ``dest``.
        :class:`PeerFetchingIt` / :class:`PeerRefused` / any other error: ask elsewhere."""
        progress = FetchProgress(bundle.size, bundle.count)
        self._fetch_one(peer, manifest, bundle, dest, progress, reader=reader, stop=stop)

    def _fetch_one(
        self,
        peer: str,
        manifest: Manifest,
        bundle: BundleRef,
        staging: Path,
        progress: FetchProgress,
        address: str | None = None,
        *,
        reader: bool = False,
        writers: int = 1,
        stop: threading.Event | None = None,
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
            headers = {**self._headers, **peerbundle.headers(reader)}
            with self._client_for(address).stream("GET", url, headers=headers) as response:
                if response.status_code in (425, 429, 503):
                    raise PeerFetchingIt(f"peer answered {response.status_code}")
                if response.status_code == 404:
                    raise PeerRefused(f"peer answered {response.status_code}")
                if response.status_code != 200:
                    raise DsagentError(f"peer answered {response.status_code}")
                # the body as the network delivers it: httpx re-chunking to 1 MiB copied every byte
                # twice more (0.9-1.1 CPU-s per 703 MB received against 0.26-0.42 s unchunked)
                body = _PeerBody(response.iter_raw(), limit, deadline, self.settings.peer_min_rate, bundle, stop)
                unpack_bundle_stream(body, manifest, bundle, staging, progress=count, writers=writers)  # type: ignore[arg-type]
        except BaseException:
            progress.add(-counted[0], -counted[1])
            raise
        self.metrics.peer_transfer("fetched", body.received)


class _PeerBody:
    """A peer's response body as the ``read(n)`` stream the unpacker takes, cut with an
    error once it is longer than any honest bundle (``limit``) or later than ``deadline``
    (a peer too slow to finish at ``min_rate``), or once ``stop`` is set."""

    def __init__(
        self, chunks: Iterator[bytes], limit: int, deadline: float, min_rate: int, bundle: BundleRef,
        stop: threading.Event | None = None,
    ) -> None:  # fmt: skip
        self._chunks, self._limit, self._deadline, self._min_rate = chunks, limit, deadline, min_rate
        self._bundle, self._stop = bundle, stop
        self._chunk, self._offset = b"", 0
        self.received = 0

    def read(self, size: int = -1) -> bytes:
        if self._offset >= len(self._chunk):
            if self._stop is not None and self._stop.is_set():
                raise FetchStopped(f"the fetch of bundle {self._bundle.digest[:12]} was stopped")
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


__all__ = [
    "CLUSTER_REFRESH_EVERY",
    "PEER_HEADER",
    "POLL_EVERY",
    "Claim",
    "Outcome",
    "PeerFetcher",
    "precedes",
]
