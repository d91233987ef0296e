"""What the bundle benchmark records beside a ratio: its goal where one is set for that
size, else none and the reason in the note (the README lists only ratios with a goal)."""

from __future__ import annotations

import pytest

from tools.bench import bundle
from tools.bench.support.record import Record


def _side(label: str, wall: float, cpu: float) -> bundle.Side:
    side = bundle.Side(label, lambda: None)
    side.wall, side.cpu = wall, cpu
    return side


def _digest_ratio(files: int) -> dict:
    record = Record("bundle", {"files": files})
    sides = [_side("dsctl digest (process)", 0.1, 0.2), _side("in process", 0.05, 0.1), _side("xxh128sum", 0.06, 0.12)]
    bundle.report("digest", sides, 1000, files, record, *bundle.digest_goal(files))
    (ratio,) = record.data["ratios"]
    return ratio


def test_the_digest_goal_holds_from_fifty_thousand_files() -> None:
    ratio = _digest_ratio(50_000)
    assert ratio["goal"] == 1.0
    assert ratio["value"] == pytest.approx(0.6) and ratio["note"] == "CPU time C / dsctl 0.60x"


def test_a_smaller_digest_is_recorded_without_a_goal_and_says_why() -> None:
    ratio = _digest_ratio(6_000)
    assert ratio["goal"] is None
    assert ratio["note"] == "CPU time C / dsctl 0.60x; no goal under 50,000 files"
