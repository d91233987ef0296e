"""The next task's preparation carried out on this node (docs/design.md#next-job-preparation).

Who calls it: :class:`dsagent.cache.service.CacheService` owns one :class:`Preparations`
and calls it for ``PUT/GET/DELETE /v1/preparations/{task}`` (the Dataset controller asks;
an operator may too), from its idle sweep (lapsed leases) and when a task with a
preparation's id arrives (the hand-over). The pure decisions are the functions
:func:`~dsagent.policy.preparation.first_budget` and
:func:`~dsagent.policy.preparation.second_gate`; the class applies them with the service's
parts (the rules themselves are :mod:`dsagent.policy.preparation`'s, which the controller
plans with too). What it owns: the preparations' records (in memory; the controller renews each of
them every pass, so an agent restart loses at most one pass of them).

The switching design's phases, on a node's cache:

1. **Phase 1** (the design's environment set-up: little memory, several at once): the
   next task's manifests are read from the bundle store (not its data) and its missing
   bytes are reserved in :class:`~dsagent.cache.space.Space` under each version's key, up
   to the **first threshold** (``first`` x the cache's capacity, for every preparation on
   the node together): no new reservation starts once the total reaches it; one that
   starts below it reserves what is left below it. A reservation is what every fetch
   takes: free space for others excludes it, and making room for it evicts only versions
   no task uses (never the running task's data: :func:`dsagent.policy.eviction.plan_for_fetch`).
   The manifests say exactly what the task needs on this disk (bytes, files, blocks):
   the design's memory-matching model, without a model.
2. **Phase 2** (the design's memory allocation and data transfer): the controller asks
   once the current task's remaining sub-tasks are below its preset count
   (:mod:`dsagent.policy.preparation`). Here the **second threshold** marks: the data the
   running tasks hold (every remaining sub-task of theirs reads it) plus this task's
   bytes must stay within ``second`` x the capacity; when they do not, the preparation
   waits (state ``waiting``) until the running tasks release their data, rechecked on
   each renewal and each release. Then the bulk fetch runs as task ``prepare.<task>``
   (leases, resumes, peers: every task's machinery).
3. **The start check**: when the task itself arrives (a pod's own request with the
   preparation's id), each prepared version is checked on disk against its manifest
   (every file present with its size, :func:`dsagent.cache.ready.check_complete`) before
   the task is reported ready (state ``checking`` until then); a copy that fails is evicted
   and fetched again. Then the **start rule**: the running tasks' data plus the task's own
   must be within the second threshold (:func:`~dsagent.policy.preparation.start_gate`);
   while it is not, the task stays ``checking``, held until the running tasks release their
   data (:meth:`Preparations.start_hold`, rechecked on each release). The preparation is
   then handed over: its task and reservations go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsagent.cache.layout import Key
from dsagent.cache.task import DatasetRequest, iso, task_key
from dsagent.errors import Conflict, DsagentError, InsufficientSpace, InvalidInput, NotFound
from dsagent.policy.preparation import Thresholds, first_budget, second_gate, start_gate

log = logging.getLogger("dsagent")

# the presets' defaults are the policy's (one rule per fact): the first threshold, the share of
# the cache reserved for preparations together; the second, in use plus the bulk fetches
FIRST_THRESHOLD = Thresholds().reserve_fraction
SECOND_THRESHOLD = Thresholds().fill_fraction
START_RULE = "start rule"  # how a preparation held by the start rule says why


def prepare_task_id(task_id: str) -> str:
    """The agent task that holds a preparation's fetched data (phase 2)."""
    return f"prepare.{task_id}"


@dataclass
class Prepared:
    """One preparation: what it asked, what its manifests said, where it stands."""

    task_id: str
    requests: tuple[DatasetRequest, ...]
    first: float
    second: float
    tenant: str | None
    lease_until: float
    asked_phase: int = 1
    created_at: float = 0.0
    versions: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (digest, disk bytes)
    held: set[Key] = field(default_factory=set)  # versions ready here already
    reserved: dict[Key, int] = field(default_factory=dict)  # phase 1's reservations
    fetching: bool = False  # phase 2 started: task prepare.<id>
    waiting: str | None = None  # why it does not go on (a threshold)
    error: dict[str, Any] | None = None
    task_state: str | None = None  # phase 2's task: pending, ready, failed

    @property
    def missing_bytes(self) -> int:
        return sum(size for name, (digest, size) in self.versions.items() if (name, digest) not in self.held)

    @property
    def phase(self) -> int:
        return 2 if self.fetching else 1

    @property
    def state(self) -> str:
        if self.error is not None:
            return "failed"
        if self.fetching:
            return {"ready": "prepared", "failed": "failed"}.get(self.task_state or "", "fetching")
        if self.waiting is not None:
            return "waiting"
        if self.versions and not self.missing_bytes:
            return "prepared"
        return "reserved"


@dataclass(frozen=True)
class ServiceParts:
    """What a preparation uses of the service, as callables (no import cycle, testable)."""

    now: Callable[[], float]
    lease_ttl: float
    read_manifest: Callable[[DatasetRequest], Awaitable[tuple[str, int]]]  # -> (digest, disk bytes)
    is_ready: Callable[[Key], Awaitable[bool]]
    is_fetching: Callable[[Key], bool]
    capacity: Callable[[], Awaitable[int]]
    # data of live tasks, less these versions, and less the data of these tasks
    in_use_bytes: Callable[[set[Key], Sequence[str]], Awaitable[int]]
    reserve: Callable[[Key, int], Awaitable[None]]
    reservation: Callable[[Key], int | None]
    release_reservation: Callable[[Key], None]
    submit: Callable[[str, Sequence[DatasetRequest], str | None], Awaitable[str]]  # -> task state
    task_state: Callable[[str], Awaitable[str | None]]
    release_task: Callable[[str], Awaitable[None]]


class Preparations:
    """This node's preparations (see the module docstring)."""

    def __init__(self, parts: ServiceParts) -> None:
        self.parts = parts
        self._items: dict[str, Prepared] = {}
        self._lock = asyncio.Lock()
        self._released = asyncio.Event()  # set (and replaced) when a task released its data

    def get(self, task_id: str) -> Prepared | None:
        return self._items.get(task_id)

    def all(self) -> list[Prepared]:
        return sorted(self._items.values(), key=lambda p: (p.created_at, p.task_id))

    def reserved_keys(self) -> dict[Key, int]:
        out: dict[Key, int] = {}
        for p in self._items.values():
            for key, size in p.reserved.items():
                out[key] = out.get(key, 0) + size
        return out

    async def put(
        self,
        task_id: str,
        requests: Sequence[DatasetRequest],
        *,
        phase: int,
        first: float,
        second: float,
        tenant: str | None,
    ) -> Prepared:
        """Create or renew a preparation (idempotent per id; the request may not change);
        phase 1 at once, phase 2 when asked and the second threshold allows."""
        for request in requests:
            if not request.bundles:
                raise InvalidInput(
                    f"dataset {request.name!r} has no bundle store: only packed datasets are prepared",
                    hint="pack it (dsctl pack) and name its store in bundles",
                )
        now = self.parts.now()
        async with self._lock:
            prep = self._items.get(task_id)
            if prep is not None and sorted(r.identity for r in prep.requests) != sorted(r.identity for r in requests):
                raise Conflict(
                    f"preparation {task_id!r} already names other datasets",
                    hint="release it first (DELETE /v1/preparations/{task})",
                )
            if prep is None:
                prep = Prepared(
                    task_id, tuple(requests), first, second, tenant, now + self.parts.lease_ttl, created_at=now
                )
                self._items[task_id] = prep
            prep.lease_until = now + self.parts.lease_ttl
            prep.first, prep.second = first, second
            prep.asked_phase = max(prep.asked_phase, phase)
            await self._advance(prep)
            return prep

    async def _advance(self, prep: Prepared) -> None:
        try:
            if not prep.versions:
                for request in prep.requests:
                    prep.versions[request.name] = await self.parts.read_manifest(request)
            prep.held = {(n, d) for n, (d, _) in prep.versions.items() if await self.parts.is_ready((n, d))}
            for key in [k for k in prep.reserved if k in prep.held or self.parts.is_fetching(k)]:
                self._drop(prep, key)  # the fetch took the reservation over (and releases it when done)
            if not prep.fetching:
                await self._reserve(prep)
            if prep.asked_phase >= 2 and not prep.fetching:
                await self._start_fetch(prep)
            if prep.fetching:
                prep.task_state = await self.parts.submit(prepare_task_id(prep.task_id), prep.requests, prep.tenant)
        except DsagentError as exc:
            prep.error = exc.to_dict()
            log.warning("preparation %s failed: %s", prep.task_id, exc)
        else:
            prep.error = None

    async def _reserve(self, prep: Prepared) -> None:
        """Phase 1: reserve the missing bytes up to the first threshold."""
        capacity = await self.parts.capacity()
        # the preparations still in phase 1: one in phase 2 counts against the second threshold
        others = sum(
            size for p in self._items.values() if p is not prep and not p.fetching for size in p.reserved.values()
        )
        budget = first_budget(capacity, prep.first, others)
        prep.waiting = None
        for name, (digest, size) in prep.versions.items():
            key = (name, digest)
            if key in prep.held or key in prep.reserved or self.parts.is_fetching(key):
                continue
            if budget <= 0:
                prep.waiting = (
                    f"first threshold: preparations reserve {others} of {capacity} bytes (limit {prep.first:g})"
                )
                return
            amount = min(size, budget)
            try:
                await self.parts.reserve(key, amount)
            except InsufficientSpace as exc:
                prep.waiting = f"no space to reserve: {exc.message}"
                return
            prep.reserved[key] = amount
            budget -= amount
            others += amount

    async def _start_fetch(self, prep: Prepared) -> None:
        """Phase 2 once the second threshold allows (else ``waiting``, rechecked on renewals)."""
        capacity = await self.parts.capacity()
        mine = {(n, d) for n, (d, _) in prep.versions.items()}
        # the other bulk fetches, fetched or fetching, counted once: as prepared, not as in use
        prepared = {
            (n, d): size
            for p in self._items.values()
            if p is not prep and p.fetching
            for n, (d, size) in p.versions.items()
            if (n, d) not in mine
        }
        in_use = await self.parts.in_use_bytes(mine | set(prepared), ())
        others = sum(prepared.values())
        size = prep.missing_bytes
        if not second_gate(capacity, prep.second, in_use, others, size):
            prep.waiting = (
                f"second threshold: in use {in_use} + prepared {others} + this {size} bytes"
                f" > {prep.second:g} of {capacity}; waits for the running tasks to release their data"
            )
            return
        prep.waiting = None
        prep.fetching = True  # the fetch takes over the reservations (same version keys)

    async def refresh(self) -> None:
        """Recheck the waiting preparations (a task released its data) and phase 2's states,
        and wake the tasks the start rule holds."""
        self.wake()
        async with self._lock:
            for prep in list(self._items.values()):
                if prep.waiting is not None or prep.fetching:
                    await self._advance(prep)

    async def update_states(self) -> None:
        """Phase 2's task states as they are now (for a report)."""
        for prep in list(self._items.values()):
            if prep.fetching:
                prep.task_state = await self.parts.task_state(prepare_task_id(prep.task_id))

    async def view(self, task_id: str) -> dict[str, Any]:
        """Preparation ``task_id`` as ``GET /v1/preparations/{task}`` answers it."""
        prep = self.get(task_key(task_id))
        await self.update_states()
        if prep is None:
            raise NotFound(f"no preparation {task_id!r} on this agent", hint="PUT /v1/preparations/{task} makes one")
        return preparation_view(prep)

    async def views(self) -> list[dict[str, Any]]:
        """Every preparation, as ``GET /v1/preparations`` lists them."""
        await self.update_states()
        return [preparation_view(p) for p in self.all()]

    async def release(self, task_id: str) -> None:
        """The preparation is no longer wanted: its reservations and its task go."""
        async with self._lock:
            prep = self._items.get(task_id)
            if prep is None:
                # an agent restart forgot the record, not its task: the task goes all the same
                if await self.parts.task_state(prepare_task_id(task_id)) is not None:
                    await self.parts.release_task(prepare_task_id(task_id))
                    return
                raise NotFound(f"no preparation {task_id!r} on this agent")
            try:
                await self._forget(prep)
            finally:
                self._items.pop(task_id, None)

    async def _forget(self, prep: Prepared) -> None:
        for key in list(prep.reserved):
            self._drop(prep, key)
        if await self.parts.task_state(prepare_task_id(prep.task_id)) is not None:
            await self.parts.release_task(prepare_task_id(prep.task_id))

    def _drop(self, prep: Prepared, key: Key) -> None:
        amount = prep.reserved.pop(key, None)
        # a fetch of that version took the reservation over (it releases it when done)
        if amount is not None and not self.parts.is_fetching(key) and self.parts.reservation(key) == amount:
            self.parts.release_reservation(key)

    async def lapse(self) -> list[str]:
        """Release the preparations whose lease lapsed (the controller stopped renewing)."""
        now = self.parts.now()
        gone = [p.task_id for p in self._items.values() if p.lease_until <= now]
        for task_id in gone:
            log.info("preparation %s lapsed; releasing it", task_id)
            try:
                await self.release(task_id)
            except NotFound:
                pass
        return gone

    async def start_hold(self, task_id: str) -> str | None:
        """Why the prepared task ``task_id`` may not start now (the start rule), or None."""
        prep = self._items.get(task_id)
        if prep is None:
            return None
        mine = {(n, d) for n, (d, _) in prep.versions.items()}
        capacity = await self.parts.capacity()
        # the other tasks' data: not this task's own (nor its preparation's), and a version
        # both use counts once, as its own
        running = await self.parts.in_use_bytes(mine, (task_id, prepare_task_id(task_id)))
        own = sum(size for _, size in prep.versions.values())
        if start_gate(capacity, prep.second, running, own):
            if prep.waiting is not None and prep.waiting.startswith(START_RULE):
                prep.waiting = None
            return None
        prep.waiting = (
            f"{START_RULE}: running tasks' data {running} + this task's {own} bytes > {prep.second:g} of"
            f" {capacity}; held until they release their data"
        )
        return prep.waiting

    def wake(self) -> None:
        """A task released its data: the tasks the start rule holds look again."""
        released, self._released = self._released, asyncio.Event()
        released.set()

    async def released(self, timeout: float) -> None:
        """Return when a task released its data (:meth:`wake`), or after ``timeout`` s."""
        try:
            await asyncio.wait_for(self._released.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def prepared_keys(self, task_id: str) -> set[Key]:
        """The versions the preparation of ``task_id`` fetched or found: the start check's."""
        prep = self._items.get(task_id)
        if prep is None:
            return set()
        return {(n, d) for n, (d, _) in prep.versions.items()}

    async def hand_over(self, task_id: str, done: Iterable[Awaitable[Any]]) -> None:
        """The task arrived: once its own work is done, its preparation goes."""
        await asyncio.gather(*done, return_exceptions=True)
        try:
            await self.release(task_id)
        except NotFound:
            pass


def preparation_view(prep: Prepared) -> dict[str, Any]:
    """A preparation as ``GET /v1/preparations`` and ``dsctl ls`` show it."""
    return {
        "task": prep.task_id,
        "phase": prep.phase,
        "state": prep.state,
        "waiting": prep.waiting,
        "reservedBytes": sum(prep.reserved.values()),
        "missingBytes": prep.missing_bytes if prep.versions else None,
        "firstThreshold": prep.first,
        "secondThreshold": prep.second,
        "leaseUntil": iso(prep.lease_until),
        "namespace": prep.tenant,
        "requested": [request.name for request in prep.requests],
        "datasets": [
            {"name": name, "digest": digest, "sizeBytes": size, "held": (name, digest) in prep.held}
            for name, (digest, size) in sorted(prep.versions.items())
        ],
        "error": prep.error,
    }


__all__ = [
    "FIRST_THRESHOLD",
    "SECOND_THRESHOLD",
    "Prepared",
    "Preparations",
    "ServiceParts",
    "prepare_task_id",
    "preparation_view",
]
