"""The bounded window through which this node's readers get bundles other members own.

Who calls it: :class:`dsagent.cache.striped.stripes.StripeShares` owns one :class:`StripeWindow`,
asks it for a bundle its share does not hold (:meth:`StripeWindow.open`, with the call that
fetches it), tells it when a share is dropped (:meth:`StripeWindow.forget`) and counts its
disk with the shares' (:meth:`StripeWindow.bytes_by_version`). Design:
docs/design-striping.md.

What it owns: ``<root>/stripes/<name>/<digest>/window/<bundle>/`` of each version, the
bundles fetched for this node's readers (the owner over the peer protocol, then the other
members, the agents holding or fetching a whole copy, then the store: the caller's fetch),
and their order: least recently used goes first once ``stripe_window_bytes`` are full. A
bundle being read is pinned; a reader that finds no unpinned bundle to drop waits for a pin
to go, at most ``peer_wait``, then gets a :class:`TransientError` (a 503). Two readers of one
bundle share one fetch, which belongs to neither: a reader that goes (its request cancelled)
stops only its own wait, and the fetch is told to stop (the ``stop`` event it is given) once
no reader waits for it any more; a reader that asks for the bundle meanwhile waits for that
fetch to end and starts another. The window never takes a share's bundle: shares are the
caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from dsagent.cache.layout import Key
from dsagent.cache.pools import Pools
from dsagent.cache.settings import Settings
from dsagent.errors import InsufficientSpace, TransientError

Slot = tuple[Key, str]  # a version and one of its bundles
#: how a bundle is fetched into its directory: the call ends early, having left nothing, once
#: the event is set
Fetch = Callable[[Path, threading.Event], Awaitable[None]]


@dataclass
class _Visit:
    """A bundle in the window: its directory, the disk it takes, how many streams read it now."""

    directory: Path
    size: int
    pins: int = 0


@dataclass
class _Flight:
    """A bundle being fetched into the window: the task, the readers waiting for it, and the
    event that tells the fetch to stop once none does."""

    task: asyncio.Future[_Visit]
    stop: threading.Event
    waiters: int = 0


class StripeWindow:
    """Bundles owned elsewhere, held for this node's readers within ``stripe_window_bytes``."""

    def __init__(self, settings: Settings, pools: Pools, counts: dict[str, int]) -> None:
        self.settings = settings
        self.pools = pools
        self.counts = counts  # the shares' counters: window_hits is this window's
        self._window: OrderedDict[Slot, _Visit] = OrderedDict()
        self.bytes = 0  # the disk its bundles take, and those being fetched into it
        self._room = asyncio.Condition()
        self._flights: dict[Slot, _Flight] = {}

    def bytes_by_version(self) -> dict[Key, int]:
        """The disk each version's bundles take in the window."""
        out: dict[Key, int] = {}
        for (key, _bundle), visit in self._window.items():
            out[key] = out.get(key, 0) + visit.size
        return out

    async def open(self, slot: Slot, directory: Path, size: int, fetch: Fetch) -> tuple[Path, Callable[[], None]]:
        """Where the bundle ``slot`` is (its ``directory``, ``size`` bytes of disk), fetched by
        ``fetch(directory, stop)`` unless the window holds it or a fetch of it is under way; and
        the call that unpins it. Cancelled, this reader stops waiting; the fetch goes on for
        the others, and is stopped when it was the last."""
        while True:
            visit = self._window.get(slot)
            if visit is not None:
                self.counts["window_hits"] += 1
                self._window.move_to_end(slot)
                break
            flight = self._flights.get(slot)
            if flight is not None and flight.stop.is_set():  # stopping: it ends, then another starts
                await asyncio.wait([flight.task])
                continue
            if flight is None:
                flight = self._flights[slot] = self._fly(slot, directory, size, fetch)
            visit = await self._wait(flight)
            break
        visit.pins += 1
        return visit.directory, lambda: self._unpin(slot)

    def _fly(self, slot: Slot, directory: Path, size: int, fetch: Fetch) -> _Flight:
        """The fetch of ``slot`` as a task of its own (no reader's), gone from the flights when it ends."""
        stop = threading.Event()
        task = asyncio.ensure_future(self._visit(slot, directory, size, lambda into: fetch(into, stop)))
        flight = _Flight(task, stop)

        def ended(done: asyncio.Future[_Visit]) -> None:
            if self._flights.get(slot) is flight:
                del self._flights[slot]
            if not done.cancelled():
                done.exception()  # retrieved: its waiters got it, or none was left to

        task.add_done_callback(ended)
        return flight

    @staticmethod
    async def _wait(flight: _Flight) -> _Visit:
        """One reader's wait for ``flight``; the last reader to go stops its fetch."""
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if not flight.waiters and not flight.task.done():
                flight.stop.set()  # nobody waits for the bundle: its fetch ends at its next step

    async def forget(self, key: Key) -> None:
        """A version's bundles leave the window (the caller removes their directories with
        the version's); readers waiting for room are woken."""
        for slot in [slot for slot in self._window if slot[0] == key]:
            self.bytes -= self._window.pop(slot).size
        await self._notify()

    def _unpin(self, slot: Slot) -> None:
        visit = self._window.get(slot)
        if visit is not None and visit.pins > 0:
            visit.pins -= 1
            asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def _visit(self, slot: Slot, directory: Path, size: int, fetch: Callable[[Path], Awaitable[None]]) -> _Visit:
        """Room first (the space reserved while the bundle arrives), then the fetch."""
        await self._make_room(size)
        self.bytes += size
        try:
            await fetch(directory)
        except BaseException:
            self.bytes -= size
            await self.pools.work(shutil.rmtree, directory, True)
            raise
        visit = _Visit(directory, size)
        self._window[slot] = visit
        return visit

    async def _make_room(self, size: int) -> None:
        limit = self.settings.stripe_window_bytes
        if size > limit:
            raise InsufficientSpace(f"a bundle of {size} bytes does not fit the stripe window ({limit})")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.peer_wait
        async with self._room:
            while self.bytes + size > limit:
                gone = next(((slot, v) for slot, v in self._window.items() if v.pins == 0), None)
                if gone is not None:
                    slot, visit = gone
                    del self._window[slot]
                    self.bytes -= visit.size
                    await self.pools.work(shutil.rmtree, visit.directory, True)
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    raise TransientError("the stripe window is full of bundles being read", hint="retry shortly")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._room.wait(), left)


__all__ = ["StripeWindow"]
