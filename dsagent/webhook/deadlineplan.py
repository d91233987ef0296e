"""Deadline plans applied at admission (``docs/design.md#deadline-plans``).

A pod that says ``dsagent.io/deadline-plan: apply`` and describes its job with the time-model
annotations (:mod:`scheduling.timemodel`: ``dsagent.io/params``, ``step-seconds``, ``steps``,
and ``dsagent.io/deadline`` or ``dsagent.io/deadline-factor``) gets the plan the deadline
design chooses for it, not only advice:

1. the nodes are read as the extender reads them (the agents' published topology and free
   GPUs, :class:`scheduling.nodeinfo.NodeReader`);
2. :func:`scheduling.plans.plan_on_nodes` runs steps 3-4 (plans of the powers of two and the
   count asked for, up to ``dsagent.io/max-gpus`` or the largest node's free GPUs; (12) by the
   webhook's formula, ``efficiency`` by default; best fit);
3. the patch sets the pod's GPU request (limits and requests of its one GPU container) to the
   plan's count, adds a required node affinity to the plan's node (``matchFields``
   ``metadata.name``, ANDed into every existing required term), and records the plan in
   ``dsagent.io/planned``. kube-scheduler, with the extender, then places the pod there.
4. The GPUs given are remembered for a minute, or until the node republishes its free GPUs,
   and the next plans of this replica are made over what is left (:class:`PlanPolicy`).

A pod is one worker: its plan is a single-node plan. A worker of a job of several workers
(``dsagent.io/workers`` > 1) is not planned here: with the plan loop on, it is admitted with
a scheduling gate (:mod:`dsagent.webhook.plangate`) and the Dataset controller plans the whole
job across nodes once all its workers exist; otherwise it keeps its request, with a warning.
An unusable annotation, no node with free GPUs, or a pod already bound: the pod is admitted
as it is, with a warning saying why.

Who calls it: :func:`dsagent.webhook.server.decide`, before the GPU class policy, which then
sees the planned request. The pure part is :func:`apply_plan`; :class:`KubePlanNodes` lists
the Nodes through an unmodified ``kubernetes`` ApiClient.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from dsagent.kube import nodestate
from dsagent.kube.nodewatch import NodeWatch, current
from dsagent.webhook.jsonpatch import JSONPatch, escape
from dsplatform import kubetime
from dsplatform.errors import InvalidInput
from dsplatform.gpus import GpuResources, QuantityError, parse_quantity
from dsplatform.wire import podannotations
from scheduling.gatedjobs import less_gpus
from scheduling.kubeobjects import Node
from scheduling.nodeinfo import NodeFacts, NodeReader
from scheduling.pinning import require_node
from scheduling.plans import plan_on_nodes, plan_sizes
from scheduling.timemodel import DEFAULT_FORMULA, Plan, parse_profile

log = logging.getLogger("dsagent.webhook")
WARNING = "dsplatform: deadline plan not applied, the pod keeps its request: "


@dataclass(frozen=True)
class PlanOutcome:
    """The plan part of the webhook's answer; ``pod`` is the pod with ``patch`` applied
    (what the GPU class policy reads next)."""

    pod: Mapping[str, Any]
    patch: JSONPatch = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    plan: Plan | None = None


def wants_plan(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for its plan to be applied (an unreadable value counts: it is
    answered with a warning)."""
    try:
        return podannotations.plan_mode(pod) == podannotations.PLAN_APPLY
    except InvalidInput:
        return True


def apply_plan(
    pod: Mapping[str, Any],
    nodes: Sequence[NodeFacts],
    *,
    now: float,
    names: GpuResources,
    formula: str = DEFAULT_FORMULA,
) -> PlanOutcome:
    """The plan for ``pod`` over ``nodes`` as a JSONPatch (see the module docstring); never
    raises on pod data: what cannot be done is a warning and no patch."""
    try:
        return _apply(pod, nodes, now=now, names=names, formula=formula)
    except InvalidInput as exc:
        return PlanOutcome(pod, warnings=(WARNING + exc.message,))


def _apply(
    pod: Mapping[str, Any], nodes: Sequence[NodeFacts], *, now: float, names: GpuResources, formula: str
) -> PlanOutcome:
    if podannotations.plan_mode(pod) != podannotations.PLAN_APPLY:
        return PlanOutcome(pod)
    meta = pod.get("metadata") or {}
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not isinstance(meta, dict):
        raise InvalidInput("the pod's spec or metadata is not an object")
    if spec.get("nodeName"):
        raise InvalidInput(f"the pod is already bound to {spec['nodeName']}")
    annotations = meta.get("annotations") or {}
    created = kubetime.parse_or_none(meta.get("creationTimestamp")) or now  # unset at admission
    job, problem = parse_profile(annotations, created)
    if job is None:
        raise InvalidInput(problem or "the pod has no time-model annotations (dsagent.io/params, step-seconds, steps)")
    if job.workers > 1:
        raise InvalidInput(
            f"a job of {job.workers} workers is admitted one pod at a time; the webhook plans one-pod jobs, "
            "the controller's plan loop multi-worker ones (DSAGENT_WEBHOOK_PLAN_GATES, chart controller.planGates)"
        )
    index, asked = _gpu_container(spec, names)
    cap = podannotations.max_gpus_of(pod)
    most = max((len(n.free_gpus or ()) for n in nodes), default=0)
    if most == 0:
        raise InvalidInput("no node publishes free GPUs")
    top = min(cap, most) if cap is not None else most
    decision = plan_on_nodes(
        job,
        nodes,
        now=now,
        max_gpus=top,
        formula=formula,
        sizes=plan_sizes(asked, top),
        cross_node=False,
    )
    chosen = decision.plan
    if chosen is None:
        raise InvalidInput("no plan: no node can run the job on the GPUs it has free (eq. 11 or none free)")
    (node, gpus), *_ = chosen.allocation
    deadline = kubetime.format_time(job.deadline) if job.deadline is not None else None
    note = podannotations.encode_planned(gpus, {node: gpus}, decision.branch, formula, deadline)
    patched = copy.deepcopy(dict(pod))
    ops: JSONPatch = []
    ops += _set_gpus(patched, index, gpus, names)
    ops += require_node(patched, node)
    patched["metadata"].setdefault("annotations", {})[podannotations.PLANNED_ANNOTATION] = note
    path = "/metadata/annotations/" + escape(podannotations.PLANNED_ANNOTATION)
    ops.append({"op": "add", "path": path, "value": note})
    return PlanOutcome(patched, ops, (), chosen)


def _gpu_container(spec: Mapping[str, Any], names: GpuResources) -> tuple[int, int]:
    """The index of the one app container asking for GPUs, and how many it asks for."""
    found: list[tuple[int, int]] = []
    containers = spec.get("containers")
    for index, container in enumerate(containers if isinstance(containers, list) else []):
        resources = container.get("resources") if isinstance(container, dict) else None
        amounts = [
            _quantity(value)
            for kind in ("limits", "requests")
            for name, value in _entries(resources, kind).items()
            if isinstance(name, str) and names.is_gpu(name)
        ]
        if amounts:
            found.append((index, max(amounts)))
    if len(found) != 1:
        raise InvalidInput(f"a plan needs exactly one container asking for GPUs, the pod has {len(found)}")
    return found[0]


def _entries(resources: Any, kind: str) -> dict[str, Any]:
    """A container's ``limits`` or ``requests`` map; InvalidInput when it is not one."""
    if resources is None:
        return {}
    if not isinstance(resources, dict):
        raise InvalidInput("a container's resources are not an object")
    entries = resources.get(kind)
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        raise InvalidInput(f"a container's resources.{kind} is not an object")
    return entries


def _quantity(value: Any) -> int:
    try:
        return parse_quantity(value)
    except QuantityError:
        raise InvalidInput(f"GPU quantity {str(value)[:32]!r} is not a whole number") from None


def _set_gpus(pod: dict[str, Any], index: int, gpus: int, names: GpuResources) -> JSONPatch:
    """Every GPU entry of the container's limits and requests set to ``gpus``."""
    ops: JSONPatch = []
    resources = pod["spec"]["containers"][index]["resources"]
    for kind in ("limits", "requests"):
        entries = resources.get(kind) or {}
        for name in list(entries):
            if isinstance(name, str) and names.is_gpu(name):
                entries[name] = str(gpus)
                path = f"/spec/containers/{index}/resources/{kind}/{escape(name)}"
                ops.append({"op": "replace", "path": path, "value": str(gpus)})
    return ops


class KubePlanNodes:
    """The Nodes as the extender reads them, at every call (only pods that opt in ask): from
    ``watch`` (kept by list+watch), else listed through an unmodified ``kubernetes`` ApiClient."""

    def __init__(
        self,
        api_client: Any,
        reader: NodeReader,
        *,
        request_timeout: float = 2.0,
        watch: NodeWatch | None = None,
        reads: Callable[[str], object] | None = None,
    ) -> None:
        from kubernetes import client

        self._watch = watch
        self._reads = reads  # told where each call read them (the webhook's node_reads metric)
        self._core: Any = client.CoreV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._reader = reader
        self._timeout = request_timeout

    def __call__(self) -> list[NodeFacts]:
        list_all = partial(nodestate.list_nodes, self._core, self._custom, timeout=self._timeout, resource_version="0")
        items = current(self._watch, list_all, self._reads)
        nodes = [n for n in items if not (n.get("spec") or {}).get("unschedulable")]
        return [self._reader.read(cast(Node, node)) for node in nodes]


@dataclass(frozen=True)
class _Promise:
    gpus: int
    until: float
    resource_version: str | None  # of the node when promised: a republished node has counted it


@dataclass
class PlanPolicy:
    """What the server calls: the nodes' source, the clock, the GPU names and the formula.

    It remembers the GPUs it gave planned pods for ``promise_s`` seconds, or until the node
    publishes its free GPUs again, and plans later pods over what is left: pods admitted in a
    burst are not all planned onto the same free GPUs (per replica: another replica does not
    see this one's promises)."""

    nodes: Callable[[], Sequence[NodeFacts]]
    clock: Callable[[], float]
    names: GpuResources = field(default_factory=GpuResources)
    formula: str = DEFAULT_FORMULA
    promise_s: float = 60.0
    _promises: dict[str, list[_Promise]] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def decide(self, pod: Mapping[str, Any]) -> PlanOutcome:
        if not wants_plan(pod):
            return PlanOutcome(pod)
        now = self.clock()
        with self._lock:  # one plan at a time: each sees the promises before it
            nodes = [self._less_promised(n, now) for n in self.nodes()]
            outcome = apply_plan(pod, nodes, now=now, names=self.names, formula=self.formula)
            if outcome.plan is not None:
                (node, gpus), *_ = outcome.plan.allocation
                version = next((n.resource_version for n in nodes if n.name == node), None)
                self._promises.setdefault(node, []).append(_Promise(gpus, now + self.promise_s, version))
        if outcome.plan is not None:
            log.info("pod %s: deadline plan %d GPUs on %s", _name(pod), gpus, node)
        return outcome

    def _less_promised(self, facts: NodeFacts, now: float) -> NodeFacts:
        """``facts`` with the GPUs still promised on the node taken out of its free ones."""
        live = [
            p
            for p in self._promises.get(facts.name, ())
            if p.until > now and (p.resource_version is None or p.resource_version == facts.resource_version)
        ]
        if live:
            self._promises[facts.name] = live
        else:
            self._promises.pop(facts.name, None)
            return facts
        return less_gpus(facts, sum(p.gpus for p in live))


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "pod")


__all__ = ["KubePlanNodes", "PlanOutcome", "PlanPolicy", "apply_plan", "wants_plan"]
