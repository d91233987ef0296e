"""Which of this node's bundles a peer may be served, pinned against eviction while it streams.

Who calls it: the peer server (:class:`dsagent.cache.peers.PeerServer`) through the two
callables :class:`dsagent.cache.service.CacheService` hands it (:meth:`BundleLocator.locate`,
:meth:`BundleLocator.unpin`). It owns the manifests of the versions it serves from, kept in
memory while those versions are ready or being fetched (docs/design.md#peers).
"""

from __future__ import annotations

import asyncio

from dsagent.cache.node import Node
from dsagent.cache.peers import BundleInFlight, PeerFetcher, ServedBundle, find_bundle
from dsagent.cache.space import Space
from dsagent.cache.striped.stripes import StripeShares
from dsagent.cache.versions import Versions
from dsagent.format.manifest import Manifest

Key = tuple[str, str]


class BundleLocator:
    def __init__(
        self, node: Node, *, space: Space, versions: Versions, stripes: StripeShares, peers: PeerFetcher
    ) -> None:
        self.node, self._space, self._versions, self._stripes, self._peers = node, space, versions, stripes, peers
        self._manifests: dict[Key, Manifest] = {}  # served versions' manifests
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the service at start

    async def locate(self, digest: str, peer: str, reader: bool = False) -> ServedBundle | None:
        """Where bundle ``digest`` can be served from, pinned against eviction: a ready version
        holding it, else a version being fetched that finished it (its files are in place in
        the staging directory, verified and synced), else this node's stripe share;
        :class:`BundleInFlight` when this agent is downloading it for ``peer`` to wait for, or
        owns it in a stripe share still filling (:meth:`StripeShares.pending`: a share held
        ``storeOnDemand`` only when ``reader``, the peer saying a reader waits for it)."""
        node, db = self.node, self.node.pools.db
        async with self._space.lock:
            keys = [((r.name, r.digest), r.state == "ready") for r in await db(node.catalog().versions)]
            ready = [key for key, is_ready in keys if is_ready]
            fetching = [key for key, is_ready in keys if not is_ready and node.flights.is_fetching(key)]
            live = {*ready, *fetching}
            for key in [k for k in self._manifests if k not in live]:
                del self._manifests[key]
            found = find_bundle(await self._manifests_of(ready), digest)
            if found is not None:
                key, members = found
                ready_dir = node.store.ready_dir(*key)
                if await node.pools.work(ready_dir.is_dir):
                    self._space.pin([key])
                    return ServedBundle(key, ready_dir, members)
            for key, manifest in await self._manifests_of(fetching):
                in_fetch = find_bundle([(key, manifest)], digest)
                if in_fetch is None or digest not in await db(node.catalog().bundles_done, *key):
                    continue
                self._space.pin([key])  # published mid-stream: then it is a ready version like the others
                return ServedBundle(key, node.store.staging_dir(*key), in_fetch[1], node.store.ready_dir(*key))
        striped = await self._stripes.locate(digest)
        if striped is not None:
            return striped
        if self._peers.in_flight(digest, peer):
            raise BundleInFlight(
                f"this agent is downloading bundle {digest} now", hint="ask again shortly, or read the store"
            )
        if self._stripes.pending(digest, reader=reader):
            raise BundleInFlight(
                f"this agent's stripe share owns bundle {digest} and is fetching it", hint="ask again shortly"
            )
        return None

    async def _manifests_of(self, keys: list[Key]) -> list[tuple[Key, Manifest]]:
        """The stored manifests of versions ``keys`` (kept in memory while they are served)."""
        found: list[tuple[Key, Manifest]] = []
        for key in keys:
            if key not in self._manifests:
                manifest = await self._versions.stored_manifest(*key)
                if manifest is None:
                    continue
                self._manifests[key] = manifest
            found.append((key, self._manifests[key]))
        return found

    def unpin(self, key: Key) -> None:
        """Called from the thread that streamed the bundle: unpin on the loop."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._space.unpin, [key])


__all__ = ["BundleLocator"]
