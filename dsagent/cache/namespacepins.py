"""A namespace's share of this node's cache, reserved when its pin is admitted
(docs/operator-guide/tenancy.md).

Who calls it: :class:`dsagent.cache.service.CacheService` admits each new task that acts
for a namespace (:meth:`NamespacePins.admit`, under its submit lock) and drops a task's
reservations when it is released; :class:`dsagent.cache.taskwork.TaskWork` settles a
reservation once the dataset's version resolves (:meth:`NamespacePins.settle`) and drops it
when the dataset fails. The rule itself is :func:`dsplatform.tenancy.over_share`, the one
the controller plans with.

What it owns: the reservations of the namespaces' pins not yet counted by the catalog, in
memory, one per (task, dataset). What a namespace holds is what its live tasks are bound
to in the catalog (exact, each version once) plus these reservations: a dataset whose
version is known at the size of that version, one still resolving at the size it was
admitted with. Each admission and each settling checks and reserves under one lock, so
tasks sent at once are counted against each other, never each against the same view.

The size a new pin is admitted with is the best known before any work: the size its
bundle store's manifest declares (its header line, one small read before the lock), else
that of a version from its source on this node, else ``DSAGENT_NAMESPACE_UNKNOWN_BYTES``
(at most the whole share): a pin of unknown size is admitted only where that much is left.
When the version resolves its real size replaces the reservation; if the namespace's share
cannot hold it then, the dataset fails with 403 ``namespace_share`` before it is bound or
fetched, and its reservation goes. After a restart the reservations are gone: bound
versions count through the catalog, and a dataset still resolving is settled as it resolves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dsagent.cache.node import Node
from dsagent.cache.space import Space
from dsagent.cache.task import DatasetRequest
from dsagent.errors import NamespaceShareExceeded
from dsagent.format.manifest import read_manifest_header
from dsagent.format.storageconfig import with_config
from dsplatform.tenancy import over_share
from dsplatform.units import format_size

log = logging.getLogger("dsagent")

#: (task id, dataset name)
Key = tuple[str, str]


@dataclass(frozen=True)
class _Reserved:
    namespace: str
    name: str
    source: str
    digest: str | None  # the version, once resolved
    size: int  # bytes of the namespace's share it takes


class NamespacePins:
    """The namespaces' reservations on this node; see the module's docstring."""

    def __init__(self, node: Node, space: Space) -> None:
        self.node, self.space = node, space
        self._reserved: dict[Key, _Reserved] = {}
        self._lock = asyncio.Lock()

    @property
    def enforced(self) -> bool:
        return self.node.settings.namespace_share < 1

    async def declared_sizes(self, requests: Sequence[DatasetRequest]) -> dict[str, int]:
        """The size each dataset's bundle store declares for it (its manifest's header), by
        name; a dataset without a store, or whose store cannot say now, is left out (its
        fetch will say why). Network reads: call it before taking any lock."""
        sizes: dict[str, int] = {}
        settings = self.node.settings
        for request in requests:
            bundles = request.bundles
            if bundles is None:
                continue
            options = with_config(request.storage_options, settings.storage_config, settings.egress_policy)
            try:
                # on the request checks' threads, as the location checks: never behind fetches
                header = await self.node.pools.check(
                    read_manifest_header, bundles, request.name, storage_options=options
                )
            except Exception as exc:  # unknown here; the fetch reports the store's failure
                log.debug("no declared size for %s at admission: %s", request.name, exc)
                continue
            sizes[request.name] = header.total_bytes
        return sizes

    async def admit(
        self,
        task_id: str,
        namespace: str,
        requests: Sequence[DatasetRequest],
        declared: Mapping[str, int],
        now: float,
    ) -> None:
        """Reserve a new task's datasets in ``namespace``'s share, or refuse the task
        (:class:`NamespaceShareExceeded`) with nothing reserved; ``declared``: sizes by name
        (:meth:`declared_sizes`)."""
        if not self.enforced:
            return
        async with self._lock:
            share, capacity = await self._limit()
            held, _ = await self._held(namespace, now)
            known = await self._known_sizes(requests)
            unknown = min(self.node.settings.namespace_unknown_bytes, int(share * capacity)) if capacity else 0
            sizes = {r.name: declared.get(r.name, known.get((r.name, r.source), unknown)) for r in requests}
            adding = sum(sizes.values())
            if over_share(held, adding, capacity, share):
                raise self._refused(namespace, held, adding, capacity, share, what="asks for")
            for request in requests:
                self._reserved[(task_id, request.name)] = _Reserved(
                    namespace, request.name, request.source, None, sizes[request.name]
                )

    async def settle(self, task_id: str, request: DatasetRequest, digest: str, size: int, now: float) -> None:
        """``task_id``'s dataset resolved to version ``digest`` of ``size`` bytes: that size
        takes its reservation's place, or (past the namespace's share) the reservation goes
        and :class:`NamespaceShareExceeded` is raised. A task acting for no namespace passes."""
        if not self.enforced:
            return
        async with self._lock:
            key = (task_id, request.name)
            before = self._reserved.get(key)
            namespace = (
                before.namespace
                if before is not None
                else await self.node.pools.db(self.node.catalog().tenant_of, task_id)
            )
            if namespace is None:
                return
            share, capacity = await self._limit()
            held, versions = await self._held(namespace, now, leaving_out=key)
            adding = 0 if (request.name, digest) in versions else size
            if over_share(held, adding, capacity, share):
                self._reserved.pop(key, None)
                raise self._refused(namespace, held, adding, capacity, share, what=f"resolved {request.name!r} to")
            self._reserved[key] = _Reserved(namespace, request.name, request.source, digest, size)

    def drop(self, task_id: str, name: str | None = None) -> None:
        """The reservations of ``task_id`` (of its dataset ``name`` only, when given) go."""
        for key in [k for k in self._reserved if k[0] == task_id and (name is None or k[1] == name)]:
            del self._reserved[key]

    # -- helpers --------------------------------------------------------------------------

    async def _limit(self) -> tuple[float, int | None]:
        capacity = (await self.space.report()).get("capacityBytes")
        return self.node.settings.namespace_share, capacity

    async def _held(self, namespace: str, now: float, *, leaving_out: Key | None = None) -> tuple[int, set[Key]]:
        """Bytes ``namespace`` holds now, and the versions among them: what its live tasks
        are bound to (each version once), then its reservations, a resolved one at its
        version's size unless that version is counted already, one still resolving at the
        size it was admitted with (once per dataset and source). ``leaving_out``: a
        reservation, and that task's binding of that dataset, being settled anew."""
        rows = await self.node.pools.db(self.node.catalog().tenant_holdings, namespace, now)
        versions: dict[Key, int] = {}
        for task_id, name, digest, size in rows:
            if (task_id, name) != leaving_out:
                versions[(name, digest)] = size
        resolving: dict[tuple[str, str], int] = {}
        for key, reserved in self._reserved.items():
            if reserved.namespace != namespace or key == leaving_out:
                continue
            if reserved.digest is None:
                ident = (reserved.name, reserved.source)
                resolving[ident] = max(resolving.get(ident, 0), reserved.size)
            else:
                versions.setdefault((reserved.name, reserved.digest), reserved.size)
        return sum(versions.values()) + sum(resolving.values()), set(versions)

    async def _known_sizes(self, requests: Sequence[DatasetRequest]) -> dict[tuple[str, str], int]:
        """The size of a version on this node from each request's source (the largest)."""
        wanted = {(r.name, r.source) for r in requests}
        sizes: dict[tuple[str, str], int] = {}
        for row in await self.node.pools.db(self.node.catalog().versions):
            ident = (row.name, row.source)
            if ident in wanted:
                sizes[ident] = max(sizes.get(ident, 0), row.size_bytes)
        return sizes

    def _refused(
        self, namespace: str, held: int, adding: int, capacity: int | None, share: float, *, what: str
    ) -> NamespaceShareExceeded:
        self.node.metrics.namespace_refusal(namespace)
        return NamespaceShareExceeded(
            f"namespace {namespace!r} holds {format_size(held)} of this node's cache and {what}"
            f" {format_size(adding)} more: over its share ({share:.0%} of {format_size(capacity or 0)})",
            hint="release other warm-up, replica or preparation pins of the namespace, or raise the chart's"
            " tenancy.nodeShare",
            pinned=held,
            adding=adding,
            capacity=capacity,
        )


__all__ = ["NamespacePins"]
