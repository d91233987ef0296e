"""Each caller's streams of striped bundles: bounded per caller, ended when nobody reads them.

Who calls it: :class:`dsagent.cache.striped.stripes.StripeShares` owns one :class:`ReaderStreams`
and admits every stream of a bundle to this node's readers through it
(:meth:`ReaderStreams.admit`) before it pins anything; :mod:`dsagent.api.striperoutes` starts
the stream's idle clock once the answer starts (:meth:`ReaderStream.start`), marks each
chunk the reader took (:meth:`ReaderStream.read`) and closes it when the answer ends.

What it owns: fairness between the callers of one node (docs/design-striping.md#agent). The
window (:mod:`.stripewindow`) is one bounded space that every reader's bundles share, and a
stream pins its bundle there until it ends; without a bound per caller, one pod that opened
streams and never read them held the whole window, and every other reader waited, then got
503, for as long as its sockets stayed open. So:

- **a caller** is a pod (its UID), or every operator together;
- **streams**: a caller has at most ``stripe_caller_streams`` open at once (each pins a
  share's bundle or a window bundle);
- **window bytes**: a caller pins at most ``stripe_caller_window`` of ``stripe_window_bytes``;
  a caller pinning nothing may always pin one bundle, so that any bundle the window can hold
  can be read;
- **waits are bounded**: a caller over either bound waits for its own streams to end, at
  most ``peer_wait``, then gets :class:`ReaderBusy` (429);
- **an idle stream ends**: a stream whose reader has taken nothing for ``stripe_stream_idle``
  seconds is cut (its connection closed) and its pin let go.

The stream's pins (a window bundle, a share's reader count) are let go once, whichever comes
first: the answer's end, the reader's hang-up, the idle deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from dsagent.cache.settings import Settings
from dsagent.errors import TransientError

log = logging.getLogger("dsagent.stripes")

#: the caller every operator request counts as
OPERATORS = "operators"


class ReaderBusy(TransientError):
    """A caller already holds its share of this node's bundle streams (429): it reads or
    closes some of them first."""

    http_status = 429
    code = "reader_busy"


class ReaderStream:
    """One bundle stream to a caller: what it pins, and when its reader last took a chunk."""

    def __init__(self, owner: ReaderStreams, caller: str, window_bytes: int) -> None:
        self.caller = caller
        self.window_bytes = window_bytes
        self._owner = owner
        self._releases: list[Callable[[], None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._cut: Callable[[], None] | None = None
        self.last_read = 0.0
        self.closed = False
        self.cut_idle = False  # ended by the idle deadline

    def holding(self, release: Callable[[], None]) -> None:
        """``release`` lets go of what the stream pins: called once, when it closes."""
        if self.closed:
            release()
        else:
            self._releases.append(release)

    def start(self, cut: Callable[[], None] | None = None) -> None:
        """The answer starts: from now on, a reader that takes nothing for the idle deadline
        has its stream closed (``cut``: ends the connection, where there is one)."""
        self._cut = cut
        self.read()
        self._arm(self._owner.idle)

    def read(self) -> None:
        """The reader took a chunk."""
        self.last_read = asyncio.get_running_loop().time()

    def close(self) -> None:
        """Let go of the stream's pins and its place among its caller's streams (once)."""
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        releases, self._releases = self._releases, []
        try:
            for release in releases:
                release()
        finally:
            self._owner._ended(self)

    def _arm(self, delay: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(max(delay, 0.01), self._check)

    def _check(self) -> None:
        if self.closed:
            return
        idle = asyncio.get_running_loop().time() - self.last_read
        if idle < self._owner.idle:
            self._arm(self._owner.idle - idle)
            return
        log.info("a bundle stream to %s was not read for %.0f s: closing it", self.caller, idle)
        self.cut_idle = True
        try:
            if self._cut is not None:
                self._cut()
        finally:
            self.close()


class ReaderStreams:
    """The bundle streams of every caller of this node (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._streams: dict[str, int] = {}
        self._bytes: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._notifying: set[asyncio.Task[None]] = set()

    @property
    def idle(self) -> float:
        return self.settings.stripe_stream_idle

    def held(self, caller: str) -> tuple[int, int]:
        """The streams ``caller`` has open and the window bytes they pin."""
        return self._streams.get(caller, 0), self._bytes.get(caller, 0)

    async def admit(self, caller: str, window_bytes: int) -> ReaderStream:
        """A new stream for ``caller`` that pins ``window_bytes`` of the window (0: a share's
        bundle), once its caller's streams leave room for it; :class:`ReaderBusy` when they
        do not within ``peer_wait``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.peer_wait
        async with self._changed:
            while (over := self._over(caller, window_bytes)) is not None:
                left = deadline - loop.time()
                if left <= 0:
                    raise ReaderBusy(over, hint="read the streams already open to the end, or close them; then retry")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)
            self._streams[caller] = self._streams.get(caller, 0) + 1
            self._bytes[caller] = self._bytes.get(caller, 0) + window_bytes
        return ReaderStream(self, caller, window_bytes)

    def _over(self, caller: str, window_bytes: int) -> str | None:
        """Why one more stream of ``window_bytes`` would take ``caller`` past its bounds, or None."""
        streams, pinned = self.held(caller)
        if streams >= self.settings.stripe_caller_streams:
            return (
                f"{streams} bundle streams are open to this caller, the most one caller may have "
                f"(DSAGENT_STRIPE_CALLER_STREAMS)"
            )
        limit = int(self.settings.stripe_caller_window * self.settings.stripe_window_bytes)
        if window_bytes and pinned and pinned + window_bytes > limit:
            return (
                f"this caller's streams pin {pinned} bytes of the stripe window; {window_bytes} more would "
                f"pass its share, {limit} (DSAGENT_STRIPE_CALLER_WINDOW)"
            )
        return None

    def _ended(self, stream: ReaderStream) -> None:
        left = self._streams.get(stream.caller, 0) - 1
        pinned = self._bytes.get(stream.caller, 0) - stream.window_bytes
        if left > 0:
            self._streams[stream.caller], self._bytes[stream.caller] = left, max(pinned, 0)
        else:
            self._streams.pop(stream.caller, None)
            self._bytes.pop(stream.caller, None)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # closed as the loop ends: nobody is left waiting
            return
        task = loop.create_task(self._notify())
        self._notifying.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._notifying.discard)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


__all__ = ["OPERATORS", "ReaderBusy", "ReaderStream", "ReaderStreams"]
