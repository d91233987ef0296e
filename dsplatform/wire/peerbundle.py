"""What an agent asking a peer for a bundle says of why it asks. Version 1.

Writer: the asking agent (:meth:`dsagent.cache.peers.PeerFetcher.fetch_from`, for the bundles
of a striped version). Reader: the serving agent's ``GET /v1/peer/bundles/{digest}`` route
(:mod:`dsagent.api.routes`), which passes it to the lookup of the bundle
(:meth:`dsagent.cache.striped.servedbundles.BundleLocator.locate`).

- :data:`READER_HEADER` with the value :data:`READER_WAITS`: a reader waits for the bundle
  (the asking node's reader asked for it, or its share must have it before its pods start).
  A member that owns the bundle in a share held ``storeOnDemand`` and does not hold it yet
  then reads it from the store for the cluster (425 meanwhile: "ask again shortly").
  Without the header the ask is a background fill's: such a member answers 404 ("not
  here") and reads nothing, so that a version is read from the store only where it is read
  (docs/design-striping.md#agent).

Any other value, or none, counts as a fill's ask: an agent from before the header never
sends it, and one that sends something else gets the cautious answer. Pure: no I/O.
"""

from __future__ import annotations

#: the request header an asking agent sets when a reader waits for the bundle
READER_HEADER = "X-Dsagent-Reader-Waits"
#: its one value
READER_WAITS = "1"


def headers(reader: bool) -> dict[str, str]:
    """The headers to add to a peer bundle request: the marker when a reader waits, else none."""
    return {READER_HEADER: READER_WAITS} if reader else {}


def reader_waits(value: str | None) -> bool:
    """Whether a request's :data:`READER_HEADER` value (None: absent) says a reader waits."""
    return value is not None and value.strip() == READER_WAITS


__all__ = ["READER_HEADER", "READER_WAITS", "headers", "reader_waits"]
