"""The extender's settings: one frozen pydantic-settings value, read from ``DSEXT_*`` once at start-up.

``Settings.from_env`` is the only place that reads the environment; everything else is
handed a :class:`Settings`. Called by ``python -m scheduler_plugin`` and
``dsctl scheduler serve`` (whose flags override the environment).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import AliasChoices, BeforeValidator, Field, ValidationInfo, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from dsplatform.gpus import CLASS_RESOURCE_PREFIX, GPU_RESOURCE
from dsplatform.jobs import DEFAULT_JOB_LABELS
from dsplatform.logs import LogSettings
from dsplatform.names import is_resource_name
from dsplatform.settings import Flag, UnknownSettings
from dsplatform.settings import refuse_unknown as _refuse_unknown
from dsplatform.units import Duration, Size
from scheduler_plugin.errors import SettingsError
from scheduling.timemodel import DEFAULT_FORMULA, check_formula

PREFIX = "DSEXT_"


@dataclass(frozen=True)
class Weights:
    """How much each normalized score (0..10) counts in the combined ``prioritize`` score."""

    dataset: float = 0.5
    roce: float = 0.3
    numa: float = 0.2
    time: float = 0.0  # prioritize/time (the deadline time model); off in the default blend

    def __post_init__(self) -> None:
        for name in ("dataset", "roce", "numa", "time"):
            value = getattr(self, name)
            if not (value >= 0.0 and value < float("inf")):
                raise SettingsError(f"weight {name}={value!r} must be a finite number >= 0")

    @classmethod
    def parse(cls, text: str) -> Weights:
        """``"dataset=0.5,roce=0.3,numa=0.2"``; names left out keep their default."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, raw = part.partition("=")
            name = name.strip()
            if not sep or name not in {f.name for f in dataclasses.fields(cls)}:
                raise SettingsError(f"invalid weight {part!r}", hint="use dataset=W,roce=W,numa=W,time=W with W >= 0")
            try:
                values[name] = float(raw)
            except ValueError as exc:
                raise SettingsError(f"weight {name}={raw!r} is not a number") from exc
        return cls(**values)


def _weights(value: Any) -> Weights:
    if isinstance(value, Weights):
        return value
    try:
        return Weights.parse(str(value))
    except SettingsError as exc:
        raise ValueError(str(exc)) from None


def _labels(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(filter(None, (p.strip() for p in value.split(","))))
    return tuple(value)


class Settings(LogSettings):
    """Everything the extender can be told; validated on construction (building one reads no environment)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX)
    settings_error: ClassVar[type[Exception] | None] = SettingsError

    host: str = "127.0.0.1"
    port: int = 8888
    base_path: str = ""  # the path part of kube-scheduler's urlPrefix
    weights: Annotated[Weights, NoDecode, BeforeValidator(_weights)] = Field(default_factory=Weights)
    partial_datasets: Flag = False  # credit the cached fraction of requested bytes
    # keep nodes with every GPU free from pods queued behind a waiting multi-worker job that
    # needs them whole (needs the watch: docs/design.md#whole-nodes)
    whole_nodes: Flag = True
    job_labels: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_labels)] = DEFAULT_JOB_LABELS
    job_ttl_s: Duration = Field(
        3600.0, validation_alias=AliasChoices("job_ttl_s", PREFIX + "JOB_TTL")
    )  # how long a job's RoCE class is remembered
    gpu_resource: str = GPU_RESOURCE
    roce_resource_prefix: str = CLASS_RESOURCE_PREFIX
    watch: Flag = False  # keep a watch-backed cache (needed for nodeCacheCapable)
    kubeconfig: str | None = None  # None: in-cluster config, else the default kubeconfig
    # the largest filter/prioritize body read (DSEXT_MAX_BODY); kube-scheduler's 5,000 Nodes
    # with budget-sized annotations stay far below; larger bodies get Error/zero scores
    max_body_bytes: Size = Field(64 << 20, validation_alias=AliasChoices("max_body_bytes", PREFIX + "MAX_BODY"))
    # the stand-in for the deadline design's lost formula (12) that GET /v1/plan ranks plans by
    plan_formula: str = DEFAULT_FORMULA

    @field_validator("plan_formula")
    @classmethod
    def _plan_formula(cls, value: str) -> str:
        return check_formula(value)

    @field_validator("port")
    @classmethod
    def _port(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError(f"port {value} is out of range 1..65535")
        return value

    @field_validator("base_path")
    @classmethod
    def _base_path(cls, value: str) -> str:
        if value and (not value.startswith("/") or value.endswith("/")):
            raise ValueError(
                f"base path {value!r} must start with '/' and not end with one (e.g. /scheduler for urlPrefix http://host:8888/scheduler)"
            )
        return value

    @field_validator("job_labels")
    @classmethod
    def _job_labels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one job label is needed")
        return value

    @field_validator("job_ttl_s")
    @classmethod
    def _ttl(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(f"job TTL {value} must be > 0 seconds")
        return value

    @field_validator("roce_resource_prefix", "gpu_resource")
    @classmethod
    def _qualified(cls, value: str, info: ValidationInfo) -> str:
        # the class prefix (dsagent.io/gpu-roce) is a resource name once a class number follows it
        name = f"{value}1" if info.field_name == "roce_resource_prefix" else value
        if not is_resource_name(name):
            raise ValueError("resource names must be qualified, e.g. nvidia.com/gpu")
        return value


def refuse_unknown(environ: Mapping[str, str] | None = None) -> None:
    """At start-up: a SettingsError (exit 2, one line) naming each ``DSEXT_*`` variable that
    :class:`Settings` does not declare, with its close matches (a typo is not ignored)."""
    import os

    try:
        _refuse_unknown(os.environ if environ is None else environ, PREFIX, Settings.env_names())
    except UnknownSettings as exc:
        raise SettingsError(exc.message, hint=exc.hint) from None


__all__ = ["DEFAULT_JOB_LABELS", "PREFIX", "Settings", "Weights", "refuse_unknown"]
