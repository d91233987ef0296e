"""The peer server's upload limits: how many bundle streams at once, and how fast.

Who calls it: :class:`dsagent.cache.peers.peerserver.PeerServer`, which takes a slot of its
:class:`UploadLimits` for each stream (and gives it back when the stream ends) and pays for
each chunk it sends to that peer's token bucket. What it owns: at most
``peer_max_uploads`` streams in all (:class:`PeerOverloaded`, 503, beyond),
``peer_max_uploads_per_peer`` to one peer (:class:`PeerBusy`, 429, beyond), and
``peer_upload_rate`` bytes/s to one peer (a token bucket, bursts of one second). Who a peer
is, the route decides (:func:`dsagent.api.routes.peer_identity`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from dsagent.cache.peers.peererrors import PeerBusy, PeerOverloaded


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


__all__ = ["UploadLimits"]
