"""The scheduling gate on each worker of a multi-worker job that asks for an applied deadline
plan (``docs/design.md#deadline-plans``).

A pod that says ``dsagent.io/deadline-plan: apply`` and belongs to a job of several workers
(``dsagent.io/workers`` > 1) cannot get its job's plan at admission: its workers are created
one by one, and a plan across nodes is a plan for all of them. With the plan loop on
(``DSAGENT_WEBHOOK_PLAN_GATES``, the chart's ``controller.planGates.enabled``), the webhook
admits each such worker with the scheduling gate
:data:`~dsplatform.wire.podannotations.PLAN_GATE` and nothing else changed: kube-scheduler
leaves a gated pod alone, and the Dataset controller's plan loop
(:mod:`dsagent.controller.plangates`) plans the whole job once all its workers exist, pins
each worker to its node and lifts the gate. Gates can only be set at creation, which is why
the webhook sets it.

A worker is gated only when the loop can read it: the pod is read by the loop's own rule,
:func:`scheduling.gatedjobs.read_worker` (a job label or controlling owner, the time-model
annotations, GPUs, no inter-pod rules); otherwise it is admitted as it asked, with a warning
saying why. Who calls it: :func:`dsagent.webhook.server.decide`, before the plan step.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dsagent.webhook.deadlineplan import WARNING, PlanOutcome
from dsplatform.errors import InvalidInput
from dsplatform.gpus import GpuResources
from dsplatform.wire import podannotations
from scheduling.gatedjobs import read_worker
from scheduling.pinning import add_gate
from scheduling.timemodel import parse_profile

log = logging.getLogger("dsagent.webhook")


def multi_worker(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` asks for an applied plan and its time-model annotations name a job of
    several workers (an unreadable value counts as not: the plan step answers it)."""
    try:
        if podannotations.plan_mode(pod) != podannotations.PLAN_APPLY:
            return False
    except InvalidInput:
        return False
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict):
        return False
    profile, _ = parse_profile(annotations, 0.0)
    return profile is not None and profile.workers > 1


def gate(pod: Mapping[str, Any], *, names: GpuResources, now: float) -> PlanOutcome:
    """The gate for a worker of a multi-worker job that asks for a plan (see the module
    docstring); a warning and no patch when the plan loop could not read the pod."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    try:
        if not isinstance(spec, dict) or not isinstance(meta, dict):
            raise InvalidInput("the pod's spec or metadata is not an object")
        if spec.get("nodeName"):
            raise InvalidInput(f"the pod is already bound to {str(spec['nodeName'])[:253]}")
        named = {"namespace": "default", **meta}
        if not named.get("name"):  # at admission a controller's pod often has only a generateName
            prefix = meta.get("generateName")
            named["name"] = prefix[:253] if isinstance(prefix, str) and prefix else "pod"
        worker = read_worker({**pod, "metadata": named}, names=names, now=now)
        patched = copy.deepcopy(dict(pod))
        ops = add_gate(patched, podannotations.PLAN_GATE)
    except InvalidInput as exc:
        return PlanOutcome(pod, warnings=(WARNING + exc.message,))
    log.info("pod %s of job %s: gated for its job's deadline plan", worker.name, worker.job)
    return PlanOutcome(patched, ops)


@dataclass(frozen=True)
class GatePolicy:
    """What the server calls: the GPU names the pods' requests are read with, and the clock."""

    names: GpuResources = field(default_factory=GpuResources)
    clock: Callable[[], float] = time.time

    def decide(self, pod: Mapping[str, Any]) -> PlanOutcome | None:
        """The gate's outcome for a worker of a multi-worker job asking for a plan; None for
        any other pod (the plan step answers it)."""
        if not multi_worker(pod):
            return None
        return gate(pod, names=self.names, now=self.clock())


__all__ = ["GatePolicy", "gate", "multi_worker"]
