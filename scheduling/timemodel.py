"""The deadline patent's time model and plan decision, as pure functions.

Who calls it: the extender's ``prioritize/time`` score (:mod:`scheduler_plugin.framework`),
``GET /v1/plan`` and ``dsctl plan``, the admission webhook's applied plans (through
:mod:`scheduling.plans`), and the cluster simulator (``tools/sim``), which uses it
to decide each job's plan under the ``ours+time`` policy and to compute every job's run time
under every policy. It owns the formulas of docs/design.md#deadline-model (the lost ones as
reconstructed there), the decision order and best-fit allocation of #deadline-plans, and the
parsing of the pod annotations that describe a job. Nothing here reads a clock or does I/O;
``now`` is passed in.

Time model (seconds, bytes, bytes/s)::

    n_step(n)   = ceil(steps / n)                              (3) steps = one-GPU steps
    t_comm(n)   = 2 (n - 1) / n x gradient_bytes / bw          (5) ring-allreduce
    t_run(n)    = (t_cal + t_comm(n)) x n_step(n)              (1)+(2)
    pays off    : t_comm(n) < (n - 1) x t_cal                  (11)
    t_end       = t_start + t_run ; met iff t_end < t_dl       (8), (9)
    performance = FORMULAS[name](plan, t_single)               (12) lost: pluggable, efficiency by default
    t_exp       = alpha x t_single ; t_dl = t_arr + t_exp      (6), (7) (dsagent.io/deadline-factor)

``bw`` is the weakest GPU pair of the plan inside a node (NVLink per bonded link, PCIe by
path) and the network bandwidth as soon as a plan spans nodes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

from dsplatform import kubetime
from dsplatform.errors import InvalidInput
from dsplatform.units import UnitError, parse_duration, parse_size
from gpu_topology import LinkKind, Topology
from gpu_topology.model import gpu_name

PARAMS_ANNOTATION = "dsagent.io/params"
GRADIENT_BYTES_ANNOTATION = "dsagent.io/gradient-bytes"
STEP_SECONDS_ANNOTATION = "dsagent.io/step-seconds"
PROFILE_ANNOTATION = "dsagent.io/profiled-steps"
STEPS_ANNOTATION = "dsagent.io/steps"
DEADLINE_ANNOTATION = "dsagent.io/deadline"
DEADLINE_FACTOR_ANNOTATION = "dsagent.io/deadline-factor"
WORKERS_ANNOTATION = "dsagent.io/workers"
TIME_ANNOTATIONS = (
    PARAMS_ANNOTATION,
    GRADIENT_BYTES_ANNOTATION,
    STEP_SECONDS_ANNOTATION,
    PROFILE_ANNOTATION,
    STEPS_ANNOTATION,
    DEADLINE_ANNOTATION,
    DEADLINE_FACTOR_ANNOTATION,
    WORKERS_ANNOTATION,
)
#: eq. (6)'s ``alpha`` per named priority (``dsagent.io/deadline-factor: high``): the values
#: the simulator draws its deadlines with; a number gives ``alpha`` directly
PRIORITY_ALPHA = {"high": 1.0, "normal": 2.0, "low": 4.0}
MAX_ALPHA = 1000.0

BYTES_PER_PARAM = 4  # fp32 gradients unless dsagent.io/gradient-bytes says otherwise
MAX_VALUE_CHARS = 64
MAX_PARAMS = 10**13
MAX_GRADIENT_BYTES = 40 * 10**12
MAX_STEP_SECONDS = 86_400.0
MAX_STEPS = 10**12
MAX_WORKERS = 4096
MAX_DEADLINE_SECONDS = 10 * 365 * 86_400.0
GB = 1e9


@dataclass(frozen=True)
class Bandwidths:
    """Link bandwidths in bytes/s (defaults: NVLink 3 per link, PCIe 4 x16 by path, 100 Gb/s RoCE)."""

    nvlink_per_link: float = 25 * GB
    board: float = 20 * GB
    pix: float = 20 * GB
    pxb: float = 18 * GB
    phb: float = 14 * GB
    node: float = 12 * GB
    sys: float = 8 * GB
    network: float = 12.5 * GB

    def link(self, kind: LinkKind | None, nvlinks: int = 0) -> float:
        if kind is LinkKind.NVLINK:
            return self.nvlink_per_link * nvlinks
        return {
            LinkKind.BOARD: self.board,
            LinkKind.PIX: self.pix,
            LinkKind.PXB: self.pxb,
            LinkKind.PHB: self.phb,
            LinkKind.NODE: self.node,
        }.get(kind, self.sys)  # type: ignore[arg-type]


DEFAULT_BANDWIDTHS = Bandwidths()


@dataclass(frozen=True)
class JobProfile:
    """What the time model needs of a job; ``deadline`` is absolute (same clock as ``now``)."""

    gradient_bytes: float
    step_seconds: float  # t_cal: one batch on one GPU, no communication
    steps: int  # batches on one GPU for the whole run (n_step x n_epoch at n_gpu = 1)
    deadline: float | None = None
    workers: int = 1


def steps_at(steps: int, n_gpu: int) -> int:
    """Eq. (3): data parallelism splits the batches over the GPUs (rounded up)."""
    return -(-steps // max(1, n_gpu))


def t_comm(gradient_bytes: float, n_gpu: int, bw: float) -> float:
    """Eq. (5), reconstructed: ring-allreduce moves 2 (n-1)/n of the gradients per GPU."""
    if n_gpu <= 1:
        return 0.0
    if bw <= 0 or not math.isfinite(bw):
        return 0.0 if math.isinf(bw) else math.inf
    return 2.0 * (n_gpu - 1) / n_gpu * gradient_bytes / bw


def t_run(job: JobProfile, n_gpu: int, bw: float) -> float:
    """Eqs. (1)-(3): the job's run time on ``n_gpu`` GPUs whose weakest link is ``bw``."""
    return (job.step_seconds + t_comm(job.gradient_bytes, n_gpu, bw)) * steps_at(job.steps, n_gpu)


def pays_off(job: JobProfile, n_gpu: int, bw: float) -> bool:
    """Eq. (11): ``n_gpu`` GPUs beat one GPU iff t_comm < (n_gpu - 1) t_cal."""
    return n_gpu <= 1 or t_comm(job.gradient_bytes, n_gpu, bw) < (n_gpu - 1) * job.step_seconds


def intra_node_bandwidth(
    topology: Topology | None, gpus: Iterable[int], bandwidths: Bandwidths = DEFAULT_BANDWIDTHS
) -> float:
    """The weakest pair link among ``gpus`` on one node (inf for one GPU; PCIe SYS when unknown)."""
    members = sorted(set(gpus))
    if len(members) < 2:
        return math.inf
    if topology is None:
        return bandwidths.sys
    weakest = math.inf
    for a, b in combinations(members, 2):
        link = topology.link(gpu_name(a), gpu_name(b))
        bw = bandwidths.link(link.kind, link.nvlinks) if link is not None else bandwidths.sys
        weakest = min(weakest, bw)
    return weakest


def plan_bandwidth(per_node: Sequence[float], bandwidths: Bandwidths = DEFAULT_BANDWIDTHS) -> float:
    """``bw`` of a plan from the intra-node bandwidth of each node's share: the network as
    soon as it spans nodes (and never more than the weakest node's own link)."""
    if not per_node:
        return math.inf
    weakest = min(per_node)
    return weakest if len(per_node) == 1 else min(weakest, bandwidths.network)


# --- annotations -------------------------------------------------------------------------


class AnnotationError(InvalidInput, ValueError):
    """A time-model annotation that cannot be used; the message names the key."""

    code = "invalid_request"  # what the extender answers for a request it cannot use


_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE]\d{1,2})?)\s*([kKMGTB]?)\s*$")
_COUNT_UNITS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9, "T": 10**12}


def _count(key: str, text: str, limit: float) -> float:
    match = _NUMBER.match(text)
    if match is None:
        raise AnnotationError(f"{key}: {text!r} is not a count (e.g. 7B, 350M, 1.2e9)")
    value = float(match.group(1)) * _COUNT_UNITS[match.group(2)]
    if not 0 < value <= limit:
        raise AnnotationError(f"{key}: {text!r} is outside 1..{limit:.0e}")
    return value


def parse_deadline(text: str, created: float | None) -> float:
    """RFC 3339 time (``2026-11-22T18:00:00Z``, :mod:`dsplatform.kubetime`'s rule: with its
    zone) or a duration counted from ``created``."""
    text = text.strip()
    if "T" in text or "-" in text:
        try:
            return kubetime.parse(text)
        except kubetime.KubeTimeError as exc:
            raise AnnotationError(
                f"{DEADLINE_ANNOTATION}: {exc.message} (use {kubetime.HINT}, or a duration such as 6h)"
            ) from None
    try:
        seconds = parse_duration(text)
    except UnitError as exc:
        raise AnnotationError(f"{DEADLINE_ANNOTATION}: {exc}") from None
    if seconds > MAX_DEADLINE_SECONDS:
        raise AnnotationError(f"{DEADLINE_ANNOTATION}: {text!r} is more than ten years")
    if created is None:
        raise AnnotationError(f"{DEADLINE_ANNOTATION}: a duration needs the pod's creationTimestamp")
    return created + seconds


def parse_profile(annotations: Mapping[str, str], created: float | None = None) -> tuple[JobProfile | None, str | None]:
    """The pod's :class:`JobProfile`, ``(None, None)`` when it has none, ``(None, why)`` when
    its annotations are unusable. Never raises on pod data."""
    present = {k: annotations[k] for k in TIME_ANNOTATIONS if k in annotations}
    if not present:
        return None, None
    try:
        return _profile(present, created), None
    except AnnotationError as exc:
        return None, str(exc)


def _profile(a: Mapping[str, str], created: float | None) -> JobProfile:
    for key, value in a.items():
        if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS:
            raise AnnotationError(f"{key}: not a string of at most {MAX_VALUE_CHARS} characters")
    if GRADIENT_BYTES_ANNOTATION in a:
        try:
            gradient = float(parse_size(a[GRADIENT_BYTES_ANNOTATION]))
        except UnitError as exc:
            raise AnnotationError(f"{GRADIENT_BYTES_ANNOTATION}: {exc}") from None
        if not 0 < gradient <= MAX_GRADIENT_BYTES:
            raise AnnotationError(f"{GRADIENT_BYTES_ANNOTATION}: outside 1 B..40 TB")
    elif PARAMS_ANNOTATION in a:
        gradient = _count(PARAMS_ANNOTATION, a[PARAMS_ANNOTATION], MAX_PARAMS) * BYTES_PER_PARAM
    else:
        raise AnnotationError(f"{PARAMS_ANNOTATION} or {GRADIENT_BYTES_ANNOTATION} is required")
    if STEP_SECONDS_ANNOTATION in a:
        try:
            step = parse_duration(a[STEP_SECONDS_ANNOTATION])
        except UnitError as exc:
            raise AnnotationError(f"{STEP_SECONDS_ANNOTATION}: {exc}") from None
    elif PROFILE_ANNOTATION in a:
        step = _profiled(a[PROFILE_ANNOTATION])
    else:
        raise AnnotationError(f"{STEP_SECONDS_ANNOTATION} or {PROFILE_ANNOTATION} is required")
    if not 0 < step <= MAX_STEP_SECONDS:
        raise AnnotationError(f"{STEP_SECONDS_ANNOTATION}: must be above 0 and at most 1d")
    if STEPS_ANNOTATION not in a:
        raise AnnotationError(f"{STEPS_ANNOTATION} is required")
    steps = int(_count(STEPS_ANNOTATION, a[STEPS_ANNOTATION], MAX_STEPS))
    workers = int(_count(WORKERS_ANNOTATION, a.get(WORKERS_ANNOTATION, "1"), MAX_WORKERS))
    job = JobProfile(gradient, step, max(1, steps), None, workers)
    if DEADLINE_ANNOTATION in a and DEADLINE_FACTOR_ANNOTATION in a:
        raise AnnotationError(f"give {DEADLINE_ANNOTATION} or {DEADLINE_FACTOR_ANNOTATION}, not both")
    if DEADLINE_ANNOTATION in a:
        return replace(job, deadline=parse_deadline(a[DEADLINE_ANNOTATION], created))
    if DEADLINE_FACTOR_ANNOTATION in a:
        return replace(job, deadline=factor_deadline(job, parse_factor(a[DEADLINE_FACTOR_ANNOTATION]), created))
    return job


def parse_factor(text: str) -> float:
    """Eq. (6)'s ``alpha``: a named priority (:data:`PRIORITY_ALPHA`) or a number in (0, 1000]."""
    key = text.strip().lower()
    if key in PRIORITY_ALPHA:
        return PRIORITY_ALPHA[key]
    try:
        alpha = float(key)
    except ValueError:
        alpha = math.nan
    if not 0 < alpha <= MAX_ALPHA:  # also refuses nan and inf
        names = "/".join(PRIORITY_ALPHA)
        raise AnnotationError(
            f"{DEADLINE_FACTOR_ANNOTATION}: {text!r} is not {names} or a number in (0, {MAX_ALPHA:g}]"
        )
    return alpha


def factor_deadline(job: JobProfile, alpha: float, arrival: float | None) -> float:
    """Eqs. (6) and (7): ``t_dl = t_arr + alpha x t_single``, the arrival being the pod's
    ``creationTimestamp`` (the admission webhook, which sees the pod before it has one, passes
    the time of admission)."""
    if arrival is None:
        raise AnnotationError(f"{DEADLINE_FACTOR_ANNOTATION}: a factor needs the pod's creationTimestamp")
    return arrival + expected_run_time(alpha, job)


def _profiled(text: str) -> float:
    """Eq. (4): ``"DURATION/STEPS"`` timed on one GPU -> t_cal = t'_step / n'_step."""
    duration, sep, count = text.partition("/")
    if not sep:
        raise AnnotationError(f"{PROFILE_ANNOTATION}: {text!r} is not DURATION/STEPS (e.g. 30s/100)")
    try:
        total = parse_duration(duration)
    except UnitError as exc:
        raise AnnotationError(f"{PROFILE_ANNOTATION}: {exc}") from None
    return total / _count(PROFILE_ANNOTATION, count, MAX_STEPS)


# --- plans ---------------------------------------------------------------------------------


class Allocated:
    """What GPUs per node say of themselves, for a plan and for a running job alike."""

    allocation: tuple[tuple[str, int], ...]  # (node, GPUs) in allocation order

    @property
    def n_gpu(self) -> int:
        return sum(count for _, count in self.allocation)

    @property
    def cross_node(self) -> bool:
        return len(self.allocation) > 1


@dataclass(frozen=True)
class Plan(Allocated):
    """A resource plan: GPUs per node, and what the time model says of it."""

    allocation: tuple[tuple[str, int], ...]  # (node, GPUs) in allocation order
    t_run: float
    t_end: float
    deadline: float

    @property
    def meets_deadline(self) -> bool:
        return self.t_end < self.deadline  # (9)

    @property
    def performance(self) -> float:
        return (self.deadline - self.t_end) / self.n_gpu  # slack per GPU, one of (12)'s stand-ins


# (12) is lost (docs/design.md#deadline-formula): the stand-ins, each "larger is better",
# ranking only the plans that meet the deadline. ``t_single`` is the job's run time on one GPU.
Formula = Callable[["Plan", float], float]


def slack_per_gpu(plan: Plan, t_single: float) -> float:
    """Deadline slack per GPU, ``(t_dl - t_end) / n_gpu``: few GPUs, unless the slack grows faster than them."""
    return plan.performance


def earliest_finish(plan: Plan, t_single: float) -> float:
    """The plan that ends first (``-t_end``): the deadline met with the most margin."""
    return -plan.t_end


def parallel_efficiency(plan: Plan, t_single: float) -> float:
    """Speed-up per GPU, ``t_single / (n_gpu x t_run)`` (1 = linear scaling): the GPUs that
    pay off most; among equally efficient plans, the earlier end (a tiny tie-break)."""
    if plan.t_run <= 0 or not math.isfinite(plan.t_run):
        return 0.0
    return t_single / (plan.n_gpu * plan.t_run) - plan.t_end * 1e-15


FORMULAS: dict[str, Formula] = {
    "slack-per-gpu": slack_per_gpu,
    "earliest-finish": earliest_finish,
    "efficiency": parallel_efficiency,
}
#: the surviving text of (12): among the plans that meet the deadline, the one that runs most
#: efficiently (运行效率最高); the other stand-ins stay selectable by name
DEFAULT_FORMULA = "efficiency"


def check_formula(name: str) -> str:
    """``name`` if it names a stand-in for (12) in :data:`FORMULAS`; else ValueError listing them."""
    if name not in FORMULAS:
        raise ValueError(f"unknown plan formula {name!r}; choose from {', '.join(FORMULAS)}")
    return name


def single_gpu_time(job: JobProfile) -> float:
    """``t_single``: eq. (1) on one GPU, no communication (the run time eq. (6) scales)."""
    return t_run(job, 1, math.inf)


def expected_run_time(alpha: float, job: JobProfile) -> float:
    """Eq. (6), reconstructed: ``t_exp = alpha x t_single``; ``alpha`` comes from the priority."""
    if not alpha > 0:
        raise ValueError("alpha must be positive")
    return alpha * single_gpu_time(job)


@dataclass(frozen=True)
class Decision:
    """The chosen plan, the branch of the decision order that chose it, and the candidates."""

    plan: Plan | None
    branch: str  # cross-expected | single-expected | cross-late | single-late | none
    candidates: Mapping[str, Plan] = field(default_factory=dict)


def best_fit_order(free: Mapping[str, int], prefer: Mapping[str, float] | None = None) -> list[tuple[str, int]]:
    """Step (4.1): nodes with free GPUs, ascending ``c_free``; ties by ``prefer`` (higher first), then name."""
    prefer = prefer or {}
    return sorted(((n, c) for n, c in free.items() if c > 0), key=lambda nc: (nc[1], -prefer.get(nc[0], 0.0), nc[0]))


def allocate_single(order: Sequence[tuple[str, int]], n_gpu: int) -> tuple[tuple[str, int], ...] | None:
    """Step (4.2), best fit: the first node (fewest free) with ``c_free >= n_gpu``."""
    for node, free in order:
        if free >= n_gpu:
            return ((node, n_gpu),)
    return None


def allocate_cross(order: Sequence[tuple[str, int]], n_gpu: int) -> tuple[tuple[str, int], ...] | None:
    """Step (4.3): ``min(c_free, n_left)`` from each node, least free first, until none is left."""
    left, out = n_gpu, []
    for node, free in order:
        if left <= 0:
            break
        take = min(free, left)
        out.append((node, take))
        left -= take
    return tuple(out) if left <= 0 else None


BandwidthOf = Callable[[tuple[tuple[str, int], ...]], float]
StartOf = Callable[[tuple[tuple[str, int], ...]], float]


def decide(
    job: JobProfile,
    free: Mapping[str, int],
    bandwidth_of: BandwidthOf,
    *,
    now: float,
    max_gpus: int,
    prefer: Mapping[str, float] | None = None,
    sizes: Iterable[int] | None = None,
    start_of: StartOf | None = None,
    formula: str = DEFAULT_FORMULA,
    as_written: bool = False,
    cross_node: bool = True,
) -> Decision:
    """Steps 3-4 for one job: plans of 1..``max_gpus`` GPUs on the free GPUs, candidates, the
    decision order, and the best-fit allocation of the chosen plan.

    ``bandwidth_of(allocation)`` is the plan's ``bw``; ``prefer`` breaks best-fit ties between
    nodes with equal free GPUs. ``start_of(allocation)`` is the plan's ``t_start`` (project
    extension: when its data will be on every node of the plan); by default ``now``. ``sizes``
    limits the GPU counts tried (e.g. powers of two,
    for jobs whose global batch must divide evenly); by default every count. Without a deadline
    every plan meets it and (12) degenerates; the deadline is then taken as ``inf`` and the
    plan with the smallest GPU-time among those that pay off (11) wins.

    ``formula`` names the stand-in for (12) in :data:`FORMULAS`. ``as_written`` runs (3.4)
    exactly as the design says, without the project rule that a cross-node plan must end no
    later than the single-node plan of its kind. ``cross_node=False`` tries single-node plans
    only (a job of one pod cannot span nodes).
    """
    rank_by = FORMULAS[formula]
    t_single = single_gpu_time(job)
    deadline = job.deadline if job.deadline is not None else math.inf
    order = best_fit_order(free, prefer)
    if not order:
        return Decision(None, "none")
    most, total = order[-1][1], sum(c for _, c in order)
    single: list[Plan] = []
    cross: list[Plan] = []
    tried = sorted(set(sizes)) if sizes is not None else range(1, max_gpus + 1)
    for n in tried:
        if 1 <= n <= min(max_gpus, most):
            single.extend(_plan(job, allocate_single(order, n), bandwidth_of, now, deadline, start_of))
    if cross_node and len(order) > 1:
        for n in tried:
            if not 2 <= n <= min(max_gpus, total):
                continue
            allocation = allocate_cross(order, n)
            if allocation is not None and len(allocation) > 1:
                cross.extend(_plan(job, allocation, bandwidth_of, now, deadline, start_of))
    candidates: dict[str, Plan] = {}
    for kind, plans in (("single", single), ("cross", cross)):
        met = [p for p in plans if p.meets_deadline]
        late = [p for p in plans if not p.meets_deadline]
        if met:
            no_deadline = math.isinf(deadline)

            def rank(p: Plan, no_deadline: bool = no_deadline) -> tuple[float, int]:
                return (-p.t_run * p.n_gpu if no_deadline else rank_by(p, t_single), -p.n_gpu)

            candidates[f"{kind}-expected"] = max(met, key=rank)
        if late:
            candidates[f"{kind}-late"] = min(late, key=lambda p: (p.t_end, p.n_gpu))
    for branch in ("cross-expected", "single-expected", "cross-late", "single-late"):
        plan = candidates.get(branch)
        if plan is None:
            continue
        if branch.startswith("cross"):
            # (3.4) takes a cross-node plan only when partly free nodes exist that could not
            # hold it alone: it then uses fragments. Project rule: and only when it ends no
            # later than the single-node plan of the same kind (t_end counts the wait for
            # data when the caller passes start_of), so fragments never cost time.
            alone = candidates.get(branch.replace("cross", "single"))
            if not any(0 < c < plan.n_gpu for _, c in order):
                continue
            if not as_written and alone is not None and alone.t_end < plan.t_end:
                continue
        return Decision(plan, branch, candidates)
    return Decision(None, "none", candidates)


def _plan(
    job: JobProfile,
    allocation: tuple[tuple[str, int], ...] | None,
    bandwidth_of: BandwidthOf,
    now: float,
    deadline: float,
    start_of: StartOf | None = None,
) -> list[Plan]:
    if allocation is None:
        return []
    n = sum(c for _, c in allocation)
    bw = bandwidth_of(allocation)
    if not pays_off(job, n, bw):  # (3.2): drop plans failing (11)
        return []
    run = t_run(job, n, bw)
    start = max(now, start_of(allocation)) if start_of is not None else now
    return [Plan(allocation, run, start + run, deadline)]


def wait_for_one_node(plan: Plan, single_run: float, t_free: float) -> bool:
    """Project rule beside (3.4): do not spread a job now when one node will hold the plan's
    GPUs at ``t_free`` (known from the running jobs' ``t_end``) and the plan run there,
    taking ``single_run``, ends no later than spreading now: ``t_free + single_run <= t_end``."""
    return plan.cross_node and math.isfinite(t_free) and t_free + single_run <= plan.t_end


def queue_order(decisions: Iterable[tuple[str, Decision]]) -> list[str]:
    """Step (6.2.3): jobs whose plan meets the deadline first, least slack first; then the
    others by ``t_end``. Jobs without a plan last."""
    met, late, none = [], [], []
    for job, d in decisions:
        if d.plan is None:
            none.append(job)
        elif d.plan.meets_deadline:
            met.append((d.plan.deadline - d.plan.t_end, job))
        else:
            late.append((d.plan.t_end, job))
    return [j for _, j in sorted(met)] + [j for _, j in sorted(late)] + none


def node_score(job: JobProfile, n_gpu: int, bw: float, ideal_bw: float, free: int, *, now: float) -> int:
    """``prioritize/time`` for one node that can give the pod's GPUs (0..10, absolute).

    ``bw``: the bandwidth the pod would get on this node (its best free GPU set, and the
    network when the job has several workers); ``ideal_bw``: the same on the hardware fully
    free. A node on which the job meets its deadline scores 6..10, any other 1..5; within a
    tier ``2 x speed ratio + 2 x best fit`` (``1 / (1 + leftover GPUs)``).
    """
    if n_gpu <= 0 or free < max(1, n_gpu // max(1, job.workers)):
        return 0
    run = t_run(job, n_gpu, bw)
    best = t_run(job, n_gpu, ideal_bw)
    speed = min(1.0, best / run) if run > 0 and math.isfinite(run) else 0.0
    leftover = free - max(1, n_gpu // max(1, job.workers))
    fit = 1.0 / (1 + leftover)
    meets = job.deadline is None or now + run < job.deadline
    return (6 if meets else 1) + round(2 * speed + 2 * fit)


__all__ = [
    "Allocated",
    "AnnotationError",
    "Bandwidths",
    "DEFAULT_BANDWIDTHS",
    "DEADLINE_FACTOR_ANNOTATION",
    "DEFAULT_FORMULA",
    "Decision",
    "FORMULAS",
    "JobProfile",
    "Plan",
    "TIME_ANNOTATIONS",
    "allocate_cross",
    "allocate_single",
    "best_fit_order",
    "check_formula",
    "decide",
    "earliest_finish",
    "expected_run_time",
    "factor_deadline",
    "intra_node_bandwidth",
    "node_score",
    "PRIORITY_ALPHA",
    "parse_deadline",
    "parse_factor",
    "parallel_efficiency",
    "parse_profile",
    "pays_off",
    "plan_bandwidth",
    "queue_order",
    "single_gpu_time",
    "slack_per_gpu",
    "steps_at",
    "t_comm",
    "t_run",
    "wait_for_one_node",
]
