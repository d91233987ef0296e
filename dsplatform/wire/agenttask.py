"""The agent API's task bodies: what a client asks a node's agent to hold (``PUT
/v1/tasks/{task}``) and how the agent says where the task stands. Version 1.

Writers of the request: :class:`dsagent.api.client.AgentClient` (``dsctl cache``, the
init-container) and the Dataset controller (:mod:`dsagent.controller.agents`), both with
:func:`task_request`; its reader is the agent's route (:class:`dsagent.api.schemas.TaskIn`,
which also reads the snake_case spellings ``storage_options`` and ``allow_per_file``).
Writer of the status: the agent's routes, with :func:`task_status` over the service's
:class:`TaskRecord` (the values the status is written from live here with it). Its
readers: ``dsctl`` (typed as :class:`TaskStatusBody`) and the Dataset controller, which
reads another party's answer through :func:`read_datasets`: known states and whole byte
counts only, never more.

Request::

    datasets   [{name, source, bundles?, storageOptions?, allowPerFile?}], 1-64 of them

Status::

    task, state (pending, ready, failed), createdAt, leaseUntil (RFC 3339, UTC),
    namespace  the namespace whose Dataset the task acts for (a pin the Dataset controller
               asked for with ``X-Dsagent-For``), else null
    datasets   [{name, source, bundles, digest, state (resolving, fetching, checking, ready, failed),
                 path, sizeBytes, files, bytesDone, filesDone, rateBytesPerSecond,
                 etaSeconds, error (the API's error body: code, message, hint, details)}]

List (``GET /v1/tasks``)::

    tasks      [status, ...], every task the caller may read (all of them for an operator)

The Dataset controller reads the list through :func:`read_task_list`: each task's id, the
namespace it acts for and its datasets' names, no more (docs/operator-guide/tenancy.md: what
it holds for a Dataset that is gone is released).

Pure: no I/O, nothing of the processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from dsplatform.boundedjson import count
from dsplatform.kubetime import format_time

VERSION = 1
#: the most datasets one task may name
MAX_DATASETS = 64
STORAGE_OPTIONS = "storageOptions"
ALLOW_PER_FILE = "allowPerFile"
TASK_STATES = ("pending", "ready", "failed")
DATASET_STATES = ("resolving", "fetching", "checking", "ready", "failed")
#: the longest error message a reader keeps of another party's answer
MESSAGE_MAX = 300


class _DatasetNamed(TypedDict):
    name: str
    source: str


class DatasetRequestBody(_DatasetNamed, total=False):
    bundles: str
    storageOptions: dict[str, Any]
    allowPerFile: bool


class TaskRequestBody(TypedDict):
    datasets: list[DatasetRequestBody]


class DatasetStatusBody(TypedDict):
    name: str
    source: str
    bundles: str | None
    digest: str | None
    state: str
    path: str | None
    sizeBytes: int
    files: int
    bytesDone: int
    filesDone: int
    rateBytesPerSecond: float
    etaSeconds: float | None
    error: dict[str, Any] | None


class TaskStatusBody(TypedDict):
    task: str
    state: str
    createdAt: str | None
    leaseUntil: str | None
    namespace: str | None
    datasets: list[DatasetStatusBody]


@dataclass(frozen=True)
class DatasetStatus:
    """Where one dataset of a task stands, as the agent's service tracks it."""

    name: str
    source: str
    bundles: str | None
    digest: str | None
    state: str  # one of DATASET_STATES
    path: str | None = None
    size_bytes: int = 0
    files: int = 0
    bytes_done: int = 0
    files_done: int = 0
    rate: float = 0.0
    eta: float | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class TaskRecord:
    """A task and its datasets; times in seconds since the epoch."""

    task_id: str
    created_at: float
    lease_until: float
    datasets: tuple[DatasetStatus, ...]
    namespace: str | None = None  # the namespace whose Dataset it acts for (docs/operator-guide/tenancy.md)

    @property
    def state(self) -> str:
        """The task's state: failed when one dataset failed, ready when all are, else pending."""
        states = {d.state for d in self.datasets}
        if "failed" in states:
            return "failed"
        return "ready" if states <= {"ready"} else "pending"


def dataset_request(
    name: str,
    source: str,
    *,
    bundles: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    allow_per_file: bool = False,
) -> DatasetRequestBody:
    """One dataset of a task request (keys left out when unset)."""
    body: DatasetRequestBody = {"name": name, "source": source}
    if bundles is not None:
        body["bundles"] = bundles
    if storage_options:
        body["storageOptions"] = dict(storage_options)
    if allow_per_file:
        body["allowPerFile"] = True
    return body


def task_request(datasets: Sequence[Mapping[str, Any]]) -> TaskRequestBody:
    """The body of ``PUT /v1/tasks/{task}``: ``datasets`` as given (:func:`dataset_request`'s,
    or dicts in the snake_case spelling the agent also reads)."""
    return {"datasets": [dict(d) for d in datasets]}  # type: ignore[misc]


def dataset_status(status: DatasetStatus) -> DatasetStatusBody:
    """How the agent reports one dataset of a task."""
    return {
        "name": status.name,
        "source": status.source,
        "bundles": status.bundles,
        "digest": status.digest,
        "state": status.state,
        "path": status.path,
        "sizeBytes": status.size_bytes,
        "files": status.files,
        "bytesDone": status.bytes_done,
        "filesDone": status.files_done,
        "rateBytesPerSecond": round(status.rate, 1),
        "etaSeconds": None if status.eta is None else round(status.eta, 1),
        "error": status.error,
    }


def task_status(task: TaskRecord) -> TaskStatusBody:
    """How the agent reports a task (``GET``/``PUT /v1/tasks/{task}``)."""
    return {
        "task": task.task_id,
        "state": task.state,
        "createdAt": iso(task.created_at),
        "leaseUntil": iso(task.lease_until),
        "namespace": task.namespace,
        "datasets": [dataset_status(d) for d in task.datasets],
    }


@dataclass(frozen=True)
class DatasetProgress:
    """What a reader keeps of one dataset in another party's status body."""

    name: str
    state: str  # one of DATASET_STATES, else "unknown"
    size_bytes: int
    bytes_done: int
    message: str | None = None  # the error's message when failed


def read_datasets(body: Any) -> tuple[DatasetProgress, ...]:
    """The datasets of a status body an agent answered, as far as they can be read: entries
    that are not objects are skipped, a count that is not a whole number >= 0 reads as 0."""
    items = body.get("datasets") if isinstance(body, Mapping) else None
    if not isinstance(items, list):
        return ()
    return tuple(_progress(item) for item in items if isinstance(item, Mapping))


def _progress(item: Mapping[str, Any]) -> DatasetProgress:
    state = item.get("state") if item.get("state") in DATASET_STATES else "unknown"
    error = item.get("error")
    message = str(error.get("message"))[:MESSAGE_MAX] if state == "failed" and isinstance(error, Mapping) else None
    name = item.get("name")
    return DatasetProgress(
        name if isinstance(name, str) else "",
        str(state),
        count(item.get("sizeBytes")),
        count(item.get("bytesDone")),
        message,
    )


@dataclass(frozen=True)
class TaskHeld:
    """What a reader keeps of one task in another party's task list."""

    task: str
    namespace: str | None  # the namespace whose Dataset it acts for, when the agent says so
    names: tuple[str, ...]  # its datasets' names


#: the longest task id and dataset name a reader keeps (a task id is a pod UID or a
#: ``<kind>.<namespace>.<name>``: a DNS label and a DNS subdomain)
_NAME_MAX = 320


def read_task_list(body: Any) -> tuple[TaskHeld, ...]:
    """The tasks of a list an agent answered, as far as they can be read: an entry that is
    not an object or has no task id is skipped, a namespace or a name that is not a string
    (or is longer than any Kubernetes name) reads as absent."""
    items = body.get("tasks") if isinstance(body, Mapping) else None
    if not isinstance(items, list):
        return ()
    held = []
    for item in items:
        task = item.get("task") if isinstance(item, Mapping) else None
        if not isinstance(task, str) or not task or len(task) > _NAME_MAX:
            continue
        namespace = item.get("namespace")
        datasets = item.get("datasets") if isinstance(item.get("datasets"), list) else []
        names = tuple(
            d["name"]
            for d in datasets[:MAX_DATASETS]
            if isinstance(d, Mapping) and isinstance(d.get("name"), str) and 0 < len(d["name"]) <= _NAME_MAX
        )
        ok = isinstance(namespace, str) and 0 < len(namespace) <= _NAME_MAX
        held.append(TaskHeld(task, namespace if ok else None, names))
    return tuple(held)


def iso(ts: float | None) -> str | None:
    """``ts`` as the API and reports print times: RFC 3339, whole seconds, UTC."""
    return None if ts is None else format_time(ts)


__all__ = [
    "ALLOW_PER_FILE",
    "DATASET_STATES",
    "MAX_DATASETS",
    "STORAGE_OPTIONS",
    "TASK_STATES",
    "VERSION",
    "DatasetProgress",
    "DatasetRequestBody",
    "DatasetStatus",
    "DatasetStatusBody",
    "TaskHeld",
    "TaskRecord",
    "TaskRequestBody",
    "TaskStatusBody",
    "dataset_request",
    "dataset_status",
    "iso",
    "read_datasets",
    "read_task_list",
    "task_request",
    "task_status",
]
