"""Where a bundle of a striped version comes from: the peers that hold it, else the store.

Who calls it: :class:`dsagent.cache.striped.stripes.StripeShares`, for the bundles this node owns
(its share's fill, asked of the previous owners first) and for those it fetches into its
window for this node's readers (asked of the owner first). What it owns: the order in
which sources are asked (the group's members in the order given, then the agents holding
or fetching a whole copy of the version, then the store), waiting for a busy peer, and the
store as the last, durable source, or none: a share held ``storeOnDemand`` fills from the
peers only, and says to them when a reader waits (:mod:`dsplatform.wire.peerbundle`).
Every bundle is verified by digest on the way in, whichever source sent it
(:meth:`dsagent.cache.peers.PeerFetcher.fetch_from`, :func:`dsagent.format.bundles.extract.unpack_bundle`).
Design: docs/design-striping.md.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Protocol

from dsagent.cache.peers import PeerFetcher, PeerFetchingIt, PeerRefused
from dsagent.cache.peers.peerfetch import CLUSTER_REFRESH_EVERY, POLL_EVERY
from dsagent.cache.peers.peersession import REFRESH_EVERY
from dsagent.cache.settings import Settings
from dsagent.errors import FetchStopped
from dsagent.format.bundles.extract import unpack_bundle
from dsagent.format.manifest import BundleRef, Manifest
from dsagent.format.storageconfig import Options

log = logging.getLogger("dsagent.stripes")


class Version(Protocol):
    """What a fetch needs of a striped version: its manifest, its store and the agents of
    its group and other listed peers (node name -> base URL)."""

    manifest: Manifest
    store: str
    storage_options: Options
    peers: dict[str, str]


class BundleSources:
    """Fetches one bundle of a striped version into a directory, counting where it came
    from in ``counts`` (``peer_bundles``, ``store_bundles``)."""

    def __init__(self, settings: Settings, peers: PeerFetcher, counts: MutableMapping[str, int]) -> None:
        self.settings, self.peers, self.counts = settings, peers, counts
        self._copies: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}  # -> (looked up at, URLs)

    def fetch(
        self,
        version: Version,
        ref: BundleRef,
        directory: Path,
        order: Sequence[str],
        *,
        copies: Sequence[str] = (),
        fresh: bool = False,
        before_store: Callable[[], object] | None = None,
        store: bool = True,
        reader: bool = False,
        again: Sequence[str] = (),
        stop: threading.Event | None = None,
    ) -> bool:
        """Bundle ``ref`` into ``directory`` from the first of ``order`` (node names, best
        first), then of ``copies`` (base URLs of agents holding or fetching the version
        whole), that delivers it verified, else from the store, after asking ``again`` (node
        names) once more (an owner that began its fill since it was asked has claimed the
        bundle by now: this one waits for it) and then calling ``before_store`` (False: a
        peer reads the store for it, so the peers are asked once more, waiting for that one,
        before the store); whether it is there. ``fresh``: ``directory`` is the bundle's own
        and is emptied after a failed attempt (a window slot). ``store``: False, the peers
        only (a share held ``storeOnDemand`` filling in the background: False when none
        delivers). ``reader``: the peers are told that a reader waits for it. ``stop``: once
        set (the share it is fetched for is let go, or no reader waits for a window bundle any
        more), the fetch ends at its next step, a wait for a busy peer at once, a download at
        its next piece, with :class:`FetchStopped`, nothing of the bundle left in
        ``directory``."""

        def from_peers(order: Sequence[str], copies: Sequence[str], quiet: bool = False) -> bool:
            return self._from_peers(
                version, ref, directory, order, copies, fresh=fresh, reader=reader, quiet=quiet, stop=stop
            )

        if from_peers(order, copies, quiet=not store):
            self.counts["peer_bundles"] += 1
            return True
        if not store:
            return False
        if again and from_peers(again, ()):
            self.counts["peer_bundles"] += 1
            return True
        if before_store is not None and before_store() is False:
            # a peer asking at once was told to read the store itself: wait for it
            if from_peers(order, copies):
                self.counts["peer_bundles"] += 1
                return True
        _check(stop, ref)
        unpack_bundle(
            version.store, version.manifest, ref, directory, storage_options=version.storage_options,
            progress=None if stop is None else lambda _bytes, _files: _check(stop, ref),
        )  # fmt: skip
        self.counts["store_bundles"] += 1
        return True

    def fetch_claimed(
        self,
        version: Version,
        ref: BundleRef,
        directory: Path,
        order: Sequence[str],
        *,
        copies: Sequence[str] = (),
        reader: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        """:meth:`fetch` for a bundle this node will serve (its share), claimed meanwhile
        (:meth:`dsagent.cache.peers.PeerFetcher.claim`): an agent fetching the version whole
        that asks for it waits for this one (425) instead of reading the store too, and two
        agents asking each other settle who reads it, as agents starting a version together
        do. The claim stays until the caller has recorded the bundle held and calls
        ``PeerFetcher.release``."""
        with self.peers.claim(ref.digest, "asking") as claim:
            self.fetch(
                version, ref, directory, order, copies=copies, before_store=claim.downloading, reader=reader, stop=stop
            )
            claim.finished()

    async def copies(self, name: str, digest: str) -> Sequence[str]:
        """The agents holding or fetching ``name@digest`` whole (base URLs, ready ones
        first), looked up again as often as a whole copy's fetch looks for its peers: every
        ``REFRESH_EVERY`` seconds among configured peers (a lookup asks each of them), every
        ``CLUSTER_REFRESH_EVERY`` in cluster mode (a lookup lists the cluster's nodes)."""
        if not self.peers.enabled:
            return ()
        now = time.monotonic()
        found = self._copies.get((name, digest))
        every = REFRESH_EVERY if self.peers.cluster_holders is None else CLUSTER_REFRESH_EVERY
        if found is None or now - found[0] >= every:
            urls: list[str] = []
            with contextlib.suppress(Exception):  # no lookup: the group and the store still serve
                urls = await self.peers.holders(name, digest, shares=False)
            found = self._copies[(name, digest)] = (now, tuple(urls))
        return found[1]

    def forget(self, name: str, digest: str) -> None:
        self._copies.pop((name, digest), None)

    def _from_peers(
        self,
        version: Version,
        ref: BundleRef,
        directory: Path,
        order: Sequence[str],
        copies: Sequence[str],
        *,
        fresh: bool,
        reader: bool = False,
        quiet: bool = False,
        stop: threading.Event | None = None,
    ) -> bool:
        """Whether a peer delivered. A peer that answers "later" (busy with other streams,
        or downloading the bundle: a whole copy still arriving) holds it, and is asked again
        every ``POLL_EVERY`` for up to ``peer_wait``: a group change or a busy epoch must not
        turn its upload limit into store reads. A peer that fails otherwise (not held there,
        a lie, a dead link) is not asked again for this bundle. ``quiet``: a peer's "not here"
        is logged at debug level (a fill on demand asks for what nobody holds, pass after pass)."""
        if self.settings.peer_token is None:
            return False
        urls = [version.peers[m] for m in order if m != self.settings.node_name and version.peers.get(m) is not None]
        asking = list(dict.fromkeys([*urls, *copies]))
        deadline = time.monotonic() + self.settings.peer_wait
        while asking:
            later: list[str] = []
            for url in asking:
                _check(stop, ref)
                try:
                    self.peers.fetch_from(url, version.manifest, ref, directory, reader=reader, stop=stop)
                except FetchStopped:
                    raise
                except PeerFetchingIt:
                    later.append(url)
                except PeerRefused as exc:
                    level = logging.DEBUG if quiet else logging.INFO
                    log.log(level, "bundle %s not from %s: %s; asking on", ref.digest[:12], url, exc)
                except Exception as exc:  # any other failure of one peer: ask the next (a lie costs time only)
                    log.info("bundle %s not from %s: %s; asking on", ref.digest[:12], url, exc)
                else:
                    return True
                if fresh:
                    shutil.rmtree(directory, ignore_errors=True)
                    directory.mkdir(parents=True)
            if not later or time.monotonic() + POLL_EVERY >= deadline:
                return False
            if stop is None:
                time.sleep(POLL_EVERY)
            elif stop.wait(POLL_EVERY):
                _check(stop, ref)
            asking = later
        return False


def _check(stop: threading.Event | None, ref: BundleRef) -> None:
    """Raise :class:`FetchStopped` once ``stop`` is set."""
    if stop is not None and stop.is_set():
        raise FetchStopped(
            f"the fetch of bundle {ref.digest[:12]} was stopped: its share was let go, or no reader waits for it"
        )
