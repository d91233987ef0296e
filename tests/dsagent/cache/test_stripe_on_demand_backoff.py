"""A share held ``storeOnDemand`` asks its peers less often while they have nothing for it.

The fill loop of :class:`dsagent.cache.striped.sharefill.ShareFill` runs as the agent runs
it, with a bundle fetch that finds nothing (as when no peer holds the share's bundles yet)
until a chosen pass: the waits between passes grow from the retry interval to at most
:data:`~dsagent.cache.striped.sharefill.ON_DEMAND_BACKOFF` of them, and a pass that brings a
bundle starts over at the interval.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from dsagent.cache.settings import Settings
from dsagent.cache.striped.sharefill import ON_DEMAND_BACKOFF, ShareFill, on_demand_wait

RETRY = 0.05


def test_the_wait_doubles_after_each_pass_that_brought_nothing_up_to_the_cap() -> None:
    assert [on_demand_wait(30, idle) for idle in range(7)] == [30, 30, 60, 120, 240, 240, 240]
    assert ON_DEMAND_BACKOFF == 8


class _Fill(ShareFill):
    """The fill loop with a fetch that brings bundle ``b3`` at pass ``brings_at`` only."""

    def __init__(self, brings_at: int, passes: int) -> None:
        self.settings = Settings(stripe_on_demand_retry=RETRY, fetch_workers=2)
        self.brings_at, self.passes = brings_at, passes
        self.started: list[float] = []

    async def _bring(self, share: Any, digest: str, *, demand: bool = False) -> None:
        if digest == "b0":  # one call per pass
            self.started.append(time.monotonic())
            if len(self.started) >= self.passes:
                share.held.update(b.digest for b in share.owned)  # let the loop end
        if digest == "b3" and len(self.started) == self.brings_at:
            share.held.add(digest)


def _gaps(brings_at: int, passes: int, monkeypatch: Any) -> list[float]:
    """The waits the loop asks for between its passes (what it sleeps for, not the clock:
    a loaded machine wakes late)."""
    fill = _Fill(brings_at, passes)
    share = SimpleNamespace(
        owned=[SimpleNamespace(digest=f"b{i}") for i in range(4)], ready_after=0, held=set(),
        on_demand=True, handover=set(), key=("ds", "0" * 64), error=None,
    )  # fmt: skip
    asked: list[float] = []
    sleep = asyncio.sleep

    async def recorded(delay: float, *args: Any) -> Any:
        asked.append(delay)
        return await sleep(0, *args)

    monkeypatch.setattr(asyncio, "sleep", recorded)
    asyncio.run(fill._fill(share))  # type: ignore[arg-type]
    assert len(fill.started) == passes
    return asked


@pytest.mark.parametrize("brings_at", [0, 4])
def test_a_share_on_demand_backs_off_while_its_peers_have_nothing(brings_at: int, monkeypatch: Any) -> None:
    gaps = _gaps(brings_at, passes=8, monkeypatch=monkeypatch)
    # in units of the retry interval: 1, 2, 4, 8, 8, ... while nothing comes; a pass that
    # brought a bundle (the 4th) is followed by the interval, and the next empty one too,
    # then the doubling starts anew
    expected = [1, 2, 4, 8, 8, 8, 8] if brings_at == 0 else [1, 2, 4, 1, 1, 2, 4]
    assert [round(g / RETRY) for g in gaps] == expected, gaps
