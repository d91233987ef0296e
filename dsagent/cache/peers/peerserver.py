"""The serving side of peer-to-peer bundles: a bundle of a cached version streamed to a peer.

Who calls it: :class:`dsagent.cache.service.CacheService`, which owns one :class:`PeerServer`
and gives it its lookup (a ready version that holds the bundle, found with
:func:`find_bundle`, or the finished bundle of a version still being fetched; pinned against
eviction until the stream ends), and the ``GET /v1/peer/bundles/{digest}`` route
(:mod:`dsagent.api.routes`), which sends the stream. Design: docs/design.md#peers.

What it owns: the directory the files are read from (:class:`ServedBundle`: opened once, so
a staging directory renamed into place mid-stream is still read whole), the upload limits
around each stream (:mod:`dsagent.cache.peers.uploads`), and the stream itself. A cached
version keeps no ``.tar.zst`` objects, so the bundle is re-packed from its files
(:mod:`dsagent.format.bundles.repack`: the pack's member order, headers and zstd level, each file
hashed again as it is read, so that a damaged cache copy cuts the stream instead of being
passed on as good). A bundle this agent is downloading right now is answered 425
(:class:`BundleInFlight`), so that agents starting together share the work
(:mod:`dsagent.cache.peers.swarm`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsagent.cache.layout import Key
from dsagent.cache.metrics import Metrics
from dsagent.cache.peers.uploads import UploadLimits
from dsagent.cache.settings import Settings
from dsagent.errors import NotFound
from dsagent.format.bundles.repack import repack_at
from dsagent.format.manifest import FileEntry, Manifest

log = logging.getLogger("dsagent.peers")


@dataclass(frozen=True)
class ServedBundle:
    """A bundle found in a version: where its files are (``ready_dir``, else ``fallback``:
    a staging directory may be renamed into place at any moment) and which they are."""

    key: Key
    ready_dir: Path
    members: Sequence[FileEntry]
    fallback: Path | None = None
    # told once when its stream ends, with whether it was sent whole (also when it never
    # started: the peer over its limits); how a stripe share counts its hand-off
    ended: Callable[[bool], None] | None = None

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

    ``locate(digest, peer, reader)`` is the service's lookup (pinned until ``unpin``): a ready
    version, or the finished bundle of one being fetched; it raises :class:`BundleInFlight`
    for a bundle this agent is downloading for ``peer`` to wait for (``reader``: the peer
    said a reader waits for it, :mod:`dsplatform.wire.peerbundle`).
    """

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        locate: Callable[[str, str, bool], Awaitable[ServedBundle | None]],
        unpin: Callable[[Key], None],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.limits = UploadLimits(
            settings.peer_max_uploads, settings.peer_max_uploads_per_peer, settings.peer_upload_rate
        )
        self._locate = locate
        self._unpin = unpin

    async def open(self, digest: str, peer: str, *, reader: bool = False) -> tuple[Iterator[bytes], Callable[[], None]]:
        """The stream of bundle ``digest`` for ``peer`` and the call that ends it (idempotent;
        the stream also calls it when it ends). :class:`NotFound` unless a version holds it
        finished, :class:`BundleInFlight` while this agent downloads it, :class:`PeerBusy` /
        :class:`PeerOverloaded` over the limits (so 429 and 503 mean: held here, ask again)."""
        found = await self._locate(digest, peer, reader)
        if found is None:
            raise NotFound(f"no version here holds bundle {digest} finished", hint="ask another peer or the store")

        def let_go(whole: bool) -> None:
            self._unpin(found.key)
            if found.ended is not None:
                found.ended(whole)

        try:
            bucket = self.limits.acquire(peer)
        except BaseException:
            let_go(False)
            raise
        try:
            root = found.open_dir()
        except BaseException:
            let_go(False)
            self.limits.release(peer)
            raise
        ended = threading.Event()
        end_lock = threading.Lock()
        whole = False

        def end() -> None:
            with end_lock:
                if ended.is_set():
                    return
                ended.set()
            os.close(root)
            let_go(whole)
            self.limits.release(peer)

        def stream() -> Iterator[bytes]:
            nonlocal whole
            sent = 0
            try:
                for chunk in repack_at(root, found.members):
                    bucket.take(len(chunk))
                    self.metrics.peer_transfer("served", len(chunk))
                    sent += len(chunk)
                    yield chunk
                whole = True
                log.info("sent bundle %s to %s (%d bytes)", digest[:12], peer, sent)
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


__all__ = ["PeerServer", "ServedBundle", "find_bundle"]
