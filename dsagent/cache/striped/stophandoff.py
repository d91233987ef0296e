"""What an agent told to stop does first: hand its stripe shares to their new owners
(docs/design-striping.md#churn).

Who calls it: ``dsagent serve`` (:mod:`dsagent.nodeagent.serve`) on SIGTERM, through the service's
:attr:`dsagent.cache.service.CacheService.handoff`; the service refuses new tasks and the API
fails readiness while :attr:`StripeHandoff.stopping`. What it owns: the hand-off's loop and
its two log lines. The rule it applies each turn is the pure
:func:`dsagent.cache.striped.handoff.handoff_verdict`; whether the node is leaving at all is asked of
cluster mode (``ServiceHooks.node_leaving``): a node that stays ends the hand-off at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dsagent.cache.servicehooks import NodeLeaving
from dsagent.cache.settings import Settings
from dsagent.cache.striped.handoff import HandoffEnd, HandoffWindows, handoff_verdict
from dsagent.cache.striped.stripes import StripeShares

log = logging.getLogger("dsagent")


class StripeHandoff:
    """The stop-time hand-off of this node's stripe share bundles."""

    def __init__(
        self, settings: Settings, stripes: StripeShares, clock: Callable[[], float], leaving: NodeLeaving | None
    ) -> None:
        self.windows = HandoffWindows.of(
            settings.stripe_handoff_grace, settings.stripe_handoff_idle, settings.stripe_handoff_first_contact
        )
        self._stripes, self._clock, self._leaving = stripes, clock, leaving
        self.stopping = False  # told to stop, handing its stripe shares off (:meth:`run`)

    def wanted(self) -> bool:
        """Whether a stop now would keep serving share bundles first (:meth:`run`): the
        hand-off is on, and this node serves share bundles to peers."""
        since = self._clock()
        verdict = handoff_verdict(
            now=since, since=since, last_fetch=None, bundles_held=self._stripes.bundles_served(), windows=self.windows
        )
        return verdict is None

    async def run(self, interrupted: Callable[[], bool], *, poll: float = 0.2) -> HandoffEnd:
        """Told to stop: take no new task (readiness fails) but keep serving this node's share
        bundles to the peers moving them, until the hand-off rule says to stop, or
        ``interrupted()`` (a second signal). Logs one line as it starts and one as it ends."""
        self.stopping = True
        windows, fetches, shares = self.windows, self._stripes.peer_fetches, self._stripes
        since, sent_before = self._clock(), fetches.sent
        if self._leaving is not None and await self._leaving() is False:  # a restart on a node that stays
            log.info("stopping: %s", HandoffEnd.STAYING.value)
            return HandoffEnd.STAYING
        log.info(
            "stopping: serving %d stripe share bundles to their new owners first (at most %.0f s; "
            "stops once they are released, or no peer asked for %.0f s after the first %.0f s; a second signal "
            "stops it now)",
            shares.bundles_served(), windows.grace, windows.idle, windows.first_contact,
        )  # fmt: skip
        while True:
            now = self._clock()
            verdict = HandoffEnd.SIGNALLED if interrupted() else None
            verdict = verdict or handoff_verdict(
                now=now, since=since, last_fetch=fetches.last(now), bundles_held=shares.bundles_served(),
                windows=windows,
            )  # fmt: skip
            if verdict is not None:
                log.info(
                    "stripe hand-off ended after %.1f s: %s; %d bundles sent to peers, %d still held",
                    now - since, verdict.value, fetches.sent - sent_before, shares.bundles_served(),
                )  # fmt: skip
                return verdict
            await asyncio.sleep(poll)


__all__ = ["StripeHandoff"]
