"""Which job a pod belongs to: the one rule the webhook and the scheduler extender share.

A job is named by the first of these pod labels that is set (``DSEXT_JOB_LABELS`` and
``DSAGENT_WEBHOOK_JOB_LABELS`` override the list): our own, then Kubeflow's training
operator, Volcano and batch/v1 Jobs. The key is ``namespace/value``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DEFAULT_JOB_LABELS: tuple[str, ...] = (
    "dsagent.io/job",
    "training.kubeflow.org/job-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)


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


__all__ = ["DEFAULT_JOB_LABELS", "job_key"]
