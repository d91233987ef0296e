"""The extender's settings: one frozen value, read from ``DSEXT_*`` once at start-up.

``Settings.from_env`` is the only place that reads the environment; everything else is
handed a :class:`Settings`. Called by ``python -m scheduler_plugin`` and
``dsctl scheduler serve`` (whose flags override the environment).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dsplatform.jobs import DEFAULT_JOB_LABELS
from scheduler_plugin.errors import SettingsError

PREFIX = "DSEXT_"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True)
class Weights:
    """How much each normalized score (0..10) counts in the combined ``prioritize`` score."""

    dataset: float = 0.5
    roce: float = 0.3
    numa: float = 0.2

    def __post_init__(self) -> None:
        for name in ("dataset", "roce", "numa"):
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
                raise SettingsError(
                    f"invalid weight {part!r}", hint="use dataset=W,roce=W,numa=W with W >= 0"
                )
            try:
                values[name] = float(raw)
            except ValueError as exc:
                raise SettingsError(f"weight {name}={raw!r} is not a number") from exc
        return cls(**values)


@dataclass(frozen=True)
class Settings:
    """Everything the extender can be told; validated on construction."""

    host: str = "127.0.0.1"
    port: int = 8888
    base_path: str = ""                 # the path part of kube-scheduler's urlPrefix
    weights: Weights = field(default_factory=Weights)
    partial_datasets: bool = False      # credit the cached fraction of requested bytes
    job_labels: tuple[str, ...] = DEFAULT_JOB_LABELS
    job_ttl_s: float = 3600.0           # how long a job's RoCE class is remembered after last use
    gpu_resource: str = "nvidia.com/gpu"
    roce_resource_prefix: str = "dsagent.io/gpu-roce"
    watch: bool = False                 # keep a watch-backed cache (needed for nodeCacheCapable)
    kubeconfig: str | None = None       # None: in-cluster config, else the default kubeconfig
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise SettingsError(f"port {self.port} is out of range 1..65535")
        if self.base_path and (not self.base_path.startswith("/") or self.base_path.endswith("/")):
            raise SettingsError(
                f"base path {self.base_path!r} must start with '/' and not end with one",
                hint="e.g. /scheduler for urlPrefix http://host:8888/scheduler",
            )
        if not self.job_labels:
            raise SettingsError("at least one job label is needed")
        if not self.job_ttl_s > 0:
            raise SettingsError(f"job TTL {self.job_ttl_s} must be > 0 seconds")
        if "/" not in self.roce_resource_prefix or "/" not in self.gpu_resource:
            raise SettingsError("resource names must be qualified, e.g. nvidia.com/gpu")
        if self.log_level.lower() not in {"debug", "info", "warning", "error", "critical"}:
            raise SettingsError(f"unknown log level {self.log_level!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``DSEXT_*`` (see the README); keyword overrides (CLI flags) win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        readers: dict[str, tuple[str, Callable[[str], Any]]] = {
            "HOST": ("host", str),
            "PORT": ("port", _int),
            "BASE_PATH": ("base_path", str),
            "WEIGHTS": ("weights", Weights.parse),
            "PARTIAL_DATASETS": ("partial_datasets", _bool),
            "JOB_LABELS": ("job_labels", _labels),
            "JOB_TTL": ("job_ttl_s", parse_duration),
            "GPU_RESOURCE": ("gpu_resource", str),
            "ROCE_RESOURCE_PREFIX": ("roce_resource_prefix", str),
            "WATCH": ("watch", _bool),
            "KUBECONFIG": ("kubeconfig", str),
            "LOG_LEVEL": ("log_level", str),
        }
        for suffix, (name, reader) in readers.items():
            raw = env.get(PREFIX + suffix)
            if raw is None:
                continue
            try:
                values[name] = reader(raw)
            except SettingsError as exc:
                raise SettingsError(f"{PREFIX}{suffix}: {exc}") from exc
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"15m"``, ``"1h"``, ``"250ms"`` -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise SettingsError(f"invalid duration {text!r}", hint="e.g. 30s, 15m, 1h")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise SettingsError(f"{text!r} is not an integer") from exc


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingsError(f"{text!r} is not a boolean", hint="use 1/0, true/false, yes/no")


def _labels(text: str) -> tuple[str, ...]:
    return tuple(filter(None, (p.strip() for p in text.split(","))))


__all__ = ["DEFAULT_JOB_LABELS", "PREFIX", "Settings", "Weights", "parse_duration"]
