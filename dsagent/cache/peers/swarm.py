"""Starting together: one version fetched by many agents at once, bundle by bundle.

Who calls it: :func:`dsagent.cache.fetch.fetch_bundles`, given a :class:`PeerSwarm` by
:mod:`dsagent.cache.versions` when peers are on. What it owns: the order of the rounds
(docs/design.md#peers, "Starting together").

A job's pods start on many cold nodes at once, so a swarm of agents fetches the same new
version. Agents fetching it also count each other as holders (their inventories list it as
fetching), looked for again every few seconds. Each takes the bundles in its own rotation
(:attr:`PeerSwarm.offset`, from its node name), marks the one it works on
(:meth:`dsagent.cache.peers.peerfetch.PeerFetcher.claim`), and asks the others first: a
peer that has it sends it, a peer downloading it answers 425 and the bundle is put off to a
second round, where the agent waits up to ``peer_wait`` for that peer before reading the
store. Two agents asking each other for the same bundle at the same moment settle it by
:func:`dsagent.cache.peers.peerfetch.precedes` (a hash of node name and bundle: the one first
downloads, and which one that is differs from bundle to bundle). So ~one agent reads each
bundle from the store however many start together, and the reads spread over them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from dsagent.cache.fetchlinks import DEFAULT_ROUTE, Lease
from dsagent.cache.peers.peerfetch import PeerFetcher
from dsagent.cache.peers.peersession import PeerSession
from dsagent.cache.progress import FetchProgress
from dsagent.format.manifest import BundleRef, Manifest


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

    def unpack(
        self,
        bundle: BundleRef,
        index: int,
        *,
        second: bool,
        from_store: Callable[[], None],
        lease: Lease = DEFAULT_ROUTE,
        writers: int = 1,
    ) -> bool:
        """Bring ``bundle`` in from a peer or the store; False: put off (another agent downloads it).
        A bundle brought in stays claimed until :meth:`recorded`. Peers are asked over ``lease``'s
        link; ``writers`` threads write a peer's bundle's files."""
        fetcher = self.fetcher
        if not second:
            self.session.maybe_refresh()
            with fetcher.claim(bundle.digest, "asking") as claim:
                outcome = fetcher.fetch(
                    self.session, self.manifest, bundle, index, self.staging, self.progress, lease=lease,
                    writers=writers,
                )  # fmt: skip
                if outcome == "fetching" or (outcome == "none" and not claim.downloading()):
                    return False  # another agent downloads it: the second round waits for it
                if outcome == "none":
                    from_store()
                claim.finished()
            return True
        outcome = fetcher.fetch(
            self.session,
            self.manifest,
            bundle,
            index,
            self.staging,
            self.progress,
            wait=fetcher.settings.peer_wait,
            lease=lease,
            writers=writers,
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


__all__ = ["PeerSwarm"]
