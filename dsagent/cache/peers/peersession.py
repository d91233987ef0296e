"""One version's fetch from peers: the holders to ask, in which order, and which failed.

Who calls it: :meth:`dsagent.cache.peers.peerfetch.PeerFetcher.session` opens one per version
fetched, with the holders found before it starts; the fetch asks it, bundle by bundle, which
peers to ask (:meth:`PeerSession.slot`). What it owns: bundle *i* goes first to holder
*i mod n* (so requests spread), except that a striped version's bundle goes first to its
owner when the members' inventories list the group (the owner computed from the bundle's
digest, ``dsplatform.stripe.owner``; the other members would answer 404), at most
``per_peer`` bundles are asked of one peer at once,
a peer that failed is dropped for the rest of the version (:meth:`PeerSession.drop`), and
holders are looked for again every few seconds while the fetch runs
(:meth:`PeerSession.maybe_refresh`: agents that started the same version later).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from dsagent.cache.servicehooks import PeerHolder
from dsplatform.stripe import owner

log = logging.getLogger("dsagent.peers")

#: Seconds between two looks for more holders of a version during its fetch.
REFRESH_EVERY = 2.0


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
    refresh: Callable[[], Sequence[PeerHolder]] | None = None
    refresh_every: float = REFRESH_EVERY
    #: a striped version's members (node names), and the base URL of each one found
    group: tuple[str, ...] = ()
    member_urls: dict[str, str] = field(default_factory=dict)
    _slots: dict[str, threading.Semaphore] = field(default_factory=dict)
    _refreshed: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._slots = {peer: threading.Semaphore(self.per_peer) for peer in self.holders}
        self.member_urls = dict(self.member_urls)

    @classmethod
    def of(
        cls,
        found: Sequence[PeerHolder],
        *,
        per_peer: int = 4,
        refresh: Callable[[], Sequence[PeerHolder]] | None = None,
        refresh_every: float = REFRESH_EVERY,
    ) -> PeerSession:
        """A session over the holders a lookup found (:meth:`PeerFetcher.lookup`)."""
        session = cls([h.url for h in found], per_peer=per_peer, refresh=refresh, refresh_every=refresh_every)
        session._learn(found)
        return session

    def _learn(self, found: Sequence[PeerHolder]) -> None:
        """The group of the shares found (the first listed wins) and each member's URL."""
        with self.lock:
            for h in found:
                if h.state != "share":
                    continue
                if h.group and not self.group:
                    self.group = h.group
                if h.node is not None:
                    self.member_urls.setdefault(h.node, h.url)

    def owner_of(self, key: str) -> str | None:
        """The base URL of bundle ``key``'s owner in the group, when both are known."""
        with self.lock:
            group, urls = self.group, self.member_urls
            member = owner(key, group) if group else None
            return urls.get(member) if member is not None else None

    def order(self, index: int, key: str | None = None) -> list[str]:
        first = self.owner_of(key) if key is not None else None
        with self.lock:
            alive = [p for p in self.holders if p not in self.failed]
        if not alive:
            return []
        start = index % len(alive)
        order = alive[start:] + alive[:start]
        if first is not None and first in order:
            order.remove(first)
            order.insert(0, first)
        return order

    @contextlib.contextmanager
    def slot(self, index: int, key: str | None = None) -> Iterator[list[str]]:
        """Peers to ask in order, the first holding one of its slots for this call:
        a free one if any, else the bundle's own peer (waiting for it). ``key``: the
        bundle's digest, by which a striped version's owner is asked first."""
        order = self.order(index, key)
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
        self._learn(found)
        with self.lock:
            for peer in (h.url for h in found):
                if peer not in self._slots:
                    self._slots[peer] = threading.Semaphore(self.per_peer)
                    self.holders.append(peer)


__all__ = ["REFRESH_EVERY", "PeerSession"]
