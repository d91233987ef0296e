"""What a task asks for and what it is told: the service's domain values.

Who calls it: :mod:`dsagent.cache.service` builds them, :mod:`dsagent.api.schemas` and the
cluster integration read them (both import them from :mod:`dsagent.cache.service`, which
re-exports them). A task (a pod UID, a job id) asks for datasets; its record says where
each one stands (:class:`DatasetStatus` and :class:`TaskRecord`, defined with the status
body they are written as, :mod:`dsplatform.wire.agenttask`). ``storage_options`` may hold
credentials: they are never logged, stored or returned, so only
:meth:`DatasetRequest.redacted` reaches the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dsagent.cache.catalog import TaskRow
from dsagent.cache.layout import validate_name
from dsagent.errors import Conflict, InvalidInput
from dsagent.format.sources import SourcePolicy
from dsplatform.names import TASK_ID_HINT, canonical_task_id
from dsplatform.wire.agenttask import DatasetStatus, TaskRecord, iso  # the status the API writes


@dataclass(frozen=True)
class DatasetRequest:
    """One dataset a task asks for. ``storage_options`` is never logged, stored or returned.

    ``allow_per_file``: when ``bundles`` has no manifest for the dataset, copy the source file
    by file instead of failing with :class:`~dsagent.errors.BundleMissing`. A policy, not
    part of the dataset's identity."""

    name: str
    source: str
    bundles: str | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    allow_per_file: bool = False

    @property
    def identity(self) -> tuple[str, str, str | None]:
        return (self.name, self.source, self.bundles)

    def redacted(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "bundles": self.bundles,
            "hasStorageOptions": bool(self.storage_options),
            **({"allowPerFile": True} if self.allow_per_file else {}),
        }


def task_key(task_id: str) -> str:
    """The task ``task_id`` names: its one form (dsplatform.names), or InvalidInput."""
    key = canonical_task_id(task_id)
    if key is None:
        raise InvalidInput(f"invalid task id {task_id!r}", hint=TASK_ID_HINT)
    return key


def validate_request(task_id: str, datasets: Sequence[DatasetRequest]) -> str:
    """A task id and its dataset list, before anything is recorded: the task's one form
    (:func:`task_key`), or InvalidInput."""
    key = task_key(task_id)
    if not datasets:
        raise InvalidInput("a task must ask for at least one dataset")
    names = [validate_name(d.name) for d in datasets]
    if len(set(names)) != len(names):
        raise InvalidInput(f"dataset names repeat in one task: {sorted(names)}")
    return key


def check_locations(request: DatasetRequest, *, policy: SourcePolicy) -> None:
    """Refuse a source or bundle store the operator's allowlist does not admit, before any
    filesystem is built or any path outside the allowed local directories touched (the
    agent runs privileged: pods must not make it read host files). See
    :mod:`dsagent.format.sources`. Stats local paths inside the allowed directories only."""
    for url in (request.source, request.bundles):
        if url is not None:
            policy.check(url, request.storage_options)


def check_same_request(existing: TaskRow, requests: Sequence[DatasetRequest]) -> None:
    """A repeated request must name the same datasets (one request per task: docs/design.md#rule-1)."""
    before = sorted((d["name"], d["source"], d.get("bundles")) for d in existing.request)
    after = sorted(r.identity for r in requests)
    if before != after:
        raise Conflict(
            f"task {existing.task_id!r} already holds a different set of datasets",
            hint="a task's request cannot change; release the task first or use a new task id",
        )


def redact_url(url: str | None) -> str | None:
    """``url`` without any password in its user-info part (safe for logs and answers)."""
    if not url or "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


__all__ = [
    "DatasetRequest",
    "DatasetStatus",
    "TaskRecord",
    "check_locations",
    "check_same_request",
    "iso",
    "redact_url",
    "validate_request",
]
