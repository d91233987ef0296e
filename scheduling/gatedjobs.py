"""Deadline plans for the gated workers of multi-worker jobs (docs/design.md#deadline-plans).

The admission webhook gives each worker of a job of several workers that asks for an applied
plan (``dsagent.io/deadline-plan: apply``, ``dsagent.io/workers`` > 1) the scheduling gate
:data:`~dsplatform.wire.podannotations.PLAN_GATE`. The Dataset controller's plan loop
(:mod:`dsagent.controller.plangates`) reads the gated pods each round and, with this module:

1. reads each gated pod as a :class:`Worker` (:func:`read_worker`): its job (the first job
   label, else its controlling owner), its time-model profile, its GPUs; a pod that cannot be
   read is refused with the reason, and the loop lifts its gate;
2. groups the workers into :class:`WaitingJob` (:func:`group`); a job whose workers disagree
   on the worker count or the GPUs per worker is refused whole;
3. plans a complete job (all its workers exist) over the nodes its workers may run on
   (:func:`allowed_nodes`) with :func:`plan_job`: steps 3-4 with plans across nodes
   (:func:`scheduling.plans.plan_on_nodes`, ``cross_node=True``), the job's GPU count fixed
   (a gated pod's resource requests cannot change), each node's share whole workers; (12)
   ranks the candidates by the formula the caller names, best fit allocates;
4. orders the jobs as step (6.2.3) does (:func:`scheduling.timemodel.queue_order`: those that
   meet their deadline by slack, ``t_dl - t_end``, least first, then the others by ``t_end``);
   the loop takes one job per round;
5. gives each worker its node (:func:`assign`): the plan's shares in order, workers by name.

A job the loop pinned worker by worker and stopped (the controller restarted) carries its plan
on the pinned workers (``dsagent.io/planned`` with the worker's ``node``): :func:`assign`
completes that plan rather than making another. Pure: pods and nodes in, decisions out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsplatform import kubetime
from dsplatform.errors import InvalidInput
from dsplatform.gpus import GpuResources, QuantityError, pod_gpus
from dsplatform.jobs import DEFAULT_JOB_LABELS, job_key, owner_key
from dsplatform.wire import podannotations
from dsplatform.wire.podannotations import Planned
from scheduling.nodefit import check_rules, inter_pod_rules, node_allowed
from scheduling.nodeinfo import NodeFacts
from scheduling.pinning import required_node
from scheduling.plans import plan_on_nodes
from scheduling.timemodel import DEFAULT_BANDWIDTHS, DEFAULT_FORMULA, Bandwidths, Decision, JobProfile, parse_profile

MAX_NAME = 253
_NODE_RULES = ("nodeSelector", "affinity", "tolerations")  # what scheduling.nodefit reads of a pod


@dataclass(frozen=True)
class Worker:
    """One gated pod of a multi-worker job, as read from the API."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    job: str  # namespace/label-value or namespace/Kind/uid
    profile: JobProfile
    gpus: int
    created: float
    pinned: str | None = None  # the node the loop pinned it to, with the job's plan below
    planned: Planned | None = None
    pod: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def workers(self) -> int:
        return self.profile.workers


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise InvalidInput(f"the pod's {what} is not a name")
    return value


def read_worker(
    pod: Mapping[str, Any],
    *,
    names: GpuResources,
    now: float,
    job_labels: Sequence[str] = DEFAULT_JOB_LABELS,
) -> Worker:
    """The pod as a worker of a gated job; :class:`InvalidInput` saying why it cannot be one
    (not asking for an applied plan, unusable time-model annotations, one worker, no job
    identity, no GPUs, inter-pod rules a plan cannot honour)."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise InvalidInput("the pod's metadata or spec is not an object")
    namespace, name = _text(meta.get("namespace", "default"), "namespace"), _text(meta.get("name"), "name")
    mode = podannotations.plan_mode(pod)
    if mode != podannotations.PLAN_APPLY:
        raise InvalidInput(f"it no longer asks for an applied plan ({podannotations.PLAN_ANNOTATION})")
    annotations = meta.get("annotations")
    labels = meta.get("labels")
    if not isinstance(annotations, dict) or (labels is not None and not isinstance(labels, dict)):
        raise InvalidInput("the pod's annotations or labels are not an object")
    created = kubetime.parse_or_none(meta.get("creationTimestamp")) or now
    profile, problem = parse_profile(annotations, created)
    if profile is None:
        raise InvalidInput(problem or "the pod has no time-model annotations (dsagent.io/params, step-seconds, steps)")
    if profile.workers < 2:
        raise InvalidInput("its job has one worker (dsagent.io/workers): its plan is the webhook's, at admission")
    job = job_key(namespace, labels, job_labels) or owner_key(namespace, meta.get("ownerReferences"))
    if job is None:
        raise InvalidInput("it names no job: no job label (e.g. dsagent.io/job) and no controlling owner")
    try:
        gpus = pod_gpus(spec, names)
    except QuantityError as exc:
        raise InvalidInput(f"its GPU request cannot be read: {exc.message}") from None
    if gpus < 1:
        raise InvalidInput("it asks for no GPUs")
    rules = inter_pod_rules(pod)
    if rules is not None:
        raise InvalidInput(f"it has {rules}, which a plan over free GPUs cannot honour")
    check_rules(pod)
    pinned, planned = None, None
    text = annotations.get(podannotations.PLANNED_ANNOTATION)
    if text is not None:
        try:
            found = podannotations.decode_planned(text)
        except InvalidInput:
            found = None  # not the loop's record: the loop writes its own over it
        if found is not None and found.node is not None and required_node(pod) == found.node:
            pinned, planned = found.node, found
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    return Worker(
        namespace,
        name,
        uid if isinstance(uid, str) else "",
        version if isinstance(version, str) else "",
        job,
        profile,
        gpus,
        created,
        pinned,
        planned,
        pod,
    )


@dataclass(frozen=True)
class WaitingJob:
    """The gated workers of one job (by name); its profile is its first-created worker's."""

    key: str
    members: tuple[Worker, ...]

    @property
    def workers(self) -> int:
        return self.members[0].workers

    @property
    def gpus_each(self) -> int:
        return self.members[0].gpus

    @property
    def n_gpu(self) -> int:
        return self.workers * self.gpus_each

    @property
    def profile(self) -> JobProfile:
        return min(self.members, key=lambda w: (w.created, w.name)).profile

    @property
    def since(self) -> float:
        return min(w.created for w in self.members)

    @property
    def complete(self) -> bool:
        return len(self.members) == self.workers

    @property
    def recorded(self) -> Planned | None:
        """The plan the loop recorded on a worker it pinned, when it pinned any."""
        return next((w.planned for w in self.members if w.planned is not None), None)


def group(workers: Iterable[Worker]) -> tuple[list[WaitingJob], list[tuple[WaitingJob, str]]]:
    """The workers by job, and the jobs refused with the reason (workers that disagree on the
    worker count or the GPUs each asks for, more gated workers than the job has, or workers
    pinned to different plans)."""
    by_key: dict[str, list[Worker]] = {}
    for w in workers:
        by_key.setdefault(w.job, []).append(w)
    jobs, refused = [], []
    for key in sorted(by_key):
        job = WaitingJob(key, tuple(sorted(by_key[key], key=lambda w: (w.namespace, w.name))))
        counts = {w.workers for w in job.members}
        each = {w.gpus for w in job.members}
        plans = {tuple(sorted(w.planned.nodes.items())) for w in job.members if w.planned is not None}
        if len(counts) > 1:
            refused.append((job, f"its workers disagree on dsagent.io/workers ({sorted(counts)})"))
        elif len(each) > 1:
            refused.append((job, f"its workers ask for different GPU counts ({sorted(each)})"))
        elif len(job.members) > job.workers:
            refused.append((job, f"{len(job.members)} gated pods for a job of {job.workers} workers"))
        elif len(plans) > 1:
            refused.append((job, "its pinned workers record different plans"))
        else:
            jobs.append(job)
    return jobs, refused


def plannable_gpus(facts: NodeFacts) -> int:
    """The GPUs a plan could ever give on the node: its topology's, else its published free
    ones (a node that publishes neither is never planned on)."""
    if facts.topology is not None:
        return len(facts.topology.gpu_indices)
    return len(facts.published_free or ())


def allowed_nodes(job: WaitingJob, nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of ``nodes`` (raw v1.Node) every worker's own rules allow (:mod:`scheduling.nodefit`);
    :class:`InvalidInput` when a worker's rules cannot be read."""
    distinct: dict[str, Mapping[str, Any]] = {}  # the workers' rules, each distinct set once
    for w in job.members:
        spec = w.pod.get("spec")
        rules = {k: spec.get(k) for k in _NODE_RULES} if isinstance(spec, dict) else {}
        distinct.setdefault(repr(sorted(rules.items())), w.pod)
    names = []
    for node in nodes:
        meta = node.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if isinstance(name, str) and name and all(node_allowed(pod, node) for pod in distinct.values()):
            names.append(name)
    return names


def never_fits(
    job: WaitingJob, nodes: Sequence[NodeFacts], empty_fit: Mapping[str, int | None] | None = None
) -> str | None:
    """Why the job could not be placed even on empty nodes (``nodes``: those it may run on), or
    None. ``empty_fit``: per node, how many of the job's workers its allocatable CPU and memory
    hold when it runs nothing else (None or absent: no limit known)."""
    limits = empty_fit or {}
    room = 0
    for n in nodes:
        by_gpus = plannable_gpus(n) // job.gpus_each
        by_cpu_memory = limits.get(n.name)
        room += by_gpus if by_cpu_memory is None else min(by_gpus, by_cpu_memory)
    if room >= job.workers:
        return None
    what = "the GPUs the agents publish" + (", and their CPU and memory" if limits else "")
    held = f"at most {room} of its {job.workers} workers of {job.gpus_each} GPUs"
    return f"the nodes it may run on hold {held} (counting {what})"


def less_gpus(facts: NodeFacts, count: int) -> NodeFacts:
    """``facts`` with ``count`` of its free GPUs taken (promised to pods not yet bound there)."""
    if count <= 0:
        return facts
    if facts.published_free is not None:
        kept = sorted(facts.published_free)[: max(0, len(facts.published_free) - count)]
        return dataclasses.replace(facts, published_free=frozenset(kept))
    return dataclasses.replace(facts, used_gpus=facts.used_gpus + count)


def plan_job(
    job: WaitingJob,
    nodes: Sequence[NodeFacts],
    *,
    now: float,
    formula: str = DEFAULT_FORMULA,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> Decision:
    """Steps 3-4 for the whole job over ``nodes``: its fixed ``workers x gpus_each`` GPUs on
    one node or across several (the fragments of partly free nodes, the network's bandwidth),
    each node's share whole workers, (12) by ``formula``, best fit."""
    n = job.n_gpu
    return plan_on_nodes(
        job.profile,
        nodes,
        now=now,
        max_gpus=n,
        bandwidths=bandwidths,
        formula=formula,
        sizes=[n],
        cross_node=True,
        unit=job.gpus_each,
    )


def assign(job: WaitingJob, allocation: Sequence[tuple[str, int]]) -> dict[str, str]:
    """Worker name -> node for the workers not yet pinned: ``allocation``'s shares in order,
    ``gpus_each`` GPUs a worker, the workers by name; the slots of workers already pinned are
    theirs. :class:`InvalidInput` when the shares do not hold the workers."""
    slots: list[str] = []
    for node, count in allocation:
        if count % job.gpus_each:
            raise InvalidInput(f"the plan gives {node} {count} GPUs, not whole workers of {job.gpus_each}")
        slots += [node] * (count // job.gpus_each)
    for w in job.members:
        if w.pinned is None:
            continue
        if w.pinned not in slots:
            raise InvalidInput(f"worker {w.name} is pinned to {w.pinned}, which the plan has no room on")
        slots.remove(w.pinned)
    unpinned = [w for w in job.members if w.pinned is None]
    if len(unpinned) > len(slots):
        raise InvalidInput(f"the plan has room for {len(slots)} more workers, {len(unpinned)} wait")
    return {w.name: node for w, node in zip(unpinned, slots)}


def recorded_allocation(planned: Planned) -> tuple[tuple[str, int], ...]:
    """A recorded plan's shares, in the order it was allocated (least free first, as written)."""
    return tuple(planned.nodes.items())


def planned_note(job: WaitingJob, decision: Decision, formula: str, node: str) -> str:
    """``dsagent.io/planned`` for one worker of ``job`` pinned to ``node`` under ``decision``."""
    assert decision.plan is not None
    deadline = kubetime.format_time(job.profile.deadline) if job.profile.deadline is not None else None
    shares: dict[str, int] = {}
    for name, count in decision.plan.allocation:
        shares[name] = shares.get(name, 0) + count
    return podannotations.encode_planned(decision.plan.n_gpu, shares, decision.branch, formula, deadline, node)


__all__ = [
    "WaitingJob",
    "Worker",
    "allowed_nodes",
    "assign",
    "group",
    "less_gpus",
    "never_fits",
    "plan_job",
    "plannable_gpus",
    "planned_note",
    "read_worker",
    "recorded_allocation",
]
