"""The HTTP wire format: pydantic models for request bodies, dict builders for answers.

Who calls it: :mod:`dsagent.api.routes` only. Pydantic stays at this edge; the service
works with frozen dataclasses. Every request model forbids unknown fields, so a typo in
a field name is a 400, never silently ignored. The answer models (``*Out``) are the routes'
``response_model``: they type the OpenAPI document and allow extra fields, so a field the
service adds is documented late rather than silently dropped. :class:`ErrorOut` is the one
error body every 4xx/5xx carries. The task bodies are a wire contract of their own,
:mod:`dsplatform.wire.agenttask` (its writer for the status, its names for the request).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dsagent.cache.prepared import FIRST_THRESHOLD, SECOND_THRESHOLD
from dsagent.cache.service import DatasetRequest, EvictionResult, iso
from dsplatform.wire.agenttask import MAX_DATASETS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class DatasetIn(_Strict):
    name: str = Field(min_length=1, max_length=128)
    source: str = Field(min_length=1, max_length=4096)
    bundles: str | None = Field(default=None, min_length=1, max_length=4096)
    storage_options: dict[str, Any] | None = Field(default=None, alias="storageOptions")
    allow_per_file: bool = Field(
        default=False,
        alias="allowPerFile",
        strict=True,
        description="when `bundles` has no manifest for the dataset, copy the source file by file"
        " (slow) instead of failing with bundle_missing (404)",
    )

    def to_request(self) -> DatasetRequest:
        return DatasetRequest(self.name, self.source, self.bundles, self.storage_options, self.allow_per_file)


class TaskIn(_Strict):
    """The task request (:mod:`dsplatform.wire.agenttask`)."""

    datasets: list[DatasetIn] = Field(min_length=1, max_length=MAX_DATASETS)


def _cache_share(default: float, alias: str, description: str) -> Any:
    """A field holding a share of the cache: a fraction from 0 to 1."""
    return Field(default=default, ge=0.0, le=1.0, alias=alias, description=description)


class PreparationIn(_Strict):
    """``PUT /v1/preparations/{task}``: prepare the next task (docs/design.md#next-job-preparation)."""

    datasets: list[DatasetIn] = Field(min_length=1, max_length=MAX_DATASETS)
    phase: int = Field(default=1, ge=1, le=2, strict=True, description="1: manifests and reservation; 2: bulk fetch")
    first_threshold: float = _cache_share(
        FIRST_THRESHOLD, "firstThreshold", "share of the cache every preparation together may reserve (phase 1)"
    )
    second_threshold: float = _cache_share(
        SECOND_THRESHOLD,
        "secondThreshold",
        "share of the cache the running tasks' data plus the bulk fetches may take (phase 2)",
    )


class EvictIn(_Strict):
    mode: Literal["idle", "unused", "space", "names"] = "idle"
    names: list[str] = Field(default_factory=list, max_length=256)
    bytes: int | None = Field(default=None, ge=0)
    force: bool = False
    dry_run: bool = Field(default=False, alias="dryRun")


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ErrorOut(_Out):
    """Every error answer: a machine-readable ``code`` (see docs/reference/exit-codes.md)."""

    code: str = Field(description="machine-readable error code, e.g. not_found, credentials, source_unavailable")
    message: str = Field(description="one line for a human")
    hint: str | None = Field(default=None, description="what to do about it")
    details: dict[str, Any] | None = Field(
        default=None, description="structured details, e.g. the space numbers or the invalid fields"
    )


class DatasetStatusOut(_Out):
    name: str
    source: str
    bundles: str | None
    digest: str | None
    state: str = Field(
        description="resolving, fetching, checking (a prepared copy under the start check), ready or failed"
    )
    path: str | None
    size_bytes: int = Field(alias="sizeBytes")
    files: int
    bytes_done: int = Field(alias="bytesDone")
    files_done: int = Field(alias="filesDone")
    rate_bytes_per_second: float = Field(alias="rateBytesPerSecond")
    eta_seconds: float | None = Field(alias="etaSeconds")
    error: ErrorOut | None


class TaskOut(_Out):
    """The task status (:mod:`dsplatform.wire.agenttask`, :func:`~dsplatform.wire.agenttask.task_status`)."""

    task: str
    state: str = Field(description="pending, ready or failed")
    created_at: str | None = Field(alias="createdAt")
    lease_until: str | None = Field(alias="leaseUntil")
    namespace: str | None = Field(
        default=None,
        description="the namespace whose Dataset the task acts for (a pin the Dataset controller asked for), else null",
    )
    datasets: list[DatasetStatusOut]


class TasksOut(_Out):
    """The tasks this agent holds that the caller may read (every task for an operator or a
    host process; a pod sees only its own), oldest first."""

    tasks: list[TaskOut]


class PreparedDatasetOut(_Out):
    name: str
    digest: str
    size_bytes: int = Field(alias="sizeBytes", description="what the version takes on this cache's disk")
    held: bool = Field(description="ready here already: nothing to fetch")


class PreparationOut(_Out):
    task: str = Field(description="the task prepared for (a pod UID): its own request hands the preparation over")
    phase: int
    state: str = Field(description="reserved, waiting, fetching, prepared or failed")
    waiting: str | None = Field(description="which threshold holds it back")
    reserved_bytes: int = Field(alias="reservedBytes")
    missing_bytes: int | None = Field(alias="missingBytes")
    first_threshold: float = Field(alias="firstThreshold")
    second_threshold: float = Field(alias="secondThreshold")
    lease_until: str | None = Field(alias="leaseUntil")
    namespace: str | None = Field(
        default=None, description="the namespace whose Dataset the preparation acts for, else null"
    )
    requested: list[str] = Field(default_factory=list, description="the names of the datasets it prepares")
    datasets: list[PreparedDatasetOut]
    error: dict[str, Any] | None


class PreparationsOut(_Out):
    preparations: list[PreparationOut]


class ReleaseOut(_Out):
    task: str
    released: bool


class VersionOut(_Out):
    name: str
    digest: str
    state: str = Field(description="ready, fetching or failed")
    size_bytes: int = Field(alias="sizeBytes")
    files: int
    in_use: bool = Field(alias="inUse")
    last_used: str | None = Field(alias="lastUsed")
    path: str | None = None


class DatasetsOut(_Out):
    datasets: list[VersionOut]
    capacity_bytes: int | None = Field(alias="capacityBytes")
    free_bytes: int = Field(alias="freeBytes")
    used_bytes: int = Field(alias="usedBytes")


class DatasetVersionsOut(_Out):
    name: str
    versions: list[VersionOut]


class EvictedOut(_Out):
    name: str
    digest: str
    size_bytes: int = Field(
        alias="sizeBytes",
        description="the cache space deleting it frees (blocks and per-file overhead), not its data size",
    )
    last_used: str | None = Field(alias="lastUsed")


class EvictionOut(_Out):
    dry_run: bool = Field(alias="dryRun")
    freed_bytes: int = Field(alias="freedBytes")
    evicted: list[EvictedOut]


class OperationOut(_Out):
    """A long action the agent carries out (:mod:`dsagent.api.operations`)."""

    id: str
    kind: str = Field(description="evict or release")
    target: str = Field(description="what it acts on, e.g. names=imagenet, mode=unused, task=<id>")
    state: str = Field(description="running, succeeded or failed")
    started_at: str | None = Field(alias="startedAt")
    finished_at: str | None = Field(alias="finishedAt")
    elapsed_seconds: float = Field(alias="elapsedSeconds")
    href: str = Field(description="where to follow it: GET this path (with ?wait=S to long-poll)")
    result: dict[str, Any] | None = Field(description="the action's answer once succeeded (EvictionOut, ReleaseOut)")
    error: dict[str, Any] | None = Field(description="the ErrorOut body once failed")


class InventoryOut(_Out):
    """The node report the scheduler reads; its full schema is ``dsagent/cache/inventory.schema.json``."""


class StatusOut(_Out):
    """A probe's body (:mod:`dsplatform.probes`): ``status``, and ``detail`` when not ready."""

    status: str


class StripeIn(_Strict):
    """Hold this node's share of a striped version (docs/design-striping.md; the body:
    :mod:`dsplatform.wire.stripehold`, whose names these aliases are, as its test holds)."""

    store: str = Field(min_length=1, max_length=4096, description="the bundle store holding the version")
    digest: str | None = Field(default=None, min_length=32, max_length=32, description="the version (default: current)")
    members: list[str] = Field(min_length=1, max_length=4096, description="the stripe group's node names")
    peers: dict[str, str] = Field(default_factory=dict, description="member node -> its agent's base URL")
    no_share: list[str] = Field(
        default_factory=list, max_length=4096, alias="noShare",
        description="members that own no bundles: they read the others' through their window",
    )  # fmt: skip
    storage_options: dict[str, Any] | None = Field(default=None, alias="storageOptions")
    ready_after: int = Field(default=1, ge=0, alias="readyAfter", description="own bundles held before readyEnough")
    whole: bool = Field(
        default=False, alias="whole",
        description="hold every bundle (own first) where the version fits this node and its room; else the share",
    )  # fmt: skip
    store_on_demand: bool = Field(
        default=False, alias="storeOnDemand",
        description="fill from the peers only; read the store only for bundles a reader waits for",
    )  # fmt: skip
    lease_seconds: float | None = Field(
        default=None, gt=0, le=30 * 86400, alias="leaseSeconds",
        description="dropped unless held again within this long (default: the agent's DSAGENT_STRIPE_LEASE)",
    )  # fmt: skip


class StripeReleaseOut(_Out):
    """The versions whose share this node dropped."""

    name: str
    released: list[str]


class StripeOut(_Out):
    """This node's part in a striped version: its share and how much of it is held."""

    name: str
    digest: str
    members: list[str]
    bundles_owned: int = Field(alias="bundlesOwned")
    bundles_held: int = Field(alias="bundlesHeld")
    bytes_owned: int = Field(alias="bytesOwned")
    bytes_held: int = Field(alias="bytesHeld")
    complete: bool = Field(description="every bundle this node owns is held")
    ready_enough: bool = Field(alias="readyEnough", description="the first readyAfter owned bundles are held")
    error: str | None
    share_dir: str = Field(alias="shareDir")
    holding: str = Field(description="whole: every bundle is held here; share: the bundles this node owns")
    store_on_demand: bool = Field(
        False, alias="storeOnDemand", description="the store is read only for bundles a reader waits for"
    )


def eviction_out(result: EvictionResult) -> dict[str, Any]:
    return {
        "dryRun": result.dry_run,
        "freedBytes": result.freed_bytes,
        "evicted": [
            {"name": v.name, "digest": v.digest, "sizeBytes": v.size_bytes, "lastUsed": iso(v.last_used)}
            for v in result.evicted
        ],
    }


__all__ = [
    "DatasetIn", "DatasetStatusOut", "DatasetVersionsOut", "DatasetsOut", "ErrorOut", "EvictIn", "EvictionOut",
    "InventoryOut", "OperationOut", "PreparationIn", "PreparationOut", "PreparationsOut", "PreparedDatasetOut",
    "ReleaseOut", "StatusOut", "StripeIn", "StripeOut",
    "TaskIn", "TaskOut", "VersionOut", "eviction_out",
]  # fmt: skip
