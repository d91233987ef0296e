"""The plan loop: deadline plans across nodes for the gated workers of multi-worker jobs
(docs/design.md#deadline-plans, steps 3, 4 and 6 of the deadline design).

Who calls it: the Dataset controller's leader, once per pass after migration (step (6.2.1)
before a round) when ``DSAGENT_CONTROLLER_PLAN_GATES`` is on (:class:`PlanGates` from
:meth:`dsagent.controller.reconcile.DatasetController.reconcile_all`, with the Nodes the pass
listed); the tests drive it against the fake API server. It owns the I/O around the pure
rules of :mod:`scheduling.gatedjobs`.

A round:

1. lists the pods that wait for a node (``spec.nodeName=``, ``status.phase=Pending``) and
   keeps those carrying the gate :data:`~dsplatform.wire.podannotations.PLAN_GATE`, which the
   admission webhook sets on each worker of a multi-worker job that asks for an applied plan;
2. lifts the gate, with a Warning Event saying why, of every pod it cannot plan (unusable
   annotations, no job identity, workers that disagree, rules a plan cannot honour, a job
   that even empty nodes could not hold, a job still missing workers after ``wait_s``): the
   pod is then scheduled as it asked, never left gated;
3. finishes a job an earlier round pinned worker by worker and did not finish (the plan
   recorded on its pinned workers), and evicts a worker it pinned to a node that no longer
   exists (no scheduler can place it): its job's controller makes it anew, gated and
   planned again, and a Warning Event says so; a pod no controller owns is told once and
   left (evicted, it would be gone);
4. plans each job whose workers all exist over the nodes' free GPUs as the extender reads
   them (:class:`~scheduling.nodeinfo.NodeReader`; a node that publishes no free GPUs: its
   allocatable GPUs less the active pods' requests), less the GPUs of pods the loop pinned
   that are not bound yet, each node's only as far as its CPU and memory hold the job's
   workers (:mod:`scheduling.noderoom`), and only on nodes every worker's own rules allow;
   orders the jobs
   by slack (:func:`~scheduling.timemodel.queue_order`) and takes **one** job: each worker
   gets a required node affinity to its node (``matchFields metadata.name``) and the plan in
   ``dsagent.io/planned``, all workers first, then every gate is lifted. A job that does not
   fit now waits for a later round, told once per change by a Normal Event.

What Kubernetes lets a controller change on a gated pod, and what the loop therefore does
not: the pod's resource requests stay as asked (a plan of a gated job is where its fixed GPUs
go, not how many), and a gate is never added after creation (the webhook's). Every patch is a
JSON Patch that first tests the pod's ``resourceVersion`` (pinning) or the gate's place
(lifting): a pod changed meanwhile is left for the next round. A pass runs rounds until one
places nothing, at most :data:`ROUNDS_PER_PASS`.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsagent.controller.agents import raw
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.migration import bound_pods, node_facts
from dsagent.errors import Conflict, NotFound
from dsagent.kube.apiclient import evict, translated
from dsagent.kube.events import EventRecorder, ObjectRef
from dsplatform.errors import InvalidInput
from dsplatform.gpus import CLASS_STEM, GpuResources, QuantityError, pod_gpus
from dsplatform.jobs import DEFAULT_JOB_LABELS
from dsplatform.wire import podannotations
from dsplatform.wire.podannotations import PLAN_GATE, PLANNED_ANNOTATION
from scheduling.gatedjobs import (
    WaitingJob,
    Worker,
    allowed_nodes,
    assign,
    group,
    less_gpus,
    never_fits,
    plan_job,
    planned_note,
    read_worker,
    recorded_allocation,
)
from scheduling.nodeinfo import NodeReader
from scheduling.noderoom import Room, gpus_for, most, node_room, pod_needs, workers_fitting
from scheduling.pinning import JSONPatch, gates, remove_gate, require_node, required_node, set_annotation
from scheduling.timemodel import DEFAULT_FORMULA, Decision, queue_order

log = logging.getLogger("dsagent.controller")

JSON_PATCH = "application/json-patch+json"
ROUNDS_PER_PASS = 16  # one job a round; a pass places at most this many
MAX_PENDING = 20_000  # one round reads at most this many pods waiting for a node
EVENT_PODS = 32  # the workers of one job told of a change (the first, by name)


@dataclass(frozen=True)
class Placed:
    """A job the loop pinned and released: its key, its plan's shares and the branch."""

    job: str
    allocation: tuple[tuple[str, int], ...]
    branch: str


class PlanGates:
    """The plan loop against the API server, through an unmodified ``kubernetes`` client."""

    def __init__(
        self,
        api_client: Any,
        *,
        events: EventRecorder,
        formula: str = DEFAULT_FORMULA,
        gpu_resource: str,
        class_prefix: str,
        wait_s: float,
        clock: Callable[[], float] = time.time,
        request_timeout: float | None = None,
        job_labels: Sequence[str] = DEFAULT_JOB_LABELS,
    ) -> None:
        from kubernetes.client import CoreV1Api

        self._core: Any = CoreV1Api(api_client)
        self.events, self.formula, self.wait_s, self.clock = events, formula, wait_s, clock
        self.names = GpuResources.of_class_prefix(gpu_resource, f"{class_prefix}/{CLASS_STEM}")
        self._reader = NodeReader(gpu_resource=gpu_resource, roce_prefix=f"{class_prefix}/{CLASS_STEM}")
        self._timeout = request_timeout
        self._job_labels = tuple(job_labels)
        self._told: dict[str, str] = {}  # pod uid -> the last note it was told (once per change)
        self._stranded_told: set[str] = set()  # pods no controller owns, told their node is gone

    @classmethod
    def of(
        cls, api_client: Any, settings: ControllerSettings, events: EventRecorder, clock: Callable[[], float]
    ) -> PlanGates:
        """The loop as the controller's settings configure it."""
        return cls(
            api_client,
            events=events,
            formula=settings.plan_formula,
            gpu_resource=settings.gpu_resource,
            class_prefix=settings.class_prefix,
            wait_s=settings.plan_gates_wait_s,
            clock=clock,
            request_timeout=settings.api_timeout_s,
        )

    # -- the pass ----------------------------------------------------------------------------

    def run(self, nodes: list[dict[str, Any]], pods: Callable[[], list[dict[str, Any]]]) -> list[Placed]:
        """Rounds until one places nothing (at most :data:`ROUNDS_PER_PASS`); the jobs placed.
        ``nodes``: the pass's Nodes; ``pods``: every pod (listed once a pass, when needed)."""
        placed = []
        for _ in range(ROUNDS_PER_PASS):
            done = self.round(nodes, pods)
            if done is None:
                break
            placed.append(done)
        return placed

    def round(self, nodes: list[dict[str, Any]], pods: Callable[[], list[dict[str, Any]]]) -> Placed | None:
        """One round (the module docstring): the job placed, or None."""
        now = self.clock()
        gated, promised, pinned = self._waiting()
        listed = {n.get("metadata", {}).get("name") for n in nodes if isinstance(n, dict)}
        for stranded, node in pinned if listed else ():  # no Nodes listed at all: nothing to judge by
            if node not in listed:
                self._strand(stranded, node)
        waiting = {_uid(p) for p in gated}
        self._told = {uid: note for uid, note in self._told.items() if uid in waiting}
        workers = []
        for pod in gated:
            try:
                workers.append(read_worker(pod, names=self.names, now=now, job_labels=self._job_labels))
            except InvalidInput as exc:
                self._release([pod], exc.message)
        jobs, refused = group(workers)
        for job, why in refused:
            self._release([w.pod for w in job.members], why)
        ready = []
        for job in jobs:
            if job.recorded is not None:
                self._resume(job)
            elif job.complete:
                ready.append(job)
            elif now - job.since > self.wait_s:
                self._release(
                    [w.pod for w in job.members],
                    f"only {len(job.members)} of its {job.workers} workers exist after {self.wait_s:.0f} s",
                )
            else:
                self._tell(job, f"waiting for the {job.workers} workers of job {job.key}: {len(job.members)} exist")
        if not ready:
            return None
        bound = bound_pods(pods())  # grouped once: the GPUs and the CPU and memory they hold
        facts = {f.name: less_gpus(f, promised.get(f.name, 0)) for f in node_facts(nodes, bound, self._reader)}
        rooms = _rooms(nodes, bound, pinned)
        empty = _rooms(nodes, {}, ())  # what each node's allocatable holds, running nothing else
        decisions: dict[str, Decision] = {}
        by_key = {job.key: job for job in ready}
        for job in ready:
            try:
                allowed = [facts[name] for name in allowed_nodes(job, nodes) if name in facts]
            except InvalidInput as exc:
                self._release([w.pod for w in job.members], exc.message)
                continue
            needs = most(pod_needs(w.pod) for w in job.members)
            never = never_fits(job, allowed, {name: workers_fitting(room, needs) for name, room in empty.items()})
            if never is not None:
                self._release([w.pod for w in job.members], never)
                continue
            candidates = [  # a node's free GPUs, as far as the workers' CPU and memory fit there too
                less_gpus(f, f.free_count - gpus_for(f.free_count, rooms[f.name], needs, job.gpus_each))
                if f.name in rooms
                else f
                for f in allowed
            ]
            decisions[job.key] = plan_job(job, candidates, now=now, formula=self.formula)
        order = queue_order(decisions.items())
        head = next((key for key in order if decisions[key].plan is not None), None)
        for key in order:
            if decisions[key].plan is None:
                job = by_key[key]
                self._tell(
                    job,
                    f"job {key} waits for {job.workers} x {job.gpus_each} free GPUs on the nodes it may run on "
                    "(none fit now; the next rounds try again)",
                )
        if head is None:
            return None
        return self._place(by_key[head], decisions[head])

    # -- reading -----------------------------------------------------------------------------

    def _waiting(self) -> tuple[list[dict[str, Any]], dict[str, int], list[tuple[dict[str, Any], str]]]:
        """The gated pods; per node the GPUs of the pods the loop pinned there that are not
        bound yet (promised: the node's published free GPUs do not count them); and those
        pods with their node."""
        items = raw(
            lambda **kw: self._core.list_pod_for_all_namespaces(
                field_selector="spec.nodeName=,status.phase=Pending", limit=MAX_PENDING, **kw
            ),
            timeout=self._timeout,
        )["items"]
        gated: list[dict[str, Any]] = []
        promised: dict[str, int] = {}
        pinned: list[tuple[dict[str, Any], str]] = []
        for pod in items if isinstance(items, list) else []:
            if not isinstance(pod, dict) or (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue  # a pod being deleted is neither planned nor promised GPUs
            try:
                if PLAN_GATE in gates(pod):
                    gated.append(pod)
            except InvalidInput:
                continue  # gates of a shape no patch could lift one of: not this loop's pod
            node = _pinned(pod)
            if node is not None:
                pinned.append((pod, node))
                try:
                    promised[node] = promised.get(node, 0) + pod_gpus(pod.get("spec"), self.names)
                except QuantityError:
                    continue
        return gated, promised, pinned

    # -- acting ------------------------------------------------------------------------------

    def _place(self, job: WaitingJob, decision: Decision) -> Placed | None:
        """Pin every worker to its node of the plan and record the plan, then lift every gate."""
        plan = decision.plan
        assert plan is not None
        try:
            where = assign(job, plan.allocation)
        except InvalidInput as exc:  # the plan is whole workers by construction
            self._release([w.pod for w in job.members], exc.message)
            return None
        for w in job.members:
            note = planned_note(job, decision, self.formula, where[w.name])
            if not self._pin(w, where[w.name], note):
                return None  # changed meanwhile: the next round finishes it from what is recorded
        lifted = self._lift(job.members)
        shares = ", ".join(f"{count} on {node}" for node, count in plan.allocation)
        slack = plan.deadline - plan.t_end
        log.info(
            "plan for job %s: %d GPUs (%s), %s, %d workers released, slack %.0f s",
            job.key,
            plan.n_gpu,
            shares,
            decision.branch,
            lifted,
            slack,
        )
        for w in job.members[:EVENT_PODS]:
            self._event(
                w.pod,
                "Normal",
                "DeadlinePlanned",
                f"job {job.key}: {plan.n_gpu} GPUs ({shares}; {decision.branch}, formula {self.formula}); "
                f"this worker pinned to {where[w.name]}, its scheduling gate lifted",
            )
        return Placed(job.key, plan.allocation, decision.branch)

    def _resume(self, job: WaitingJob) -> None:
        """Finish a job whose workers an earlier round pinned in part: the recorded plan's
        remaining slots for the others, then every gate lifted."""
        recorded = job.recorded
        assert recorded is not None
        try:
            where = assign(job, recorded_allocation(recorded))
        except InvalidInput as exc:
            self._release([w.pod for w in job.members], f"its recorded plan cannot be finished: {exc.message}")
            return
        for w in job.members:
            if w.pinned is None:
                body = podannotations.encode_planned(
                    recorded.gpus, recorded.nodes, recorded.branch, recorded.formula, recorded.deadline, where[w.name]
                )
                if not self._pin(w, where[w.name], body):
                    return
        self._lift(job.members)
        log.info("plan for job %s finished from its recorded plan", job.key)

    def _pin(self, w: Worker, node: str, note: str) -> bool:
        pod = copy.deepcopy(dict(w.pod))
        try:
            ops: JSONPatch = [{"op": "test", "path": "/metadata/resourceVersion", "value": w.resource_version}]
            ops += require_node(pod, node)
            ops += set_annotation(pod, PLANNED_ANNOTATION, note)
        except InvalidInput as exc:
            self._release([w.pod], exc.message)
            return False
        return self._patch(w.namespace, w.name, ops)

    def _lift(self, members: Iterable[Worker]) -> int:
        lifted = 0
        for w in members:
            try:
                ops = remove_gate(w.pod, PLAN_GATE)
            except InvalidInput:
                continue
            if ops and self._patch(w.namespace, w.name, ops):
                lifted += 1
        return lifted

    def _release(self, pods: Sequence[Mapping[str, Any]], why: str) -> None:
        """Lift the gate of ``pods`` unplanned, each told why by a Warning Event."""
        for pod in pods:
            namespace, name = _ident(pod)
            if not name:
                log.warning("a gated pod without a usable name cannot be released: %s", why)
                continue
            try:
                ops = remove_gate(pod, PLAN_GATE)
            except InvalidInput:
                continue
            if ops and self._patch(namespace, name, ops):
                log.warning("pod %s/%s: deadline plan not applied, gate lifted: %s", namespace, name, why)
                self._event(
                    pod,
                    "Warning",
                    "DeadlinePlanRefused",
                    f"deadline plan not applied, the pod is scheduled as it asked: {why}",
                )

    def _strand(self, pod: Mapping[str, Any], node: str) -> None:
        """A pod the loop pinned to ``node``, which the pass no longer lists: evicted when a
        controller owns it (it comes back gated and is planned again), else told once."""
        namespace, name = _ident(pod)
        if not name:
            return
        if not _controlled(pod):
            key = _uid(pod)
            if key not in self._stranded_told:
                self._stranded_told.add(key)
                note = f"pinned by its deadline plan to node {node}, which no longer exists: it cannot be scheduled"
                self._event(
                    pod, "Warning", "DeadlinePlanNodeGone", f"{note}; no controller owns it, delete it to plan it again"
                )
            return
        refused = evict(self._core, namespace, name, timeout=self._timeout)
        if refused is not None:  # a PodDisruptionBudget (429), or gone meanwhile (404): the next round
            log.info("pod %s/%s pinned to the gone node %s: eviction refused (%s)", namespace, name, node, refused)
            return
        log.warning("pod %s/%s was pinned to node %s, which no longer exists: evicted", namespace, name, node)
        self._event(
            pod,
            "Warning",
            "DeadlinePlanNodeGone",
            f"pinned by its deadline plan to node {node}, which no longer exists: evicted so that its "
            "controller makes it anew, to be planned again",
        )

    def _patch(self, namespace: str, name: str, ops: JSONPatch) -> bool:
        """One JSON Patch; False when the pod is gone or changed meanwhile (a test failed)."""
        try:
            with translated(f"pod {namespace}/{name}"):
                self._core.patch_namespaced_pod(
                    name,
                    namespace,
                    ops,
                    _content_type=JSON_PATCH,
                    _request_timeout=self._timeout,
                    _preload_content=False,
                )
        except (NotFound, Conflict, InvalidInput) as exc:
            log.info("pod %s/%s: left for the next round (%s)", namespace, name, exc)
            return False
        return True

    def _tell(self, job: WaitingJob, note: str) -> None:
        """A Normal Event on the job's workers, once per change of what they are told."""
        for w in job.members[:EVENT_PODS]:
            key = w.uid or f"{w.namespace}/{w.name}"
            if self._told.get(key) != note:
                self._told[key] = note
                self._event(w.pod, "Normal", "DeadlinePlanWaiting", note)

    def _event(self, pod: Mapping[str, Any], kind: str, reason: str, note: str) -> None:
        regarding = ObjectRef.of({**pod, "apiVersion": "v1", "kind": "Pod"})
        self.events.record(regarding, type=kind, reason=reason, action="Plan", note=note)


def _ident(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    namespace, name = meta.get("namespace") or "default", meta.get("name")
    ok = isinstance(namespace, str) and isinstance(name, str) and 0 < len(name) <= 253 and len(namespace) <= 63
    return (str(namespace), str(name)) if ok else ("", "")


def _uid(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return ""
    uid = meta.get("uid")
    return uid if isinstance(uid, str) and uid else f"{meta.get('namespace')}/{meta.get('name')}"


def _rooms(
    nodes: Sequence[Mapping[str, Any]],
    bound: Mapping[str, Sequence[Mapping[str, Any]]],
    pinned: Sequence[tuple[dict[str, Any], str]],
) -> dict[str, Room]:
    """Each node's CPU and memory left (:mod:`scheduling.noderoom`): its allocatable less the
    active pods bound to it (``bound``: :func:`~dsagent.controller.migration.bound_pods`) and
    the pods the loop pinned there that are not bound yet."""
    holding = {node: list(on) for node, on in bound.items()}
    for waiting, where in pinned:
        holding.setdefault(where, []).append(waiting)
    rooms = {}
    for node in nodes:
        meta = node.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if isinstance(name, str) and name:
            rooms[name] = node_room(node, holding.get(name, ()))
    return rooms


def _controlled(pod: Mapping[str, Any]) -> bool:
    """Whether a controller owns ``pod`` (an owner reference with ``controller: true``)."""
    meta = pod.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    return isinstance(owners, list) and any(isinstance(o, dict) and o.get("controller") is True for o in owners)


def _pinned(pod: Mapping[str, Any]) -> str | None:
    """The node the loop pinned ``pod`` to (its recorded ``node`` and its required affinity
    agree), or None."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    text = annotations.get(PLANNED_ANNOTATION) if isinstance(annotations, dict) else None
    if text is None:
        return None
    try:
        node = podannotations.decode_planned(text).node
    except InvalidInput:
        return None
    return node if node is not None and required_node(pod) == node else None


__all__ = ["EVENT_PODS", "MAX_PENDING", "ROUNDS_PER_PASS", "PlanGates", "Placed"]
