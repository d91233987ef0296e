"""How often the node agent writes its state to the API server: the coalescer and its counters.

Who calls it: :class:`dsagent.nodeagent.clusteragent.ClusterAgent` keeps one
:class:`Coalescer` per object it writes (its ``NodeCache`` and its Node's free-GPU
annotation) and counts each write in :class:`StateWriteMetrics`, registered in the agent's
own metrics (``GET /metrics``). ``tools/bench/agent_writes.py`` drives a :class:`Coalescer`
with a simulated hour of cache events.

The rule (docs/design.md#node-state): a state is written only when it differs from the last
one written (or the heartbeat is due), and at most once per ``min_interval_s`` however fast
the cache changes; a change that arrives inside the interval waits, and whatever the state
is at the end of the interval is what gets written (the states in between are never sent).
At 15,000 nodes and the default 10 s that bounds the agents' writes at 1,500 a second even
if every cache changed all the time; the measured average under churn is far lower
(docs/results-performance.md). Pure apart from the counters: the caller passes the clock.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from dsplatform.metrics import MetricSet

T = TypeVar("T")

#: the objects the agent writes (the ``object`` label)
OBJECTS = ("nodecache", "node")
#: 256 B .. 256 KiB: a free-GPU annotation to a full inventory plus topology
WRITE_BUCKETS = tuple(float(256 * 4**i) for i in range(6))


class Coalescer(Generic[T]):
    """Decides when one object's state is written; see the module docstring.

    ``due(state, now)`` says whether ``state`` should be written now; after a successful
    write the caller says :meth:`wrote`. ``now`` is any monotonic clock in seconds."""

    def __init__(self, min_interval_s: float, heartbeat_s: float | None = None) -> None:
        if min_interval_s < 0:
            raise ValueError("min_interval_s must not be negative")
        self.min_interval_s = min_interval_s
        self.heartbeat_s = heartbeat_s
        self._written: T | None = None
        self._known = False  # whether ``_written`` is what the object holds
        self._written_at: float | None = None
        self._pending = False
        self.writes = 0

    def due(self, state: T, now: float) -> bool:
        """Whether ``state`` is to be written now: it differs from the last written (or the
        heartbeat is due) and the last write is ``min_interval_s`` old."""
        changed = not self._known or state != self._written
        heartbeat = (
            self.heartbeat_s is not None and self._written_at is not None and now - self._written_at >= self.heartbeat_s
        )
        self._pending = changed or heartbeat
        if not self._pending:
            return False
        return self._written_at is None or now - self._written_at >= self.min_interval_s

    def wrote(self, state: T, now: float) -> None:
        """``state`` was written at ``now``."""
        self._written, self._known, self._written_at, self._pending = state, True, now, False
        self.writes += 1

    def forget(self) -> None:
        """The object may no longer hold what was last written (a failed write, a deleted
        object): the next state is written whatever it is, still no sooner than the interval."""
        self._known = False

    def wait_s(self, now: float) -> float | None:
        """Seconds until a state held back by the interval may be written; None when none is."""
        if not self._pending:
            return None
        if self._written_at is None:
            return 0.0
        return max(0.0, self._written_at + self.min_interval_s - now)


class StateWriteMetrics:
    """The agent's writes of its own state, in the registry of ``metrics`` (the agent's
    :class:`dsagent.cache.metrics.Metrics`; a registry of their own when None):

    - ``dsplatform_agent_state_writes_total{object}``: writes of the ``nodecache`` or the
      ``node`` (its free-GPU annotation), failed ones included;
    - ``dsplatform_agent_state_write_bytes{object}``: the request body of each write.
    """

    def __init__(self, metrics: MetricSet | None = None) -> None:
        owner = metrics if metrics is not None else MetricSet("agent")
        self.registry = owner.registry
        self.writes = owner.counter(
            "state_writes",
            "Writes of the agent's published state to the API server, by object: nodecache or node.",
            "object",
        )
        self.write_bytes = owner.histogram(
            "state_write_bytes",
            "Bytes of each write of the agent's published state (the request body), by object.",
            "object",
            buckets=WRITE_BUCKETS,
        )
        for kind in OBJECTS:
            self.writes.labels(object=kind)
            self.write_bytes.labels(object=kind)

    def wrote(self, kind: str, size_bytes: int) -> None:
        self.writes.labels(object=kind).inc()
        self.write_bytes.labels(object=kind).observe(size_bytes)


__all__ = ["OBJECTS", "WRITE_BUCKETS", "Coalescer", "StateWriteMetrics"]
