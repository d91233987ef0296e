"""Which job a pod belongs to: the one rule the webhook and the scheduler extender share.

A job is named by the first of these pod labels that is set (``DSEXT_JOB_LABELS`` and
``DSAGENT_WEBHOOK_JOB_LABELS`` override the list): our own, then Kubeflow's training
operator, Volcano and batch/v1 Jobs, then the gang conventions' pod-group labels
(scheduler-plugins' Coscheduling ``scheduling.x-k8s.io/pod-group``, Kueue's
``kueue.x-k8s.io/pod-group-name``): a pod group is a job. The key is ``namespace/value``.

A job whose pods carry none of these labels is named by its pods' controlling owner reference
(:func:`owner_key`), where a caller needs every worker of it (the deadline plan loop).

A job's worker count (``docs/design.md#class-sets``) is ``dsagent.io/workers``, else Kueue's
``kueue.x-k8s.io/pod-group-total-count``: the gang's size, which the class set must hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DEFAULT_JOB_LABELS: tuple[str, ...] = (
    "dsagent.io/job",
    "training.kubeflow.org/job-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",
    "scheduling.x-k8s.io/pod-group",
    "kueue.x-k8s.io/pod-group-name",
)


#: a job's worker count, on each of its pods (the time model reads it too)
WORKERS_ANNOTATION = "dsagent.io/workers"
#: Kueue's plain-pod group size, read when ``dsagent.io/workers`` is absent
KUEUE_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
#: ``required``: a multi-worker job waits for nodes serving one class set (subnets) rather
#: than be split across class layouts; anything else: ``preferred``
SUBNET_PLACEMENT_ANNOTATION = "dsagent.io/subnet-placement"
MAX_WORKERS = 4096


def workers_of(annotations: Mapping[str, object] | None) -> int:
    """The pod's ``dsagent.io/workers`` (else Kueue's group count): 1..MAX_WORKERS, else 1."""
    annotations = annotations or {}
    text = annotations.get(WORKERS_ANNOTATION, annotations.get(KUEUE_GROUP_COUNT_ANNOTATION))
    if not isinstance(text, str) or len(text) > 8:
        return 1
    text = text.strip()
    if not text.isascii() or not text.isdigit():
        return 1
    return max(1, min(int(text), MAX_WORKERS))


def subnet_required(annotations: Mapping[str, object] | None) -> bool:
    """Whether the pod's job requires one class set (``dsagent.io/subnet-placement: required``)."""
    value = (annotations or {}).get(SUBNET_PLACEMENT_ANNOTATION)
    return isinstance(value, str) and value.strip().lower() == "required"


def job_key(
    namespace: str, labels: Mapping[str, object] | None, job_labels: Sequence[str] = DEFAULT_JOB_LABELS
) -> str | None:
    """``namespace/job`` from the first job label set on the pod, else None."""
    labels = labels or {}
    for key in job_labels:
        value = labels.get(key)
        if isinstance(value, str) and value:
            return f"{namespace}/{value}"
    return None


def owner_key(namespace: str, owners: object) -> str | None:
    """``namespace/Kind/uid`` of the pod's controlling owner reference (the Job, JobSet or
    training job that created it), else None: the identity of a job whose pods carry no job
    label. ``owners`` is the pod's ``metadata.ownerReferences`` as read (hostile input)."""
    if not isinstance(owners, list):
        return None
    for ref in owners[:64]:
        if not isinstance(ref, Mapping) or ref.get("controller") is not True:
            continue
        kind, uid = ref.get("kind"), ref.get("uid")
        if isinstance(kind, str) and isinstance(uid, str) and 0 < len(kind) <= 63 and 0 < len(uid) <= 128:
            return f"{namespace}/{kind}/{uid}"
    return None


__all__ = [
    "DEFAULT_JOB_LABELS",
    "KUEUE_GROUP_COUNT_ANNOTATION",
    "MAX_WORKERS",
    "SUBNET_PLACEMENT_ANNOTATION",
    "WORKERS_ANNOTATION",
    "job_key",
    "owner_key",
    "subnet_required",
    "workers_of",
]
