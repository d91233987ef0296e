"""The five ways a peer says "not now": the errors of the peer protocol, both sides.

Who calls it: the serving side raises :class:`PeerOverloaded` and :class:`PeerBusy` (the
upload limits, :mod:`dsagent.cache.peers.uploads`) and :class:`BundleInFlight`
(:mod:`dsagent.cache.service`, for a bundle this agent is downloading right now); the API's
error handler answers each with its status. The fetching side turns a peer's refusal into
:class:`PeerRefused` or :class:`PeerFetchingIt` (:mod:`dsagent.cache.peers.peerfetch`),
which never leave the fetch: they only say "ask the next source".

=============== ====== =============== =========================================
error           status code            meaning
=============== ====== =============== =========================================
PeerOverloaded  503    peer_overloaded this agent streams all the bundles it may
PeerBusy        429    peer_busy       it streams its share to the asking peer
BundleInFlight  425    peer_fetching   it is downloading that bundle: ask again
PeerRefused     (503)  peer_refused    a peer answered 404: not held there
PeerFetchingIt  (503)  peer_refused    a peer answered 425, 429 or 503: later
=============== ====== =============== =========================================

All are :class:`dsagent.errors.TransientError` (exit 7, in the "Exit codes"
table). They live beside the peer code rather than in :mod:`dsagent.errors`, as error
classes do in this package (``tests/test_exit_codes.py`` walks every module): nothing
outside the peer protocol raises or catches them.
"""

from __future__ import annotations

from dsagent.errors import TransientError


class PeerBusy(TransientError):
    """This peer already streams its share of bundles to the asking agent."""

    http_status = 429
    code = "peer_busy"


class BundleInFlight(TransientError):
    """This agent is downloading that bundle right now: ask again shortly."""

    http_status = 425
    code = "peer_fetching"


class PeerOverloaded(TransientError):
    """This agent already streams as many bundles as it serves at once."""

    http_status = 503
    code = "peer_overloaded"


class PeerRefused(TransientError):
    """A peer refused a bundle (busy, overloaded, not held): ask the next, keep it for later ones."""

    code = "peer_refused"


class PeerFetchingIt(PeerRefused):
    """A peer answered 425 (it is downloading that bundle right now), or 429 / 503 (it holds
    it but serves as many streams as it may): ask it again shortly."""


__all__ = ["BundleInFlight", "PeerBusy", "PeerFetchingIt", "PeerOverloaded", "PeerRefused"]
