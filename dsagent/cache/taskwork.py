"""The work a task's datasets need, from asked for to ready: one named step each.

Who calls it: :class:`dsagent.cache.service.CacheService` alone, which admits and records a
task (:meth:`~dsagent.cache.service.CacheService.submit_task`) and then hands each of its
datasets here; its reports read what this module keeps, and releasing a task cancels its work.
What it owns, per (task, dataset): the running work, the last failure and the start check;
the hand-overs of prepared tasks; and the signal that some dataset of some task settled, for callers that wait on a task
(:meth:`TaskWork.changed`).

The route of one dataset, each step a method named once (docs/design.md#rules), begun by
:meth:`TaskWork.start_task` for each dataset of a task (a task prepared here beforehand is
handed its preparation's work):

1. :meth:`TaskWork.start`: the work begins unless it runs or its version is ready (rule 1);
2. :meth:`TaskWork.serve`: the steps below in order, a failure kept for the record;
3. :meth:`TaskWork.version`: the version the task means (the one it is bound to, else the
   source's current one, resolved once per request identity), whose real size then takes
   the place of what the task reserved of its namespace's share (:meth:`TaskWork.settle_share`);
4. :meth:`TaskWork.bind`: the task held to that version (claims, then the catalog);
5. :meth:`TaskWork.fetch`: that version fetched and made ready, once per version however
   many tasks wait for it (rule 6; :meth:`dsagent.cache.versions.Versions.fetch`);
6. :meth:`TaskWork.check`: a version prepared for the task checked on disk before the task
   is told it is ready (docs/design.md#next-job-preparation);
7. :meth:`TaskWork.fail`: a failure kept, counted by code and logged once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from dsagent.cache import ready
from dsagent.cache.fetch import Source
from dsagent.cache.node import Node
from dsagent.cache.space import Space
from dsagent.cache.task import DatasetRequest, redact_url
from dsagent.cache.versions import Versions
from dsagent.errors import DsagentError, IntegrityError, NamespaceShareExceeded, is_full_disk, local_write_error
from dsagent.format.manifest import Manifest
from dsagent.format.storage_errors import classify
from dsagent.format.storageconfig import with_config
from dsagent.policy.eviction import Candidate

if TYPE_CHECKING:
    from dsagent.cache.namespacepins import NamespacePins
    from dsagent.cache.prepared import Preparations

log = logging.getLogger("dsagent")
START_RULE_RECHECK = 30.0  # seconds between rechecks of a task the start rule holds, besides each release

#: (task id, dataset name)
Key = tuple[str, str]


class TaskWork:
    """The datasets' work of every task on this node; see the module's docstring."""

    def __init__(self, node: Node, versions: Versions, space: Space) -> None:
        self.node = node
        self.versions = versions
        self.space = space
        self.preparations: Preparations | None = None  # set by the service once built
        self.pins: NamespacePins | None = None  # the namespaces' shares, set by the service
        self.running: dict[Key, asyncio.Task[None]] = {}
        self.errors: dict[Key, DsagentError] = {}
        self.handovers: set[asyncio.Task[None]] = set()  # prepared tasks taking over their preparation
        self.checking: set[Key] = set()  # under the start check
        self._settled = asyncio.Event()

    # -- the route ------------------------------------------------------------------------

    async def start_task(
        self, task_id: str, requests: Sequence[DatasetRequest], bound: Mapping[str, str | None]
    ) -> None:
        """Each of ``requests`` started (``bound``: the version each dataset's name is bound
        to); a task prepared on this node beforehand (docs/design.md#next-job-preparation) is
        handed the preparation's work."""
        for request in requests:
            await self.start(task_id, request, bound.get(request.name))
        preparations = self.preparations
        if preparations is not None and preparations.get(task_id) is not None:  # the prepared task arrived
            handover = asyncio.create_task(
                preparations.hand_over(task_id, self.of_task(task_id)), name=f"dsagent-handover-{task_id}"
            )
            self.handovers.add(handover)
            handover.add_done_callback(self.handovers.discard)

    async def start(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        """Step 1: begin the work ``request`` still needs for ``task_id``, unless it runs or
        the version the task is bound to is ready (docs/design.md#rule-1: a repeated request
        starts no new work)."""
        current = self.running.get((task_id, request.name))
        if current is not None and not current.done():
            return
        if bound is not None:
            row = await self.node.pools.db(self.node.catalog().version, request.name, bound)
            if row is not None and row.state == "ready":
                return
        self.resume(task_id, request, bound)

    def resume(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        """Run :meth:`serve` for ``request`` now (start-up resumes interrupted fetches here)."""
        self.errors.pop((task_id, request.name), None)
        self.node.claims.ask(task_id, request.identity)  # protected from now on, once its digest is known
        work = asyncio.create_task(self.serve(task_id, request, bound), name=f"dsagent-task-{task_id}-{request.name}")
        work.add_done_callback(lambda _: self._signal())
        self.running[(task_id, request.name)] = work

    async def serve(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        """Step 2: one dataset of one task through :meth:`version`, :meth:`fetch` and
        :meth:`check`; an error is kept for the task's record (:meth:`fail`)."""
        # every filesystem built for this dataset (source, bundle store) gets the storage
        # bounds of the settings, beside its options (dsagent.format.storageconfig)
        options = with_config(
            request.storage_options, self.node.settings.storage_config, self.node.settings.egress_policy
        )
        source = Source(request.source, request.bundles, options)
        try:
            manifest, cached = await self.version(task_id, request, source, bound)
            if not cached:
                await self.fetch(source, manifest)
            if self.preparations is not None and (manifest.name, manifest.digest) in self.preparations.prepared_keys(
                task_id
            ):
                await self.check(task_id, request.name, source, manifest)
        except asyncio.CancelledError:
            raise
        except DsagentError as exc:
            self.fail(task_id, request, exc)
        except Exception as exc:  # a foreign storage error, or a bug: keep it visible, never crash the loop
            what = f"dataset {request.name!r}"
            if isinstance(exc, OSError) and self._on_cache_disk(exc):
                known: DsagentError | None = local_write_error(exc, what)  # the node's disk, not the source
            else:
                known = classify(exc, what)
            if known is not None:
                self.fail(task_id, request, known)
                return
            log.exception("caching %s for task %s failed", request.name, task_id)
            self.fail(task_id, request, DsagentError(f"internal error: {type(exc).__name__}: {exc}"), logged=True)
        else:
            self.node.metrics.request_settled("ok")

    async def version(
        self, task_id: str, request: DatasetRequest, source: Source, bound: str | None
    ) -> tuple[Manifest, bool]:
        """Step 3: the version ``task_id`` means by ``request``, and whether resolving it
        cached it already (a per-file copy digests while it copies).

        A task keeps the version it was bound to (docs/design.md#rule-1), unless that
        version's fetch was abandoned (an integrity failure, a full disk: its staging is
        gone): then the source is resolved again, so a repeated request after "the source
        changed while caching" gets the source as it is now, not the stale version again."""
        stored = await self._bound_manifest(request.name, bound)
        if stored is not None:
            self.node.claims.drop(task_id, request.name)  # the catalog binding protects it
            return stored, False
        flight = ("resolve", *request.identity, request.allow_per_file)
        manifest, cached = await self.node.flights.join(flight, self._resolve, request, source)
        await self.settle_share(task_id, request, manifest)
        await self.bind(task_id, request, manifest.digest)
        return manifest, cached

    async def settle_share(self, task_id: str, request: DatasetRequest, manifest: Manifest) -> None:
        """Step 3b: the version's real size takes the place of what the task reserved of its
        namespace's share at admission (docs/operator-guide/tenancy.md); past the share the
        dataset fails with ``namespace_share`` here, before it is bound or fetched, and
        claims nothing any more."""
        if self.pins is None:
            return
        try:
            await self.pins.settle(task_id, request, manifest.digest, manifest.total_bytes, self.node.clock())
        except NamespaceShareExceeded:
            self.node.claims.drop(task_id, request.name)
            raise

    async def bind(self, task_id: str, request: DatasetRequest, digest: str) -> None:
        """Step 4: ``task_id`` held to version ``digest`` of ``request``'s dataset."""
        self.node.claims.hold(task_id, request.identity, digest)
        await self.node.pools.db(self.node.catalog().bind, task_id, request.name, digest)
        self.node.claims.drop(task_id, request.name)  # from here the catalog's binding protects it

    async def fetch(self, source: Source, manifest: Manifest) -> None:
        """Step 5: ``manifest``'s version fetched and made ready, one fetch per version
        however many tasks wait for it (docs/design.md#rule-6)."""
        await self.node.flights.join(("fetch", manifest.name, manifest.digest), self.versions.fetch, source, manifest)

    async def check(self, task_id: str, name: str, source: Source, manifest: Manifest) -> None:
        """Step 6, the start check (docs/design.md#next-job-preparation): a version prepared
        for ``task_id`` is checked on disk against its manifest before the task is told it
        is ready; a copy that fails is evicted and fetched again."""
        key = (manifest.name, manifest.digest)
        store = self.node.store
        self.checking.add((task_id, name))
        try:
            try:
                await self.node.pools.work(ready.check_complete, store.ready_dir(*key), manifest)
            except IntegrityError as exc:
                log.warning("prepared copy of %s failed the start check; fetching it again: %s", name, exc)
                async with self.space.lock:
                    victim = Candidate(*key, store.allocated(manifest.total_bytes, manifest.file_count), 0.0)
                    await self.space.evict_one(victim, reason="start-check", force=True)
                await self.fetch(source, manifest)
            await self.start_rule(task_id, name)
        finally:
            self.checking.discard((task_id, name))

    async def start_rule(self, task_id: str, name: str) -> None:
        """Hold a prepared task (still ``checking``) while the running tasks' data plus its own
        exceed the second threshold (:meth:`Preparations.start_hold`), rechecked each time a
        task releases its data and at least every :data:`START_RULE_RECHECK` seconds."""
        preparations, said = self.preparations, False
        while preparations is not None:
            reason = await preparations.start_hold(task_id)
            if reason is None:
                if said:
                    log.info("task %s: dataset %s starts (start rule met)", task_id, name)
                return
            if not said:
                log.info("task %s: dataset %s held: %s", task_id, name, reason)
                said = True
            await preparations.released(START_RULE_RECHECK)

    def fail(self, task_id: str, request: DatasetRequest, exc: DsagentError, *, logged: bool = False) -> None:
        """Step 7: keep a dataset's failure for its task, count it by code, and log it once at
        WARNING with code, task, dataset and source (passwords in URLs redacted; storage
        options never logged), so that no failed task goes without a warning line."""
        self.errors[(task_id, request.name)] = exc
        self.node.metrics.request_settled(exc.code)
        if self.pins is not None:  # a failed dataset holds nothing of its namespace's share
            self.pins.drop(task_id, request.name)
        if not logged:
            source, bundles = redact_url(request.source), redact_url(request.bundles)
            log.warning(
                "dataset failed: code=%s task=%s dataset=%s source=%s bundles=%s: %s",
                exc.code,
                task_id,
                request.name,
                source,
                bundles,
                exc,
                # the same facts as fields of a JSON log line (DSAGENT_LOG_FORMAT=json)
                extra={"code": exc.code, "task": task_id, "dataset": request.name, "source": source}
                | {"bundles": bundles},
            )

    # -- what the service asks of the work ---------------------------------------------------

    def of_task(self, task_id: str) -> list[asyncio.Task[None]]:
        """The work of ``task_id`` still running."""
        return [t for (tid, _), t in self.running.items() if tid == task_id and not t.done()]

    def working(self, task_id: str, name: str) -> bool:
        """Whether ``task_id``'s work on dataset ``name`` runs."""
        work = self.running.get((task_id, name))
        return work is not None and not work.done()

    def busy_tasks(self) -> set[str]:
        """The tasks with work running."""
        return {tid for (tid, _), work in self.running.items() if not work.done()}

    def busy_datasets(self) -> set[str]:
        """The dataset names some task's work runs on."""
        return {name for (_, name), work in self.running.items() if not work.done()}

    def failed_tasks(self) -> set[str]:
        """The tasks with a dataset that failed."""
        return {tid for (tid, _) in self.errors}

    async def wait(self, task_id: str, timeout: float) -> None:
        """Until ``task_id``'s running work ends, at most ``timeout`` seconds."""
        running = self.of_task(task_id)
        if running:
            await asyncio.wait(running, timeout=timeout)

    async def changed(self, timeout: float) -> None:
        """Until some dataset of some task settles (ready or failed), at most ``timeout``
        seconds: what a caller waiting on a task's state blocks on instead of polling."""
        settled = self._settled
        try:
            await asyncio.wait_for(settled.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def cancel(self, task_id: str) -> None:
        """End ``task_id``'s work and forget what it kept (its task is released)."""
        for key, work in list(self.running.items()):
            if key[0] == task_id:
                work.cancel()
                self.running.pop(key, None)
                self.errors.pop(key, None)

    def all_running(self) -> Iterable[asyncio.Task[None]]:
        """Every task's running work and hand-over, to cancel at a stop."""
        return [*self.running.values(), *self.handovers]

    # -- helpers --------------------------------------------------------------------------

    def _signal(self) -> None:
        """Wake every :meth:`changed` waiter; the next ones wait for the next settling."""
        self._settled.set()
        self._settled = asyncio.Event()

    async def _bound_manifest(self, name: str, bound: str | None) -> Manifest | None:
        """The stored manifest of the version a task is bound to, while it can still be fetched."""
        if bound is None:
            return None
        row = await self.node.pools.db(self.node.catalog().version, name, bound)
        if row is None:
            return None
        if row.state == "failed" and not await self.node.pools.work(self.node.store.staging_dir(name, bound).is_dir):
            return None  # abandoned (Versions.fetch removed its staging): resolve the source again
        return await self.versions.stored_manifest(name, bound)

    async def _resolve(self, request: DatasetRequest, source: Source) -> tuple[Manifest, bool]:
        resolved = await self.versions.resolve(request.name, source, allow_per_file=request.allow_per_file)
        self.node.claims.settle(request.identity, resolved[0].digest)  # every task waiting on this flight
        return resolved

    def _on_cache_disk(self, exc: OSError) -> bool:
        """Whether ``exc`` is the cache disk's failure (on a path under the root), not the
        source's: staging, publishing and finishing a version touch only the root. A full
        disk or quota always is, named or not (``fsync`` of a descriptor names no file): the
        agent writes nowhere else, so it is never "retry the source"."""
        if is_full_disk(exc):
            return True
        if not exc.filename:
            return False
        root = os.path.realpath(self.node.settings.root)
        return os.path.realpath(os.fsdecode(exc.filename)).startswith(root + os.sep)


__all__ = ["TaskWork"]
