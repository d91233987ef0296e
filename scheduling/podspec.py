"""What a pod asks of the scheduler: its datasets, its GPUs and its job.

``read_pod`` turns a raw v1.Pod (as kube-scheduler sends it, or as the watch cache holds
it) into a frozen :class:`PodRequest`. It never raises on bad pod data: a dataset
annotation that cannot be parsed is recorded in ``datasets_error`` (docs/design.md#dataset-affinity: "the
pod's dataset information cannot be parsed" case, scored 0), and an unreadable GPU
quantity counts as 0 with ``gpus_error`` set. The GPU count is :mod:`dsplatform.gpus`'s rule,
the one the webhook and the agent count with. Called by the framework and the view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsplatform.errors import InvalidInput
from dsplatform.gpus import GpuResources, gpu_requests
from dsplatform.jobs import job_key, subnet_required, workers_of
from dsplatform.kubetime import parse_or_none
from dsplatform.wire import podannotations
from gpu_topology.classsets import SEPARATOR, parse_resource_name, parse_set
from scheduling.kubeobjects import Pod
from scheduling.timemodel import JobProfile, parse_profile

DATASETS_ANNOTATION = podannotations.DATASETS_ANNOTATION
#: ``required``: the filter fails nodes not holding the current version of every dataset
#: the pod names; anything else (absent, ``preferred``, garbage) keeps today's preference.
AFFINITY_ANNOTATION = "dsagent.io/dataset-affinity"

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class DatasetWant:
    """One dataset a pod asks for; ``digest`` pins the version when the pod knows it."""

    name: str
    digest: str | None = None
    size_bytes: int | None = None  # when the Dataset resource publishes it


@dataclass(frozen=True)
class PodRequest:
    """The scheduling-relevant facts of one pod."""

    key: str  # "namespace/name"
    namespace: str = "default"
    datasets: tuple[DatasetWant, ...] = ()
    datasets_error: str | None = None  # set when the annotation could not be parsed
    gpus: int = 0  # GPUs requested (plain and RoCE-class resources)
    gpu_class: str | None = None  # the RoCE class the pod requests explicitly
    gpus_error: str | None = None
    job: str | None = None  # "namespace/job" from the first job label found
    time: JobProfile | None = None  # the dsagent.io/ time-model annotations, when given
    time_error: str | None = None  # set when they could not be used (scored 0)
    affinity_required: bool = False  # dsagent.io/dataset-affinity: required
    gpu_classes: tuple[str, ...] = ()  # every RoCE class the pod requests (its class set), rail order
    workers: int = 1  # dsagent.io/workers: the job's worker count (1 when absent or unreadable)
    subnet_required: bool = False  # dsagent.io/subnet-placement: required (docs/design.md#class-sets)
    queue: tuple[int, float] = (0, 0.0)  # its place in kube-scheduler's queue: (-priority, created epoch s)


def read_pod(pod: Pod, *, job_labels: Sequence[str], gpu_resource: str, roce_prefix: str) -> PodRequest:
    """The :class:`PodRequest` of a raw v1.Pod; tolerant of any shape."""
    meta: Any = pod.get("metadata") if isinstance(pod, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else "default"
    name = meta.get("name") if isinstance(meta.get("name"), str) else ""
    annotations = _str_map(meta.get("annotations"))
    datasets, datasets_error = parse_datasets(annotations.get(DATASETS_ANNOTATION))
    gpus, gpu_class, gpus_error, gpu_classes = _gpus(pod, gpu_resource, roce_prefix)
    labels = _str_map(meta.get("labels"))
    job = job_key(namespace, labels, job_labels)
    created = parse_or_none(meta.get("creationTimestamp"))
    time, time_error = parse_profile(annotations, created)
    return PodRequest(
        key=f"{namespace}/{name}",
        namespace=namespace,
        datasets=datasets,
        datasets_error=datasets_error,
        gpus=gpus,
        gpu_class=gpu_class,
        gpus_error=gpus_error,
        job=job,
        time=time,
        time_error=time_error,
        affinity_required=annotations.get(AFFINITY_ANNOTATION, "").strip().lower() == "required",
        gpu_classes=gpu_classes,
        workers=workers_of(annotations),
        subnet_required=subnet_required(annotations),
        queue=queue_place(pod, created),
    )


def queue_place(pod: Pod, created: float | None) -> tuple[int, float]:
    """The pod's place in kube-scheduler's queue (its default order, PrioritySort: higher
    priority first, then older): ``(-spec.priority, creation epoch seconds)``; a missing
    or unreadable priority is 0, a missing time the queue's end."""
    spec: Any = pod.get("spec") if isinstance(pod, dict) else None
    priority = spec.get("priority") if isinstance(spec, dict) else None
    if not isinstance(priority, int) or isinstance(priority, bool):
        priority = 0
    return (-priority, created if created is not None else float("inf"))


def parse_datasets(text: str | None) -> tuple[tuple[DatasetWant, ...], str | None]:
    """The annotation value -> (datasets, error). Absent or blank means no datasets.

    Read by the platform's one rule (:mod:`dsplatform.wire.podannotations`, as the webhook
    and the node agent read it); a value it refuses is an error here, never raised.
    """
    try:
        refs = podannotations.parse(text)
    except InvalidInput as exc:
        return (), str(exc)
    return tuple(DatasetWant(ref.name, ref.digest) for ref in refs), None


def _gpus(pod: Pod, gpu_resource: str, roce_prefix: str) -> tuple[int, str | None, str | None, tuple[str, ...]]:
    spec: Any = pod.get("spec") if isinstance(pod, dict) else None
    names = GpuResources.of_class_prefix(gpu_resource, roce_prefix)
    try:
        totals = gpu_requests(spec, names)
    except ValueError as exc:
        return 0, None, f"unreadable resource request: {exc}", ()
    by_class = {c: q for r, q in totals.items() if (c := names.class_of(r)) is not None}
    gpus = sum(totals.values())
    # A class-set resource (gpu-roce1-2: a worker of a job's class set, docs/design.md#class-sets)
    # names its classes; a plain class names itself.
    sets = {name: parse_resource_name(name, names.stem) for name in by_class}
    classes = parse_set(SEPARATOR.join(c for name in sorted(by_class) for c in (sets[name] or (name,))))
    plain = {name: q for name, q in by_class.items() if len(sets[name]) <= 1}
    # A pod asking for two classes at once is unusual; the larger share names its class.
    gpu_class = max(sorted(plain), key=lambda c: plain[c]) if plain and len(plain) == len(by_class) else None
    return gpus, gpu_class, None, classes


def pod_is_active(pod: Pod) -> bool:
    """Whether a pod still holds its node's resources (bound and not finished)."""
    status: Any = pod.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    return phase not in _TERMINAL_PHASES


def _str_map(value: Any, *, any_value: bool = False) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and (any_value or isinstance(v, str))}


__all__ = [
    "AFFINITY_ANNOTATION",
    "DATASETS_ANNOTATION",
    "DatasetWant",
    "PodRequest",
    "parse_datasets",
    "pod_is_active",
    "queue_place",
    "read_pod",
]
