"""The HTTP wire format: pydantic models for request bodies, dict builders for answers.

Who calls it: :mod:`dsagent.api.routes` only. Pydantic stays at this edge; the service
works with frozen dataclasses. Every request model forbids unknown fields, so a typo in
a field name is a 400, never silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dsagent.cache.service import DatasetRequest, DatasetStatus, EvictionResult, TaskRecord, iso


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class DatasetIn(_Strict):
    name: str = Field(min_length=1, max_length=128)
    source: str = Field(min_length=1, max_length=4096)
    bundles: str | None = Field(default=None, min_length=1, max_length=4096)
    storage_options: dict[str, Any] | None = Field(default=None, alias="storageOptions")

    def to_request(self) -> DatasetRequest:
        return DatasetRequest(self.name, self.source, self.bundles, self.storage_options)


class TaskIn(_Strict):
    datasets: list[DatasetIn] = Field(min_length=1, max_length=64)


class EvictIn(_Strict):
    mode: Literal["idle", "unused", "space", "names"] = "idle"
    names: list[str] = Field(default_factory=list, max_length=256)
    bytes: int | None = Field(default=None, ge=0)
    force: bool = False
    dry_run: bool = Field(default=False, alias="dryRun")


def dataset_status_out(status: DatasetStatus) -> dict[str, Any]:
    return {
        "name": status.name, "source": status.source, "bundles": status.bundles, "digest": status.digest,
        "state": status.state, "path": status.path, "sizeBytes": status.size_bytes, "files": status.files,
        "bytesDone": status.bytes_done, "filesDone": status.files_done,
        "rateBytesPerSecond": round(status.rate, 1), "etaSeconds": None if status.eta is None else round(status.eta, 1),
        "error": status.error,
    }


def task_out(record: TaskRecord) -> dict[str, Any]:
    return {
        "task": record.task_id, "state": record.state, "createdAt": iso(record.created_at),
        "leaseUntil": iso(record.lease_until), "datasets": [dataset_status_out(d) for d in record.datasets],
    }


def eviction_out(result: EvictionResult) -> dict[str, Any]:
    return {
        "dryRun": result.dry_run, "freedBytes": result.freed_bytes,
        "evicted": [{"name": v.name, "digest": v.digest, "sizeBytes": v.size_bytes, "lastUsed": iso(v.last_used)} for v in result.evicted],
    }


__all__ = ["DatasetIn", "EvictIn", "TaskIn", "dataset_status_out", "eviction_out", "task_out"]
