"""The service's answers, built from what it gathered: pure functions, no I/O.

Who calls it: :mod:`dsagent.cache.service` for ``GET /v1/tasks/{task}`` (one
:class:`~dsagent.cache.task.DatasetStatus` per dataset of a task), ``GET /v1/datasets`` (one view
per cached version), ``GET /v1/inventory`` (the inventory contract, see
:mod:`dsplatform.wire.inventory`) and the task states of ``GET /metrics``. The service passes the
catalog rows, the progress counters and whether work is still running; nothing here
reads the clock, the disk or the catalog.
"""

from __future__ import annotations

from typing import Any

from dsagent.cache.catalog import VersionRow
from dsagent.cache.progress import FetchProgress
from dsagent.cache.task import DatasetStatus, iso, redact_url
from dsagent.errors import DsagentError
from dsplatform.wire import inventory as wire_inventory

_GONE = {
    "code": "gone",
    "message": "no cached copy and no fetch running (evicted by force, removed, or interrupted by an agent restart)",
    "hint": "repeat the request to cache it again",
}


def dataset_status(
    item: dict[str, Any],
    digest: str | None,
    row: VersionRow | None,
    *,
    error: DsagentError | None,
    waiting: bool,
    fetching: bool,
    pending: FetchProgress | None,
    progress: FetchProgress | None,
    path: str | None,
    checking: bool = False,
) -> DatasetStatus:
    """Where one requested dataset (``item``, as stored) stands for its task.

    ``waiting``: the task's own work on it is still running; ``fetching``: a fetch of the
    bound version is in flight (perhaps for another task); ``pending``: a per-file copy
    of this source whose digest is not known yet; ``checking``: a prepared copy under the
    start check (docs/design.md#next-job-preparation): not ready until it passes."""
    base: dict[str, Any] = {
        "name": item["name"],
        "source": redact_url(item["source"]) or "",
        "bundles": redact_url(item.get("bundles")),
        "digest": digest,
    }
    if error is not None:
        return DatasetStatus(**base, state="failed", error=error.to_dict())
    if row is None:
        if pending is not None and waiting:
            return DatasetStatus(
                **base, state="fetching", **_counters(pending, pending.total_bytes, pending.total_files)
            )
        if not waiting:  # evicted by force, or gone from disk
            return DatasetStatus(**base, state="failed", error=_GONE)
        return DatasetStatus(**base, state="fetching" if digest else "resolving")
    if row.state == "ready":
        return DatasetStatus(
            **base,
            state="checking" if checking else "ready",
            path=path,
            size_bytes=row.size_bytes,
            files=row.files,
            bytes_done=row.size_bytes,
            files_done=row.files,
        )
    state = "fetching" if waiting or fetching else "failed"
    message = row.error or "the fetch was interrupted (agent restart)"
    err = (
        {"code": "fetch_failed", "message": message, "hint": "repeat the request to resume it"}
        if state == "failed"
        else None
    )
    return DatasetStatus(**base, state=state, error=err, **_counters(progress, row.size_bytes, row.files))


def _counters(progress: FetchProgress | None, size_bytes: int, files: int) -> dict[str, Any]:
    done = (
        (progress.bytes_done, progress.files_done, progress.rate(), progress.eta()) if progress else (0, 0, 0.0, None)
    )
    return {
        "size_bytes": size_bytes,
        "files": files,
        "bytes_done": done[0],
        "files_done": done[1],
        "rate": done[2],
        "eta": done[3],
    }


def version_view(
    row: VersionRow, *, in_use: bool, working: bool, progress: FetchProgress | None, path: str
) -> dict[str, Any]:
    """One cached version as ``GET /v1/datasets`` shows it (``working``: a fetch or a task's
    work on its name is running)."""
    state = "fetching" if row.state != "ready" and working else ("failed" if row.state != "ready" else "ready")
    return {
        "name": row.name,
        "digest": row.digest,
        "state": state,
        "sizeBytes": row.size_bytes,
        "files": row.files,
        "inUse": in_use,
        "lastUsed": iso(row.last_used),
        "createdAt": iso(row.created_at),
        "readyAt": iso(row.ready_at),
        "source": redact_url(row.source),
        "bundles": redact_url(row.bundles),
        "error": row.error if state == "failed" else None,
        "path": path if state == "ready" else None,
        "bytesDone": progress.bytes_done if progress else (row.size_bytes if state == "ready" else 0),
        "filesDone": progress.files_done if progress else (row.files if state == "ready" else 0),
    }


def inventory(
    views: list[dict[str, Any]], space: dict[str, int], node: str | None, stripes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The node report of the inventory contract from the version views (in resolution order)
    and this node's shares of striped versions (``stripes``, docs/design-striping.md)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for view in views:
        by_name.setdefault(view["name"], []).append(view)
    return wire_inventory.document(
        node,
        capacity_bytes=space["capacityBytes"],
        free_bytes=space["freeBytes"],
        datasets={name: wire_inventory.dataset_entry(mine) for name, mine in sorted(by_name.items())},
        stripes=stripes,
    )


def task_states(task_ids: list[str], *, failed: set[str], working: set[str]) -> dict[str, int]:
    """Tasks by state for the ``dsplatform_agent_tasks`` gauge: a task with a failed dataset and no
    work left is ``failed``, not active."""
    failed_now = {t for t in task_ids if t in failed and t not in working}
    return {"active": len(task_ids) - len(failed_now), "failed": len(failed_now)}


__all__ = ["dataset_status", "inventory", "task_states", "version_view"]
