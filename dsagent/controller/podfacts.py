"""What pods, Nodes and Datasets say, read for the Dataset controller: the inputs of next-job
preparation (docs/design.md#next-job-preparation) and of replicas' demand. No I/O: the
controller lists the objects and acts on the answer (:mod:`dsagent.controller.nextjob`,
:mod:`dsagent.controller.warmup`).

Who calls it: :mod:`dsagent.controller` only. What it decides:

- a **running** pod (bound, not ended) frees its GPUs at its expected end: its start time
  (``status.startTime``, else its creation) plus its declared duration
  (``dsagent.io/duration``, e.g. ``2h``) or, without one, the time model's run time from its
  annotations (docs/design.md#deadline-model, eq. 1-5, on the GPUs it holds, the network's
  bandwidth: the longer, safer estimate); a pod with neither frees them at an unknown time;
- a **waiting** pod (no node yet, not ended) that names Datasets (``dsagent.io/datasets``,
  by name, in its namespace) wants their current version (``status.digest`` and
  ``status.bytes``); inline sources and Datasets not packed yet are not prepared (their
  size is unknown). Queue order: creation time, then name. Pods of one Job, StatefulSet or
  other owner are one gang (``Waiting.group``);
- a node's capacity, bytes in use and held versions come from its inventory annotation,
  its free GPUs from ``dsagent.io/free-gpus`` (else allocatable less the active pods'
  requests).

Every field is hostile input: unparseable values make a pod "unknown", never an error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from dsagent.policy.preparation import NodeState, Running, Waiting, Want
from dsplatform import published
from dsplatform.gpus import QuantityError, node_gpus
from dsplatform.gpus import pod_gpus as requested_gpus
from dsplatform.kubetime import parse_or_none
from dsplatform.names import is_digest, is_name
from dsplatform.wire.podannotations import progress_of
from scheduling.podspec import DATASETS_ANNOTATION, parse_datasets

DURATION_ANNOTATION = "dsagent.io/duration"
MAX_DURATION_S = 90 * 86400.0

JSON = dict[str, Any]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(obj.get("metadata"))


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found = _meta(obj).get("annotations")
    return {str(k): v for k, v in found.items() if isinstance(v, str)} if isinstance(found, Mapping) else {}


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    """One annotation of ``obj`` (:func:`_annotations`' value), without copying the others."""
    found = _meta(obj).get("annotations")
    value = found.get(key) if isinstance(found, Mapping) else None
    return value if isinstance(value, str) else None


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod requests, by the platform's one rule (:func:`dsplatform.gpus.pod_gpus`, the
    default resource names); hostile quantities (unreadable, or past 1024) count none."""
    try:
        value = requested_gpus(pod.get("spec"))
    except QuantityError:
        return 0
    return value if 0 <= value <= 1024 else 0


def ended(pod: Mapping[str, Any]) -> bool:
    status = _mapping(pod.get("status"))
    return status.get("phase") in ("Succeeded", "Failed") or bool(_meta(pod).get("deletionTimestamp"))


def node_of(pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec")
    name = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else None


def expected_end(pod: Mapping[str, Any]) -> float | None:
    """When a running pod is expected to end (epoch seconds), or None when it cannot tell."""
    from dsplatform.units import parse_duration

    status = _mapping(pod.get("status"))
    started = parse_or_none(status.get("startTime")) or parse_or_none(_meta(pod).get("creationTimestamp"))
    if started is None:
        return None
    annotations = _annotations(pod)
    declared = annotations.get(DURATION_ANNOTATION)
    if declared is not None:
        try:
            seconds = parse_duration(declared[:64])
        except Exception:
            return None
        return started + seconds if 0 < seconds <= MAX_DURATION_S else None
    from scheduling.timemodel import DEFAULT_BANDWIDTHS, parse_profile, t_run

    profile, _ = parse_profile(annotations, started)
    gpus = pod_gpus(pod)
    if profile is None or gpus <= 0:
        return None
    seconds = t_run(profile, gpus * max(1, profile.workers), DEFAULT_BANDWIDTHS.network)
    return started + seconds if math.isfinite(seconds) and 0 < seconds <= MAX_DURATION_S else None


def dataset_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The Dataset names a pod asks for by name (inline sources are left out)."""
    text = _annotation(pod, DATASETS_ANNOTATION)
    if text is None or len(text) > 64 * 1024:
        return ()
    # a job's pods name their Datasets with one text, read again every pass: parsed once
    return _names_of_known(text) if len(text) <= _KEPT_TEXT_MAX else _names_of(text)


#: the longest annotation whose names are kept between passes: 4,096 texts of at most 1 KiB
#: each hold a few MiB at most, whatever the pods write
_KEPT_TEXT_MAX = 1024


def _names_of(text: str) -> tuple[str, ...]:
    wants, error = parse_datasets(text)
    if error is not None:
        return ()
    return tuple(w.name for w in wants if is_name(w.name))


_names_of_known = lru_cache(maxsize=4096)(_names_of)


def current_version(dataset: Mapping[str, Any]) -> Want | None:
    """A Dataset's current version with its size, or None before it is packed."""
    status = dataset.get("status")
    if not isinstance(status, Mapping):
        return None
    digest, size = status.get("digest"), status.get("bytes")
    name = _meta(dataset).get("name")
    if not (isinstance(name, str) and is_digest(digest) and type(size) is int and size >= 0):
        return None
    return Want(name, str(digest), size)


def _group(pod: Mapping[str, Any]) -> str | None:
    for owner in _meta(pod).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("controller") and isinstance(owner.get("uid"), str):
            return str(owner["uid"])
    return None


def waiting_pods(
    pods: Iterable[Mapping[str, Any]],
    datasets: Mapping[tuple[str, str], Mapping[str, Any]],
    places: Mapping[str, tuple[tuple[Any, ...], str]] | None = None,
) -> list[tuple[Waiting, Mapping[str, Any]]]:
    """The waiting pods worth preparing, in queue order, each with its pod object.

    ``datasets``: ``(namespace, name) -> Dataset``. ``Waiting.key`` is the pod's UID.
    ``places``: each pod's place in its queue and its source
    (:func:`dsagent.controller.queues.queue_places`); without one, creation order."""
    places = places or {}
    out = []
    for pod in pods:
        meta = _meta(pod)
        uid, namespace = meta.get("uid"), meta.get("namespace") or "default"
        if not isinstance(uid, str) or not uid or node_of(pod) is not None or ended(pod):
            continue
        wants = []
        for name in dataset_names(pod):
            dataset = datasets.get((str(namespace), name))
            version = current_version(dataset) if dataset is not None else None
            if version is not None:
                wants.append(version)
        gpus = pod_gpus(pod)
        if wants and gpus > 0:
            source = places[uid][1] if uid in places else "prediction"
            out.append((Waiting(uid, gpus, tuple(wants), _group(pod), source), pod))

    def created(item: tuple[Waiting, Mapping[str, Any]]) -> tuple[Any, ...]:
        pod = item[1]
        return (1, 0, parse_or_none(_meta(pod).get("creationTimestamp")) or 0.0, str(_meta(pod).get("name")))

    out.sort(key=lambda item: places[item[0].key][0] if item[0].key in places else created(item))
    return out


def running_pods(pods: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str, float | None, int]]:
    """``(pod, node, expected end, GPUs)`` of every bound pod that has not ended."""
    out = []
    for pod in pods:
        bound = node_of(pod)
        if bound is not None and not ended(pod):
            out.append((pod, bound, expected_end(pod), pod_gpus(pod)))
    return out


def node_states(
    nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], inventories: Mapping[str, Mapping[str, Any]]
) -> list[NodeState]:
    """The policy's view of each node with an inventory (an agent)."""
    running: dict[str, list[Running]] = {}
    requested: dict[str, int] = {}
    for pod in pods:
        bound = node_of(pod)
        if bound is None or ended(pod):
            continue
        gpus = pod_gpus(pod)
        requested[bound] = requested.get(bound, 0) + gpus
        if gpus > 0:
            progress = progress_of(_annotations(pod))
            remaining = None if progress is None else progress[1] - progress[0]
            running.setdefault(bound, []).append(Running(gpus, expected_end(pod), remaining))
    out = []
    for node in nodes:
        name = _meta(node).get("name")
        inventory = inventories.get(name) if isinstance(name, str) else None
        if inventory is None or not isinstance(name, str):
            continue
        capacity = inventory.get("capacityBytes")
        if type(capacity) is not int or capacity <= 0:
            continue
        in_use, held = 0, set()
        for dataset, entry in _mapping(inventory.get("datasets")).items():
            if not isinstance(entry, Mapping):
                continue
            versions = [entry] + [v for v in entry.get("versions") or [] if isinstance(v, Mapping)]
            for v in versions:
                if is_digest(v.get("digest")) and v.get("state") in ("ready", "fetching"):
                    held.add((str(dataset), str(v["digest"])))
            size = entry.get("sizeBytes")
            if entry.get("inUse") is True and type(size) is int and size > 0:
                in_use += size
        out.append(
            NodeState(
                name,
                capacity,
                min(in_use, capacity),
                _free_gpus(node, requested.get(name, 0)),
                tuple(running.get(name, ())),
                frozenset(held),
            )
        )
    return out


def free_gpus(nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Free GPUs per node: ``dsagent.io/free-gpus``, else allocatable less active pods' requests
    (the pods are read only when a node publishes no count of its own)."""
    out: dict[str, int] = {}
    unpublished = []
    for node in nodes:
        name = _meta(node).get("name")
        if isinstance(name, str):
            published_free = _published_free(node)
            if published_free is None:
                unpublished.append((name, node))
            else:
                out[name] = published_free
    if unpublished:
        requested: dict[str, int] = {}
        for pod in pods:
            bound = node_of(pod)
            if bound is not None and not ended(pod):
                requested[bound] = requested.get(bound, 0) + pod_gpus(pod)
        for name, node in unpublished:
            out[name] = _free_gpus(node, requested.get(name, 0))
    return out


def demand(pods: Iterable[Mapping[str, Any]], namespace: str, name: str, *, now: float, window_s: float) -> int:
    """Pods of ``namespace`` naming Dataset ``name`` that wait now or started within ``window_s``
    (running or finished): the copies that could be hit (docs/design.md#replication)."""
    count = 0
    for pod in pods:
        if (_meta(pod).get("namespace") or "default") != namespace or name not in dataset_names(pod):
            continue
        if node_of(pod) is None and not ended(pod):
            count += 1
            continue
        started = parse_or_none(_mapping(pod.get("status")).get("startTime"))
        if started is not None and now - window_s <= started <= now + 60:
            count += 1
    return count


def pods_by_dataset(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """``(namespace, Dataset name) -> the pods naming it``, each pod once per name: built once
    a pass, so that :func:`demand` of one Dataset reads its own pods, not every pod in the
    cluster (the same count: :func:`demand` reads only the pods naming it)."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        names = dataset_names(pod)
        if names:
            namespace = _meta(pod).get("namespace") or "default"
            if not isinstance(namespace, str):  # never a Dataset's namespace
                continue
            for name in dict.fromkeys(names):
                out.setdefault((namespace, name), []).append(pod)
    return out


def _published_free(node: Mapping[str, Any]) -> int | None:
    """The free GPUs a node's ``dsagent.io/free-gpus`` counts; None without a readable one."""
    value = _annotation(node, published.FREE_GPUS)
    return None if value is None else _free_count(value[:512])


@lru_cache(maxsize=4096)  # the few lists of GPU indices the nodes of a cluster publish
def _free_count(value: str) -> int | None:
    parts = [p for p in value.split(",") if p.strip()]
    return len(parts) if all(p.strip().isdigit() for p in parts) else None


def _free_gpus(node: Mapping[str, Any], requested: int) -> int:
    published_free = _published_free(node)
    if published_free is not None:
        return published_free
    # the platform's one rule for a node's GPUs (plain, gpu-all or its classes, counted once)
    total = node_gpus(_mapping(node.get("status")).get("allocatable")) or 0
    return max(0, total - requested)


__all__ = [
    "DURATION_ANNOTATION",
    "current_version",
    "demand",
    "expected_end",
    "free_gpus",
    "running_pods",
    "node_states",
    "pods_by_dataset",
    "waiting_pods",
]
