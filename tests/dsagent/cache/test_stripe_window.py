"""The stripe window's fetches belong to no reader (:class:`dsagent.cache.striped.stripewindow.StripeWindow`).

Two readers of one bundle share one fetch. A reader that goes (its request cancelled) stops
only its own wait; once no reader waits, the fetch is told to stop, and the window frees what
it reserved only after the fetch has ended (a fetch runs on a thread, which writes into the
bundle's directory until it ends). Real threads, real directories; the fetch is a function
that writes a file and waits on the stop event as the agent's peer fetch does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.pools import Pools
from dsagent.cache.settings import Settings
from dsagent.cache.striped.stripewindow import StripeWindow
from dsagent.errors import FetchStopped

KEY = ("imgs", "d" * 64)
SLOT = (KEY, "b" * 32)


@pytest.fixture
def pools() -> Iterator[Pools]:
    pools = Pools(4)
    yield pools
    pools.executor.shutdown(wait=True)


class Peer:
    """A bundle's source on a thread: writes the bundle's file, then waits for ``go`` (the
    peer's answer) or for the fetch's stop; counts the fetches and what they saw."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = 0
        self.stopped = 0
        self.ended_at_window_bytes: list[int] = []

    def fetch(self, window: StripeWindow, pools: Pools):  # type: ignore[no-untyped-def]
        async def fetch(directory: Path, stop: threading.Event) -> None:
            await pools.work(self._run, window, directory, stop)

        return fetch

    def _run(self, window: StripeWindow, directory: Path, stop: threading.Event) -> None:
        self.started += 1
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "part").write_bytes(b"x" * 100)
        while not self.go.wait(0.01):
            if stop.is_set():
                self.stopped += 1
                (directory / "part").unlink()  # nothing of the bundle left, as the agent's fetch leaves
                self.ended_at_window_bytes.append(window.bytes)
                raise FetchStopped("stopped: no reader waits for it")


def _window(tmp_path: Path, pools: Pools) -> StripeWindow:
    settings = Settings(root=tmp_path / "agent", stripe_window_bytes=10_000, peer_wait=5.0)
    return StripeWindow(settings, pools, {"window_hits": 0})


def _scene(tmp_path: Path, pools: Pools):  # type: ignore[no-untyped-def]
    """A window, its peer, the bundle's directory, and a reader starter (a future of ``open``)."""
    window, peer = _window(tmp_path, pools), Peer()
    directory = tmp_path / "window" / "b"

    def reader() -> asyncio.Future[tuple[Path, Any]]:
        return asyncio.ensure_future(window.open(SLOT, directory, 1000, peer.fetch(window, pools)))

    return window, peer, directory, reader


async def _until(check, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_a_reader_that_goes_leaves_the_others_their_bundle(tmp_path: Path, pools: Pools) -> None:
    async def run() -> None:
        window, peer, directory, reader = _scene(tmp_path, pools)
        first = reader()
        await _until(lambda: peer.started, "the fetch started")
        second = reader()
        await asyncio.sleep(0.05)
        first.cancel()  # its client went away
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.sleep(0.1)
        peer.go.set()
        where, release = await asyncio.wait_for(second, 5)
        assert where == directory and (directory / "part").exists()
        assert (peer.started, peer.stopped) == (1, 0)  # one fetch, never stopped: a reader still waited
        assert first.cancelled()
        release()

    asyncio.run(run())


def test_the_fetch_stops_when_its_last_reader_goes_and_frees_its_room_after_it_ended(
    tmp_path: Path, pools: Pools
) -> None:
    async def run() -> None:
        window, peer, directory, reader = _scene(tmp_path, pools)
        readers = [reader() for _ in range(2)]
        await _until(lambda: peer.started, "the fetch started")
        assert window.bytes == 1000  # reserved while the bundle arrives
        for one in readers:
            one.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await _until(lambda: peer.stopped, "the fetch was told to stop")
        await _until(lambda: window.bytes == 0, "the room was freed")
        assert peer.ended_at_window_bytes == [1000]  # freed only once the thread had ended
        await _until(lambda: not directory.exists(), "the bundle's directory was removed")
        assert window.bytes_by_version() == {}

    asyncio.run(run())


def test_a_reader_that_comes_while_a_fetch_stops_gets_a_new_fetch(tmp_path: Path, pools: Pools) -> None:
    async def run() -> None:
        window, peer, directory, reader = _scene(tmp_path, pools)
        gone = reader()
        await _until(lambda: peer.started, "the fetch started")
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        late = reader()
        await _until(lambda: peer.stopped, "the first fetch stopped")
        await _until(lambda: peer.started == 2, "a second fetch started")
        peer.go.set()
        where, release = await asyncio.wait_for(late, 5)
        assert (where / "part").exists() and window.bytes == 1000
        release()

    asyncio.run(run())


def test_a_failed_fetch_reaches_every_reader_waiting_for_it(tmp_path: Path, pools: Pools) -> None:
    async def run() -> None:
        window = _window(tmp_path, pools)
        started = asyncio.Event()
        fail = asyncio.Event()

        async def fetch(directory: Path, stop: threading.Event) -> None:
            started.set()
            await fail.wait()
            raise OSError(5, "Input/output error")

        directory = tmp_path / "window" / "b"
        readers = [asyncio.ensure_future(window.open(SLOT, directory, 1000, fetch)) for _ in range(2)]
        await started.wait()
        await asyncio.sleep(0.05)
        fail.set()
        for outcome in await asyncio.gather(*readers, return_exceptions=True):
            assert isinstance(outcome, OSError)
        assert window.bytes == 0

    asyncio.run(run())
