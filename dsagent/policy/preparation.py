"""Which waiting jobs' datasets to prepare on which node while the current jobs run: pure
functions of their inputs (docs/design.md#next-job-preparation).

Who calls it: the Dataset controller (:mod:`dsagent.controller.nextjob`, which gathers the
nodes, the running pods' expected ends and progress, the pending pods in their queue's
order and the pods a running one names as its follow-up, and puts what :func:`plan` says on
each node's agent, :mod:`dsagent.cache.prepared`) and the simulator (``tools/sim/hooks.py``,
the opt-in ``prepare_next`` variant). Nothing here reads the clock or does I/O; ``now`` is
passed in.

The switching design's steps, mapped to datasets on a node:

1. **The next job** (:func:`predict`, unless ``known``): a pod the cluster names
   (:class:`Known`: a running pod's follow-up) goes to that pod's node; the rest are
   placed by replaying the queue (in the order given: a queue system's, else creation)
   against the running jobs' expected ends, as the scheduler runs it (backfill, gangs
   together), each pod to the node holding most of its bytes, then best fit. A pod that
   fits somewhere now is left to the scheduler (nothing to prepare) but takes its GPUs.
2. **Phase 1** (manifest, space reservation): a job predicted to start within ``window_s``
   (a known one at once) gets its missing datasets reserved on its node as long as the
   bytes already reserved for prepared jobs there have not reached ``reserve_fraction`` of
   the node's cache (the first threshold; the agent reserves at most up to it).
3. **Phase 2** (the bulk fetch), when either trigger holds
   (:meth:`Thresholds.second_phase`): the design's "preset progress", fewer than
   ``subtasks_remaining`` sub-tasks left in each job whose end frees the GPUs, where the
   jobs report them; or the predicted start within the job's **lead** (``fetch_lead_s``
   plus its missing bytes at ``fetch_bytes_per_s``). And the bytes that cannot be evicted
   afterwards (in use, plus prepared data fetched or fetching) within ``fill_fraction`` of
   the cache (the second threshold, :func:`second_gate`, which the agent checks again on its
   own figures, and again when the task starts: :func:`start_gate`); not while a job bound
   to that node still waits for its own data. A preparation already fetching keeps its
   place first (no flapping), counted first. The
   first threshold counts the preparations in phase 1 only (:func:`first_budget`), in the
   agent and here alike.
4. **Cleanup**: the plan lists only what should be prepared now; the caller drops the rest.

Decisions: the prediction horizon is ``window_s`` or, for a job whose lead is longer, its
lead; multi-pod jobs are one entry per pod; a node whose running jobs have no expected end
frees nothing (no prediction there).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

Key = tuple[str, str]  # (dataset name, digest)


@dataclass(frozen=True)
class Thresholds:
    """The presets: when to start each phase and how much of a cache it may take."""

    window_s: float = 1800.0  # prepare jobs predicted to start within this
    fetch_lead_s: float = 600.0  # phase 2 once the start is this close
    reserve_fraction: float = 0.3  # first threshold: reserved for prepared jobs, of capacity
    fill_fraction: float = 0.9  # second threshold: in use + prepared data, of capacity
    # the bulk-fetch rate phase 2 plans with (below the agent's measured 669 MB/s unpack,
    # docs/performance.md, since fetches share the store); 0: fetch_lead_s alone
    fetch_bytes_per_s: float = 500e6
    # the design's preset count: phase 2 once fewer than this many of the current job's
    # sub-tasks remain (where the job reports them, dsagent.io/progress); 0: the lead alone
    subtasks_remaining: int = 2

    def lead_s(self, size_bytes: int) -> float:
        """How long before a predicted start phase 2 begins for ``size_bytes`` missing bytes."""
        extra = size_bytes / self.fetch_bytes_per_s if self.fetch_bytes_per_s > 0 else 0.0
        return self.fetch_lead_s + extra

    def __post_init__(self) -> None:
        if not (self.window_s >= 0 and self.fetch_lead_s >= 0):
            raise ValueError("window_s and fetch_lead_s must be >= 0")
        if not (0 <= self.reserve_fraction <= 1 and 0 <= self.fill_fraction <= 1):
            raise ValueError("reserve_fraction and fill_fraction must be within [0, 1]")
        if not (self.fetch_bytes_per_s >= 0 and math.isfinite(self.fetch_bytes_per_s)):
            raise ValueError("fetch_bytes_per_s must be a finite number >= 0")
        if self.subtasks_remaining < 0:
            raise ValueError("subtasks_remaining must be >= 0")

    def second_phase(self, releasing: Sequence[Running], lead_reached: bool) -> bool:
        """The trigger of phase 2: either condition starts it. The design's "preset
        progress": every job whose end frees the GPUs reports its sub-tasks and fewer than
        ``subtasks_remaining`` of them remain in each; or the predicted start is within the
        job's lead (``lead_reached``), whatever the reports say: a job that needs 500 GB
        and whose GPUs free in 300 s fetches now, not after the current job's last steps."""
        progressed = (
            self.subtasks_remaining > 0
            and bool(releasing)
            and all(r.remaining is not None for r in releasing)
            and max(r.remaining or 0 for r in releasing) < self.subtasks_remaining
        )
        return lead_reached or progressed


def first_budget(capacity: int, first: float, reserved_in_phase_one: int) -> int:
    """Bytes a new phase-1 reservation may take on a node: what is left below the first
    threshold (``first`` x ``capacity``) after the reservations of the other preparations
    still in phase 1; 0 once reached. As the design counts the tasks in environment
    initialisation only, a preparation in phase 2 counts against the second threshold, not
    this one (:func:`second_gate`). The agent and the controller both count this way."""
    return max(0, int(first * capacity) - reserved_in_phase_one)


def second_gate(capacity: int, second: float, in_use: int, fetching_by_others: int, size: int) -> bool:
    """Whether a bulk fetch of ``size`` bytes may start on a node: the running tasks' data
    (``in_use``), the other preparations' bulk fetches (fetched or fetching) and this one
    within ``second`` x ``capacity``."""
    return in_use + fetching_by_others + size <= second * capacity


def start_gate(capacity: int, second: float, running: int, own: int) -> bool:
    """The start rule: whether a prepared task may start (be told its data is ready) on a
    node: the running tasks' data (``running``) plus its own (``own``) within ``second`` x
    ``capacity``, the same second threshold its bulk fetch was held to (:func:`second_gate`,
    without other preparations: only what runs counts)."""
    return second_gate(capacity, second, running, 0, own)


@dataclass(frozen=True)
class Want:
    """One dataset version a waiting job needs."""

    name: str
    digest: str
    size_bytes: int

    @property
    def key(self) -> Key:
        return (self.name, self.digest)


@dataclass(frozen=True)
class Running:
    """A job holding GPUs on a node, and when it is expected to end (None: unknown)."""

    gpus: int
    expected_end: float | None
    remaining: int | None = None  # sub-tasks not yet run (dsagent.io/progress); None: not reported


@dataclass(frozen=True)
class NodeState:
    name: str
    capacity_bytes: int
    in_use_bytes: int  # versions bound to running tasks: never evicted
    free_gpus: int
    running: tuple[Running, ...] = ()
    held: frozenset[Key] = frozenset()  # versions ready or being fetched there
    data_wait: bool = False  # a job bound there still waits for its own data: it fetches first


@dataclass(frozen=True)
class Waiting:
    """One pod of a waiting job (``key`` unique), in queue order."""

    key: str
    gpus: int
    datasets: tuple[Want, ...]
    group: str | None = None  # pods of one gang job: placed together or not at all
    source: str = "prediction"  # where its queue place comes from: kueue, volcano, prediction


@dataclass(frozen=True)
class Known:
    """A waiting pod whose node the cluster names: the job a running pod there says follows
    it (``dsagent.io/next-job``). ``after``: that pod's expected end (None: unknown)."""

    node: str
    after: float | None
    current: Running


@dataclass(frozen=True)
class Preparation:
    """Prepare ``job``'s ``datasets`` (those its node lacks) on ``node``: phase 1 or 2."""

    job: str
    node: str
    datasets: tuple[Want, ...]
    phase: int
    start: float  # when the job is predicted to start there (known: the current job's end, or now)
    source: str = "prediction"  # annotation, kueue, volcano or prediction (the replay alone)

    @property
    def bytes(self) -> int:
        return sum(w.size_bytes for w in self.datasets)


def predict(
    nodes: Sequence[NodeState], waiting: Sequence[Waiting], *, now: float, window_s: float
) -> dict[str, tuple[str, float]]:
    """``pod -> (node, predicted start)`` for the waiting pods that start within the window
    (those that fit now included, with start ``now``).

    The queue is replayed against the expected releases as the scheduler would run it: at
    ``now`` and at each expected end within the window, the waiting pods are tried in queue
    order and every one that fits is placed (later pods may pass one that does not fit:
    backfill); the pods of one ``group`` (a gang) are placed together or not at all. A pod
    goes to the node holding most of its bytes, then the fewest free GPUs that fit (best
    fit), then by name."""
    horizon = now + window_s
    free = {n.name: n.free_gpus for n in nodes if n.free_gpus > 0}  # nodes with free GPUs only
    by_name = {n.name: n for n in nodes}
    releases: dict[float, list[tuple[str, int]]] = {}
    for n in nodes:
        for r in n.running:
            if r.expected_end is not None and math.isfinite(r.expected_end) and r.gpus > 0:
                at = max(now, r.expected_end)
                if at <= horizon:
                    releases.setdefault(at, []).append((n.name, r.gpus))
    groups: dict[str, list[Waiting]] = {}
    order: list[str] = []
    for job in waiting:
        group = job.group if job.group is not None else "\0" + job.key
        if group not in groups:
            order.append(group)
        groups.setdefault(group, []).append(job)
    out: dict[str, tuple[str, float]] = {}
    pending = [g for g in order if all(j.gpus > 0 for j in groups[g])]
    for t in sorted({now, *releases}):
        for name, gpus in releases.get(t, ()):
            free[name] = free.get(name, 0) + gpus
        for group in list(pending):  # one pass: free GPUs only shrink until the next release
            taken: dict[str, int] = {}  # this group's GPUs per node, until it is placed whole
            chosen = []
            for job in groups[group]:
                fits = [
                    (
                        -sum(w.size_bytes for w in job.datasets if w.key in by_name[name].held),
                        f - taken.get(name, 0),
                        name,
                    )
                    for name, f in free.items()
                    if f - taken.get(name, 0) >= job.gpus
                ]
                if not fits:
                    break
                best = min(fits)[2]
                taken[best] = taken.get(best, 0) + job.gpus
                chosen.append((job.key, best))
            else:
                for name, gpus in taken.items():
                    free[name] -= gpus
                    if free[name] <= 0:
                        del free[name]
                out.update((key, (name, t)) for key, name in chosen)
                pending.remove(group)
    return out


def plan(
    nodes: Sequence[NodeState],
    waiting: Sequence[Waiting],
    *,
    now: float,
    thresholds: Thresholds = Thresholds(),
    fetching: Iterable[tuple[str, str]] = (),
    known: Mapping[str, Known] | None = None,
) -> tuple[Preparation, ...]:
    """What to prepare now: one :class:`Preparation` per waiting pod predicted to start on a
    node within the window and not ready to start now, with the datasets that node lacks.

    ``fetching``: ``(job, node)`` pairs whose phase 2 already started; they stay in phase 2
    while still predicted there and count first against both thresholds. ``known``: pods
    whose node the cluster names (:class:`Known`): not predicted, prepared there from the
    moment they are known (phase 1 needs no window), first."""
    known = {k: v for k, v in (known or {}).items() if v.node in {n.name for n in nodes}}
    by_name = {n.name: n for n in nodes}
    largest = max((sum(w.size_bytes for w in job.datasets) for job in waiting), default=0)
    horizon = max(thresholds.window_s, thresholds.lead_s(largest))  # a large dataset's lead is longer
    predicted: dict[str, tuple[str, float]] = {
        key: (k.node, max(now, k.after) if k.after is not None else math.inf) for key, k in known.items()
    }
    predicted.update(predict(nodes, [w for w in waiting if w.key not in known], now=now, window_s=horizon))
    started = set(fetching)
    reserved: dict[str, int] = {}  # node -> bytes reserved by prepared jobs in phase 1 (first threshold)
    filled: dict[str, int] = {}  # node -> bytes of prepared data fetched or fetching (phase 2, second)
    claimed: dict[str, set[Key]] = {}  # node -> versions already planned there (counted once)
    jobs = {w.key: w for w in waiting}
    order = sorted(
        (key for key, (_, start) in predicted.items() if start > now or key in known),
        key=lambda k: (0 if (k, predicted[k][0]) in started else 1, 0 if k in known else 1, predicted[k][1]),
    )
    out = []
    for key in order:
        node_name, start = predicted[key]
        node = by_name[node_name]
        seen = claimed.setdefault(node_name, set())
        first: dict[Key, Want] = {}  # one Want per version (a pod may name a version twice)
        for w in jobs[key].datasets:
            if w.key not in node.held and w.key not in seen:
                first.setdefault(w.key, w)
        missing = tuple(first.values())
        if not missing:
            continue
        size = sum(w.size_bytes for w in missing)
        lead_s = thresholds.lead_s(size)
        if key not in known and start - now > max(thresholds.window_s, lead_s):
            continue  # predicted, but neither within the window nor within its own lead
        in_fetch = (key, node_name) in started
        if key in known:
            releasing: Sequence[Running] = (known[key].current,)
        else:
            releasing = [r for r in node.running if r.expected_end is not None and r.expected_end <= start]
        trigger = thresholds.second_phase(releasing, start - now <= lead_s)
        bulk = second_gate(
            node.capacity_bytes, thresholds.fill_fraction, node.in_use_bytes, filled.get(node_name, 0), size
        )
        if (in_fetch or (trigger and not node.data_wait)) and bulk:
            phase = 2
            filled[node_name] = filled.get(node_name, 0) + size
        elif first_budget(node.capacity_bytes, thresholds.reserve_fraction, reserved.get(node_name, 0)) <= 0:
            continue  # the first threshold reached: no new phase-1 reservation this round
        else:
            phase = 1
            reserved[node_name] = reserved.get(node_name, 0) + size
        seen.update(w.key for w in missing)
        source = "annotation" if key in known else jobs[key].source
        out.append(Preparation(key, node_name, missing, phase, start if math.isfinite(start) else now, source))
    return tuple(out)


def by_node(preparations: Iterable[Preparation]) -> Mapping[str, list[Preparation]]:
    out: dict[str, list[Preparation]] = {}
    for p in preparations:
        out.setdefault(p.node, []).append(p)
    return out


__all__ = [
    "Known",
    "NodeState",
    "Preparation",
    "Running",
    "Thresholds",
    "Waiting",
    "Want",
    "by_node",
    "first_budget",
    "plan",
    "predict",
    "second_gate",
    "start_gate",
]
