"""Whether a striped version a pod asks for is one no stripe group will hold again.

Who calls it: :class:`dsagent.cache.striped.stripes.StripeShares`, when this node holds no share of
the version a reader or ``dsctl stripe wait`` asks for (``GET /v1/stripes/<name>/<digest>``
and its bundles). What it owns: the store's current version of a name, read from the
manifest's header line only and kept a few seconds, and the rule
(docs/design-striping.md#superseded):

A pod is admitted with the version its Dataset had then (the webhook pins the digest); the
controller holds only the Dataset's current version, and the store keeps one manifest per
name. So when this node holds a share of another version of the same name (the controller
holds it here: the node runs the Dataset's pods) and the store's manifest is not the version
asked for either, that version is gone: waiting would last for ever, so the answer is
:class:`~dsagent.errors.Superseded` (410). Anything less certain (no other share here, the
store unreadable, the store still at the version asked for) stays "not held yet" (404): the
caller waits, bounded by its own timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from dsagent.cache.pools import Pools
from dsagent.errors import DsagentError, Superseded
from dsagent.format.manifest import read_manifest_header
from dsagent.format.storageconfig import Options

#: Seconds the store's current version of a name is trusted before it is read again.
CURRENT_FOR = 10.0


class HeldVersion(Protocol):
    """What the check needs of a share held here: its store and storage options."""

    store: str
    storage_options: Options


class CurrentVersions:
    def __init__(self, pools: Pools, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.pools, self.clock = pools, clock
        self._current: dict[tuple[str, str], tuple[float, str]] = {}  # (store, name) -> (read at, digest)

    async def check(self, name: str, digest: str, others: Iterable[HeldVersion]) -> None:
        """Raise :class:`Superseded` when ``name@digest`` is gone for good; ``others``: the
        shares of other versions of ``name`` this node holds (none: nothing is known)."""
        held = next(iter(others), None)
        if held is None:
            return
        current = await self._current_digest(name, held)
        if current is not None and current != digest:
            raise Superseded(
                f"{name}@{digest[:12]} was superseded: the store holds {name}@{current[:12]} now",
                hint="create the pod again to read the current version",
                current=current,
            )

    async def _current_digest(self, name: str, held: HeldVersion) -> str | None:
        now = self.clock()
        found = self._current.get((held.store, name))
        if found is None or now - found[0] >= CURRENT_FOR:
            try:
                header = await self.pools.work(
                    read_manifest_header, held.store, name, storage_options=held.storage_options
                )
            except DsagentError:
                return None  # unknown: the caller goes on waiting, as for a share not held yet
            found = self._current[(held.store, name)] = (now, header.digest)
        return found[1]


__all__ = ["CURRENT_FOR", "CurrentVersions"]
