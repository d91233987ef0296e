"""Peer-to-peer bundles: agents serving the bundles of their cached versions to each other,
and asking each other for bundles before the bundle store (docs/design.md#peers).

Who calls it: :class:`dsagent.cache.service.CacheService` (one :class:`PeerServer`, one
:class:`PeerFetcher`), :mod:`dsagent.cache.versions` and :mod:`dsagent.cache.fetch` (a
:class:`PeerSwarm` per version fetched). How an inventory lists a version (who holds it) is
:func:`dsagent.cache.inventory.holds`.
They import from here; the names below are re-exported from the modules that own them:

- :mod:`~dsagent.cache.peers.peerfetch`: the peer fetch, a bundle asked of the agents that
  hold it before the store (:class:`PeerFetcher`: finding holders, one bundle from one peer
  streamed into the unpacker, which bundles this agent works on, :func:`precedes`).
- :mod:`~dsagent.cache.peers.peersession`: one version's fetch from peers, which holder to
  ask for which bundle and which failed (:class:`PeerSession`).
- :mod:`~dsagent.cache.peers.swarm`: many agents starting the same version together, in two
  rounds (:class:`PeerSwarm`).
- :mod:`~dsagent.cache.peers.peerserver`: the serving side, a bundle of a cached version
  re-packed and streamed to a peer (:class:`PeerServer`, :class:`ServedBundle`,
  :func:`find_bundle`); the re-packing itself is :mod:`dsagent.format.bundles.repack`.
- :mod:`~dsagent.cache.peers.uploads`: the server's upload limits and per-peer bandwidth
  (:class:`UploadLimits`).
- :mod:`~dsagent.cache.peers.peererrors`: the five refusals of the peer protocol (425, 429,
  503 served; 404 and the others as the fetch sees them).
- :mod:`~dsagent.cache.peers.storeproxy`: bundle downloads through a store's configured
  proxy, the cluster's own P2P engine (:func:`bundle_options`).
"""

from dsagent.cache.peers.peererrors import BundleInFlight, PeerBusy, PeerFetchingIt, PeerOverloaded, PeerRefused
from dsagent.cache.peers.peerfetch import PEER_HEADER, Claim, Outcome, PeerFetcher, precedes
from dsagent.cache.peers.peerserver import PeerServer, ServedBundle, find_bundle
from dsagent.cache.peers.peersession import PeerSession
from dsagent.cache.peers.storeproxy import bundle_options
from dsagent.cache.peers.swarm import PeerSwarm
from dsagent.cache.peers.uploads import UploadLimits

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
    "precedes",
]
