"""The tests' hand-driven clock: a callable returning ``now``, which the test moves forward
(``clock.now += 30``) where the code under test reads the time through an injected clock."""

from __future__ import annotations

#: 2027-01-15: a time after any date the fixtures carry, and far from the epoch
DEFAULT_NOW = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = DEFAULT_NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
