"""Node: the node's shared state, which the service builds once and hands to its parts.

Who calls it: :class:`dsagent.cache.service.CacheService` builds one :class:`Node` and passes
it to :class:`dsagent.cache.space.Space` and :class:`dsagent.cache.versions.Versions`, which
each take it plus only what is specific to them.
What it owns: nothing; it holds references. Each collaborator keeps its own rules (the
threads in :mod:`dsagent.cache.pools`, the paths in :mod:`dsagent.cache.layout`, ...); this
only names the set that every part of the node service shares, so a constructor does not
list it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dsagent.cache.catalog import Catalog
from dsagent.cache.claims import Claims
from dsagent.cache.flights import Flights
from dsagent.cache.layout import Store
from dsagent.cache.metrics import Metrics
from dsagent.cache.pools import Pools
from dsagent.cache.progress import ProgressBoard
from dsagent.cache.settings import Settings
from dsagent.policy.copies import ClusterCopies


@dataclass(frozen=True)
class Node:
    """The collaborators of one node's cache service, shared by all its parts."""

    settings: Settings
    pools: Pools
    #: the catalog, once :meth:`dsagent.cache.service.CacheService.start` has opened it
    catalog: Callable[[], Catalog]
    store: Store
    clock: Callable[[], float]
    metrics: Metrics
    claims: Claims
    flights: Flights
    progress: ProgressBoard
    #: other nodes' ready copies, as cluster mode last read them (docs/design.md#cluster-eviction)
    copies: ClusterCopies = field(default_factory=ClusterCopies)


__all__ = ["Node"]
