"""The CPU and memory a node has left for the workers of a job: kube-scheduler's resource fit
for the two resources every training pod asks for, as a plan must respect it.

Who calls it: the Dataset controller's plan loop (:mod:`dsagent.controller.plangates`), which
pins each worker of a gated job to a node with a required node affinity: a node whose free
GPUs fit the worker but whose CPU or memory do not would leave it pending until they free.
The loop gives each node, per job, only the GPUs of as many workers as its CPU and memory
hold (:func:`gpus_for`).

What is read, as the scheduler's ``NodeResourcesFit`` reads it: the node's
``status.allocatable`` ``cpu`` and ``memory``, less the effective requests of the active pods
bound to it (:func:`dsplatform.gpus.effective_requests`: app containers and sidecars, or the
largest init moment) and of the pods pinned to it and not bound yet. A pod's overhead
(``spec.overhead``, from its RuntimeClass) is added. Not read: other resources (ephemeral
storage, hugepages, extended resources besides the GPUs the plan counts), and pods the
node's kubelet runs outside the API (static pods are mirrored, and counted). A node whose
allocatable does not say a resource is not limited by it here (the scheduler decides).

Pods and nodes are hostile input: a quantity that cannot be read counts as nothing asked of
a pod, and as nothing known of a node. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dsplatform.gpus import QuantityError, effective_requests, parse_milli, parse_quantity

CPU = "cpu"
MEMORY = "memory"


@dataclass(frozen=True)
class Needs:
    """One pod's effective CPU (thousandths of a core) and memory (bytes) requests."""

    cpu_milli: int = 0
    memory: int = 0


@dataclass(frozen=True)
class Room:
    """What a node has left of its allocatable CPU and memory; None: the node does not say."""

    cpu_milli: int | None
    memory: int | None


def pod_needs(pod: Mapping[str, Any]) -> Needs:
    """``pod``'s effective CPU and memory requests, its overhead added."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    try:
        cpu = effective_requests(spec, lambda r: r == CPU, parse_milli).get(CPU, 0)
    except QuantityError:
        cpu = 0
    try:
        memory = effective_requests(spec, lambda r: r == MEMORY, parse_quantity).get(MEMORY, 0)
    except QuantityError:
        memory = 0
    overhead = spec.get("overhead")
    if isinstance(overhead, Mapping):
        cpu += _read(overhead.get(CPU), parse_milli) or 0
        memory += _read(overhead.get(MEMORY), parse_quantity) or 0
    return Needs(max(0, cpu), max(0, memory))


def most(needs: Iterable[Needs]) -> Needs:
    """The most CPU and the most memory any of ``needs`` asks (what each worker of a job is
    planned for when its workers ask differently)."""
    listed = list(needs)
    return Needs(max((n.cpu_milli for n in listed), default=0), max((n.memory for n in listed), default=0))


def node_room(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> Room:
    """``node``'s allocatable CPU and memory less what ``pods`` (those bound or pinned to it
    that still hold their requests) need."""
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    allocatable = allocatable if isinstance(allocatable, Mapping) else {}
    cpu = _read(allocatable.get(CPU), parse_milli)
    memory = _read(allocatable.get(MEMORY), parse_quantity)
    for pod in pods:
        needs = pod_needs(pod)
        cpu = None if cpu is None else cpu - needs.cpu_milli
        memory = None if memory is None else memory - needs.memory
    return Room(cpu, memory)


def workers_fitting(room: Room, needs: Needs) -> int | None:
    """How many workers needing ``needs`` each fit in ``room``; None: no limit known."""
    counts = [
        max(0, left) // each
        for left, each in ((room.cpu_milli, needs.cpu_milli), (room.memory, needs.memory))
        if left is not None and each > 0
    ]
    return min(counts) if counts else None


def gpus_for(free_gpus: int, room: Room, needs: Needs, gpus_each: int) -> int:
    """Of a node's ``free_gpus``, those a job may plan on: the GPUs of as many of its workers
    (``gpus_each`` GPUs and ``needs`` each) as the node's CPU and memory hold."""
    fitting = workers_fitting(room, needs)
    if fitting is None:
        return free_gpus
    return min(free_gpus, fitting * gpus_each)


def _read(value: Any, parse: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(parse(value))
    except QuantityError:
        return None


__all__ = ["CPU", "MEMORY", "Needs", "Room", "gpus_for", "most", "node_room", "pod_needs", "workers_fitting"]
