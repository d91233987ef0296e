"""Where a bundle of a striped version comes from: the peers that hold it, else the store.

Who calls it: :class:`dsagent.cache.stripes.StripeShares`, for the bundles this node owns
(its share's fill, asked of the previous owners first) and for those it fetches into its
window for this node's readers (asked of the owner first). What it owns: the order in
which sources are asked, waiting for a busy peer, and the store as the last, durable
source. Every bundle is verified by digest on the way in, whichever source sent it
(:meth:`dsagent.cache.peers.PeerFetcher.fetch_from`, :func:`dsagent.format.extract.unpack_bundle`).
Design: docs/design-striping.md.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from dsagent.cache.peers import PeerFetcher, PeerFetchingIt
from dsagent.cache.peers.peerfetch import POLL_EVERY
from dsagent.cache.settings import Settings
from dsagent.format.extract import unpack_bundle
from dsagent.format.manifest import BundleRef, Manifest

log = logging.getLogger("dsagent.stripes")


class Version(Protocol):
    """What a fetch needs of a striped version: its manifest, its store and the agents of
    its group and other listed peers (node name -> base URL)."""

    manifest: Manifest
    store: str
    storage_options: Mapping[str, Any] | None
    peers: dict[str, str]


class BundleSources:
    """Fetches one bundle of a striped version into a directory, counting where it came
    from in ``counts`` (``peer_bundles``, ``store_bundles``)."""

    def __init__(self, settings: Settings, peers: PeerFetcher, counts: MutableMapping[str, int]) -> None:
        self.settings, self.peers, self.counts = settings, peers, counts

    def fetch(
        self, version: Version, ref: BundleRef, directory: Path, order: Sequence[str], *, fresh: bool = False
    ) -> None:
        """Bundle ``ref`` into ``directory`` from the first of ``order`` (node names, best
        first) that delivers it verified, else from the store. ``fresh``: ``directory`` is
        the bundle's own and is emptied after a failed attempt (a window slot)."""
        if self._from_peers(version, ref, directory, order, fresh=fresh):
            self.counts["peer_bundles"] += 1
            return
        unpack_bundle(version.store, version.manifest, ref, directory, storage_options=version.storage_options)
        self.counts["store_bundles"] += 1

    def _from_peers(
        self, version: Version, ref: BundleRef, directory: Path, order: Sequence[str], *, fresh: bool
    ) -> bool:
        """Whether a peer delivered. A peer that answers "later" (busy with other streams,
        or downloading the bundle) holds it, and is asked again every ``POLL_EVERY`` for up
        to ``peer_wait``: a group change or a busy epoch must not turn its upload limit into
        store reads. A peer that fails otherwise (not held there, a lie, a dead link) is not
        asked again for this bundle."""
        if self.settings.peer_token is None:
            return False
        asking = [m for m in order if m != self.settings.node_name and version.peers.get(m) is not None]
        deadline = time.monotonic() + self.settings.peer_wait
        while asking:
            later: list[str] = []
            for member in asking:
                try:
                    self.peers.fetch_from(version.peers[member], version.manifest, ref, directory)
                except PeerFetchingIt:
                    later.append(member)
                except Exception as exc:  # any other failure of one peer: ask the next (a lie costs time only)
                    log.info("bundle %s not from %s: %s; asking on", ref.digest[:12], member, exc)
                else:
                    return True
                if fresh:
                    shutil.rmtree(directory, ignore_errors=True)
                    directory.mkdir(parents=True)
            if not later or time.monotonic() + POLL_EVERY >= deadline:
                return False
            time.sleep(POLL_EVERY)
            asking = later
        return False
