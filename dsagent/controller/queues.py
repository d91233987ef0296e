"""Which job runs next, from what the cluster knows: the inputs of next-job preparation
(docs/design.md#next-job-preparation) before any prediction.

Who calls it: :mod:`dsagent.controller.nextjob`, once per pass. What it owns:

- :func:`list_queues`: Kueue ``Workloads`` (``kueue.x-k8s.io/v1beta1``) and Volcano ``Jobs``
  (``batch.volcano.sh/v1alpha1``), read through the official client's ``CustomObjectsApi``
  when their CRDs are installed (a 404 means not installed: nothing from it);
- :func:`queue_places`: each waiting pod's place in its queue, from the object that owns it
  (the pod's controlling owner is the Workload's owner, or the Volcano Job): admitted
  (Kueue: ``status.admission``; Volcano: phase ``Inqueue``) before pending, then higher
  ``spec.priority`` first, then older first; pods no queue system knows keep their
  creation order behind the admitted ones;
- :func:`followers`: the waiting pods a running pod names as its follow-up
  (``dsagent.io/next-job``, :mod:`dsplatform.wire.podannotations`): their node is known
  (the running pod's), and so is when they start (its expected end);
- :func:`follow_up_namespaces`: where such pods run, as the nodes' agents publish it: all
  the default preparation (``auto``) lists pods of.

Everything read is hostile: objects without the fields are ignored, never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsagent.policy.preparation import Known, Running
from dsplatform.kubetime import parse_or_none
from dsplatform.names import DNS_LABEL_MAX_LENGTH, is_dns_label
from dsplatform.published import FOLLOW_UPS, FOLLOW_UPS_MAX
from dsplatform.wire.podannotations import next_job_of, progress_of

log = logging.getLogger("dsagent.controller")

JSON = dict[str, Any]
KUEUE = ("kueue.x-k8s.io", "v1beta1", "workloads")
VOLCANO = ("batch.volcano.sh", "v1alpha1", "jobs")


@dataclass(frozen=True)
class Queues:
    """The queue systems' objects this pass; None: that system is not installed."""

    workloads: list[JSON] | None = None
    volcano_jobs: list[JSON] | None = None


def list_queues(custom: Any, *, timeout: float | None = None) -> Queues:
    """Kueue Workloads and Volcano Jobs, cluster-wide (a CRD not installed: None)."""
    from kubernetes.client.exceptions import ApiException

    from dsagent.controller.agents import raw

    found: dict[str, list[JSON] | None] = {}
    for key, (group, version, plural) in (("workloads", KUEUE), ("volcano_jobs", VOLCANO)):
        try:
            items = raw(custom.list_cluster_custom_object, group, version, plural, timeout=timeout).get("items")
            found[key] = [i for i in items or [] if isinstance(i, dict)]
        except ApiException as exc:
            if exc.status != 404:
                log.warning("listing %s.%s failed (%s); ordering without it", plural, group, exc.status)
            found[key] = None
    return Queues(**found)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for owner in _meta(obj).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("controller") and isinstance(owner.get("uid"), str):
            return owner
    return None


def _created(obj: Mapping[str, Any]) -> float:
    return parse_or_none(_meta(obj).get("creationTimestamp")) or 0.0


def _part(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _priority(value: Any) -> int:
    return value if type(value) is int and abs(value) <= 2**31 else 0


def queue_places(pods: Iterable[Mapping[str, Any]], queues: Queues) -> dict[str, tuple[tuple[Any, ...], str]]:
    """``pod UID -> (sort key, source)`` for every pod: its place in the queue, and whether
    a queue system (``kueue``, ``volcano``) or the pods' creation order (``prediction``) gave it."""
    by_owner: dict[str, tuple[tuple[Any, ...], str]] = {}
    for wl in queues.workloads or ():
        owner = _controller(wl)
        if owner is None:
            continue
        admitted = isinstance(_part(wl, "status").get("admission"), Mapping)
        spec = _part(wl, "spec")
        by_owner[str(owner["uid"])] = ((0 if admitted else 1, -_priority(spec.get("priority")), _created(wl)), "kueue")
    for job in queues.volcano_jobs or ():
        uid = _meta(job).get("uid")
        if not isinstance(uid, str):
            continue
        admitted = _part(_part(job, "status"), "state").get("phase") in ("Inqueue", "Running")
        spec = _part(job, "spec")
        by_owner[uid] = ((0 if admitted else 1, -_priority(spec.get("priority")), _created(job)), "volcano")
    out: dict[str, tuple[tuple[Any, ...], str]] = {}
    for pod in pods:
        uid = _meta(pod).get("uid")
        if not isinstance(uid, str):
            continue
        owner = _controller(pod)
        name = str(_meta(pod).get("name", ""))
        place = by_owner.get(str(owner["uid"])) if owner is not None else None
        if place is not None:
            out[uid] = ((*place[0], name), place[1])
        else:
            out[uid] = ((1, 0, _created(pod), name), "prediction")
    return out


def follow_up_namespaces(nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The namespaces whose running pods name their follow-up job, as the nodes' agents
    publish them (:data:`dsplatform.published.FOLLOW_UPS`; hostile input: at most
    :data:`~dsplatform.published.FOLLOW_UPS_MAX` a node, namespace names only), sorted."""
    out: set[str] = set()
    for node in nodes:
        annotations = _meta(node).get("annotations")
        value = annotations.get(FOLLOW_UPS) if isinstance(annotations, Mapping) else None
        if not isinstance(value, str) or len(value) > FOLLOW_UPS_MAX * (DNS_LABEL_MAX_LENGTH + 1):
            continue
        out.update(n for n in value.split(",")[:FOLLOW_UPS_MAX] if is_dns_label(n))
    return sorted(out)


def followers(
    running: Sequence[tuple[Mapping[str, Any], str, float | None, int]], waiting: Iterable[Mapping[str, Any]]
) -> dict[str, Known]:
    """``pod UID -> Known`` for the waiting pods some running pod names as its follow-up.

    ``running``: ``(pod, node, expected end, GPUs)`` of each bound pod not ended. A running
    pod's ``dsagent.io/next-job`` names a job in its namespace; the waiting pods whose
    controlling owner has that name follow it, paired one to one with the pods naming it
    (both by name), so a gang follows a gang node by node."""
    naming: dict[tuple[str, str], list[tuple[str, Known]]] = {}
    for pod, node, end, gpus in running:
        annotations = _meta(pod).get("annotations")
        annotations = annotations if isinstance(annotations, Mapping) else {}
        job = next_job_of(annotations)
        if job is None:
            continue
        progress = progress_of(annotations)
        current = Running(gpus, end, None if progress is None else progress[1] - progress[0])
        namespace = str(_meta(pod).get("namespace") or "default")
        naming.setdefault((namespace, job), []).append((str(_meta(pod).get("name", "")), Known(node, end, current)))
    following: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for pod in waiting:
        owner = _controller(pod)
        uid = _meta(pod).get("uid")
        if owner is None or not isinstance(uid, str) or not isinstance(owner.get("name"), str):
            continue
        key = (str(_meta(pod).get("namespace") or "default"), str(owner["name"]))
        if key in naming:
            following.setdefault(key, []).append((str(_meta(pod).get("name", "")), uid))
    out: dict[str, Known] = {}
    for key, pods in following.items():
        for (_, uid), (_, known) in zip(sorted(pods), sorted(naming[key], key=lambda item: item[0])):
            out[uid] = known
    return out


__all__ = ["KUEUE", "VOLCANO", "Queues", "followers", "list_queues", "queue_places"]
