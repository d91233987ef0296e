"""When an agent told to stop may go: the stripe hand-off rule, a pure function of its inputs
(docs/design-striping.md#churn).

Who calls it: :meth:`dsagent.cache.striped.stophandoff.StripeHandoff.run`, which ``dsagent serve``
runs on SIGTERM when this node holds stripe share bundles, and which gathers the inputs
(the clock, the bundles held, the peers' fetches counted by :class:`PeerFetches`) and
applies the answer. Nothing here touches the disk or reads the clock; ``now`` is passed in.

The rule: a leaving node's share moves to its new owners over the peer protocol, and the
controller releases it (``DELETE``) once they are complete. Until then the agent keeps
serving. It stops waiting when it holds no share bundle any more (released, or none to
begin with), when no peer has asked for one for the idle window after the first-contact
window has passed since the signal (peers start asking only at the controller's next pass),
or when the bound has passed, whatever the peers do. Before all that, the service asks
whether its node is leaving at all (``ServiceHooks.node_leaving``): one that stays ends the
hand-off as :data:`HandoffEnd.STAYING`.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass


class HandoffEnd(enum.Enum):
    """Why the hand-off ends (its value: the log's words)."""

    OFF = "the hand-off is off (DSAGENT_STRIPE_HANDOFF_GRACE=0)"
    STAYING = "its node is not leaving: the shares stay on its disk for the agent that replaces it"
    NOTHING_HELD = "it holds no stripe share bundle"
    NO_PEER = "no peer asked for a bundle within the first-contact window"
    IDLE = "no peer asked for a bundle for the idle window"
    BOUND = "the hand-off bound passed"
    SIGNALLED = "a second signal"


@dataclass(frozen=True)
class HandoffWindows:
    """The rule's settings, in seconds: the bound (0: no hand-off), the idle window, and the
    first-contact window (at least the idle window)."""

    grace: float
    idle: float
    first_contact: float

    @classmethod
    def of(cls, grace: float, idle: float, first_contact: float | None = None) -> HandoffWindows:
        """The windows from the settings: ``first_contact`` None is twice the idle window."""
        contact = 2 * idle if first_contact is None else first_contact
        return cls(grace=max(0.0, grace), idle=idle, first_contact=max(contact, idle))


def handoff_verdict(
    *, now: float, since: float, last_fetch: float | None, bundles_held: int, windows: HandoffWindows
) -> HandoffEnd | None:
    """None to keep serving the peers, else why to stop now.

    ``since``: when the stop signal came; ``last_fetch``: when a peer last asked for a share
    bundle (``now`` while one is being sent; None: never); ``bundles_held``: the share
    bundles this node still serves to peers.
    """
    if windows.grace <= 0:
        return HandoffEnd.OFF
    if bundles_held <= 0:
        return HandoffEnd.NOTHING_HELD
    if now - since >= windows.grace:
        return HandoffEnd.BOUND
    if now - since < windows.first_contact:
        return None
    if last_fetch is None or last_fetch < since:
        return HandoffEnd.NO_PEER  # nobody came since the signal, and a first-contact window has passed
    if now - last_fetch >= windows.idle:
        return HandoffEnd.IDLE
    return None


class PeerFetches:
    """Peers' fetches of this node's share bundles: when one last asked, the streams open
    now, the bundles sent whole. Called from the event loop and from the threads that
    stream (hence the lock); times are passed in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: float | None = None
        self._open = 0
        self.sent = 0

    def asked(self, now: float) -> None:
        """A peer asked for a share bundle, found here: a stream may start (end it with :meth:`ended`)."""
        with self._lock:
            self._last, self._open = now, self._open + 1

    def ended(self, now: float, sent: bool) -> None:
        """The stream :meth:`asked` began ended (``sent``: whole), or never started (busy)."""
        with self._lock:
            self._last, self._open = now, max(0, self._open - 1)
            self.sent += sent

    def last(self, now: float) -> float | None:
        """When a peer last asked: ``now`` while a stream is open, None if none ever did."""
        with self._lock:
            return now if self._open else self._last


__all__ = ["HandoffEnd", "HandoffWindows", "PeerFetches", "handoff_verdict"]
