"""The coalescer that bounds the agent's writes (docs/design.md#node-state): only on change,
at most one per interval however fast the cache changes, the latest state at the end."""

from __future__ import annotations

from dsagent.nodeagent.statewrites import Coalescer, StateWriteMetrics


def drive(
    coalescer: Coalescer[int], events: list[tuple[float, int]], until: float, poll: float = 0.5
) -> list[tuple[float, int]]:
    """(time, state) of each write when ``events`` (time, state) reach a loop polling every ``poll`` s."""
    written: list[tuple[float, int]] = []
    state, pending = 0, list(events)
    now = 0.0
    while now <= until:
        while pending and pending[0][0] <= now:
            state = pending.pop(0)[1]
        if coalescer.due(state, now):
            coalescer.wrote(state, now)
            written.append((now, state))
        now = round(now + poll, 6)
    return written


def test_a_burst_of_100_changes_is_at_most_two_writes_within_the_interval() -> None:
    coalescer: Coalescer[int] = Coalescer(10.0)
    burst = [(i * 0.09, i + 1) for i in range(100)]  # 100 changes in 9 s
    written = drive(coalescer, burst, until=60.0)
    assert len([t for t, _ in written if t <= 10.0]) <= 2
    assert written == [(0.0, 1), (10.0, 100)]  # the first at once, the latest at the interval's end, none since


def test_no_change_is_no_write() -> None:
    coalescer: Coalescer[int] = Coalescer(10.0)
    assert drive(coalescer, [(0.0, 5)], until=300.0) == [(0.0, 5)]


def test_the_latest_state_is_written_at_the_end_of_the_interval() -> None:
    coalescer: Coalescer[int] = Coalescer(10.0)
    assert coalescer.due(1, 0.0)
    coalescer.wrote(1, 0.0)
    for now, state in ((1.0, 2), (2.0, 3), (9.9, 4)):
        assert not coalescer.due(state, now)
        assert coalescer.wait_s(now) == 10.0 - now
    assert coalescer.due(4, 10.0)  # the latest one; 2 and 3 were never sent


def test_no_change_no_write_and_a_heartbeat_when_due() -> None:
    coalescer: Coalescer[str] = Coalescer(10.0, heartbeat_s=120.0)
    assert coalescer.due("same", 0.0)
    coalescer.wrote("same", 0.0)
    assert not any(coalescer.due("same", t) for t in (10.0, 60.0, 119.0))
    assert coalescer.wait_s(119.0) is None  # nothing held back
    assert coalescer.due("same", 120.0)  # the heartbeat rewrites it


def test_after_forget_the_same_state_is_written_again_but_not_sooner_than_the_interval() -> None:
    coalescer: Coalescer[str] = Coalescer(10.0)
    coalescer.wrote("a", 0.0)
    coalescer.forget()  # a failed write: the object may not hold "a"
    assert not coalescer.due("a", 5.0)
    assert coalescer.due("a", 10.0)


def test_writes_are_counted_by_object_with_their_bytes() -> None:
    metrics = StateWriteMetrics()
    metrics.wrote("nodecache", 4000)
    metrics.wrote("node", 60)
    text = metrics.registry
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in text.collect() for s in m.samples}
    assert samples[("dsplatform_agent_state_writes_total", (("object", "nodecache"),))] == 1
    assert samples[("dsplatform_agent_state_write_bytes_sum", (("object", "nodecache"),))] == 4000
    assert samples[("dsplatform_agent_state_writes_total", (("object", "node"),))] == 1
