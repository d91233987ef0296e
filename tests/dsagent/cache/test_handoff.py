"""The stripe hand-off rule (:func:`dsagent.cache.striped.handoff.handoff_verdict`): each reason to stop,
and when a stopping agent keeps serving. Pure: times are passed in."""

from __future__ import annotations

import pytest

from dsagent.cache.settings import Settings
from dsagent.cache.striped.handoff import HandoffEnd, HandoffWindows, PeerFetches, handoff_verdict

WINDOWS = HandoffWindows.of(grace=570, idle=30)  # first contact: 60 s


def verdict(now: float, last_fetch: float | None = None, held: int = 5, windows: HandoffWindows = WINDOWS) -> object:
    return handoff_verdict(now=now, since=1000.0, last_fetch=last_fetch, bundles_held=held, windows=windows)


def test_the_first_contact_window_is_twice_the_idle_window_unless_set() -> None:
    assert WINDOWS == HandoffWindows(grace=570, idle=30, first_contact=60)
    assert HandoffWindows.of(570, 30, 90).first_contact == 90
    assert HandoffWindows.of(570, 30, 10).first_contact == 30  # never shorter than the idle window
    settings = Settings()
    assert (settings.stripe_handoff_grace, settings.stripe_handoff_idle) == (0, 30)  # the chart turns it on


def test_off_stops_at_once() -> None:
    assert verdict(1000, windows=HandoffWindows.of(0, 30)) is HandoffEnd.OFF


def test_nothing_held_stops_at_once_and_once_released() -> None:
    assert verdict(1000, held=0) is HandoffEnd.NOTHING_HELD  # an agent without shares: as fast as before
    assert verdict(1100, last_fetch=1099, held=0) is HandoffEnd.NOTHING_HELD  # the controller released it


def test_it_waits_for_the_first_contact_window_without_any_peer() -> None:
    assert verdict(1000) is None
    assert verdict(1059.9) is None  # the controller's next pass may not have come yet
    assert verdict(1060) is HandoffEnd.NO_PEER
    assert verdict(1060, last_fetch=990) is HandoffEnd.NO_PEER  # a fetch before the signal is not a contact


def test_it_stops_once_the_peers_are_idle_after_the_first_contact_window() -> None:
    assert verdict(1060, last_fetch=1010) is HandoffEnd.IDLE
    assert verdict(1060, last_fetch=1040) is None  # asked 20 s ago
    assert verdict(1070, last_fetch=1040) is HandoffEnd.IDLE
    assert verdict(1045, last_fetch=1005) is None  # idle, but inside the first-contact window


def test_the_bound_wins_over_peers_that_keep_asking() -> None:
    assert verdict(1569, last_fetch=1569) is None
    assert verdict(1570, last_fetch=1570) is HandoffEnd.BOUND


def test_peer_fetches_count_open_streams_as_asking_now() -> None:
    fetches = PeerFetches()
    assert fetches.last(5.0) is None
    fetches.asked(1.0)
    assert fetches.last(50.0) == 50.0  # a stream still open: the peer is being served now
    fetches.ended(3.0, sent=True)
    fetches.asked(4.0)
    fetches.ended(4.5, sent=False)  # refused (busy) or cut: asked, not sent
    assert fetches.last(50.0) == 4.5 and fetches.sent == 1


@pytest.mark.parametrize("value", ["0", "-1"])
def test_the_idle_window_must_be_positive(value: str) -> None:
    with pytest.raises(ValueError, match="idle window|invalid duration"):
        Settings(stripe_handoff_idle=value)
