"""The agent's settings: read once at start-up from ``DSAGENT_*`` variables and flags.

Who calls it: ``dsagent serve`` (flags override the environment), ``dsctl`` (only to find
the agent's socket and token), and tests (which build :class:`Settings` directly).
What it owns: the one typed, validated view of configuration. Every bad value raises
:class:`SettingsError` naming the variable, the value and what a good one looks like,
so a misconfigured DaemonSet fails at start-up with one clear line, never later.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from dsagent.errors import InvalidInput, SettingsError
from dsplatform.units import UnitError, parse_duration, parse_size

ENV_PREFIX = "DSAGENT_"
_T = TypeVar("_T")


def default_root() -> Path:
    """``$XDG_CACHE_HOME/dsagent`` (or ``~/.cache/dsagent``); the chart sets ``DSAGENT_ROOT``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsagent"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 hosts in brackets) for the optional TCP listener."""
    host, sep, port = str(text).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidInput(f"invalid listen address {text!r}", hint="use HOST:PORT, e.g. 127.0.0.1:7420 or 0.0.0.0:7420")
    return host, int(port)


def _positive_int(text: str | int) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"expected a whole number, got {text!r}") from exc
    if value < 1:
        raise InvalidInput(f"expected a number >= 1, got {text!r}")
    return value


def _ratio(text: str | float) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"expected a number, got {text!r}") from exc
    if not math.isfinite(value) or value < 1.0:
        raise InvalidInput(f"the eviction ratio must be a number >= 1.0, got {text!r}")
    return value


def _flag(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise InvalidInput(f"expected a boolean (1/0, true/false), got {text!r}")


def _optional_size(text: str | int | None) -> int | None:
    if text is None or text == "":
        return None
    size = parse_size(text)
    if size < 1:
        raise InvalidInput("a capacity limit must be positive")
    return size


@dataclass(frozen=True)
class Settings:
    """Everything the agent is configured with; build it with :meth:`from_env` or directly.

    Space: ``capacity_bytes`` caps the cache below the disk's own size (None: the disk);
    ``evict_ratio`` is rule 4's 1.2. Concurrency (rule 6): ``max_fetches`` datasets cache
    at once, each with ``fetch_workers`` threads. Leases: a task's datasets stay in use for
    ``lease_ttl`` seconds after its last request (repeat the request to renew).
    """

    root: Path = field(default_factory=default_root)
    socket_path: Path | None = None  # None: <root>/dsagent.sock
    listen: tuple[str, int] | None = None
    admin_token: str | None = field(default=None, repr=False)
    node_name: str = field(default_factory=socket.gethostname)
    capacity_bytes: int | None = None
    evict_ratio: float = 1.2
    idle_ttl: float = 7 * 86400.0
    lease_ttl: float = 6 * 3600.0
    sweep_interval: float = 60.0
    max_fetches: int = 4
    fetch_workers: int = 8
    max_body_bytes: int = 1 << 20
    local_sources: tuple[Path, ...] = ()  # local directories requests may name as sources
    kubernetes: bool = False
    log_level: str = "info"
    # --- issue 12: CSI ---
    csi_socket: Path | None = None  # None: no CSI node plugin (docs/design.md#csi)
    csi_driver_name: str = "datasets.dsagent.io"
    csi_kubelet_pods_dir: Path = Path("/var/lib/kubelet/pods")  # NodePublish targets must lie under it
    # --- end issue 12 ---

    @property
    def socket(self) -> Path:
        return self.socket_path if self.socket_path is not None else self.root / "dsagent.sock"

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with flag values applied (``None`` means "not given")."""
        given = {key: value for key, value in changes.items() if value is not None}
        return _validated(replace(self, **given)) if given else self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``DSAGENT_*`` variables; raises :class:`SettingsError` for a bad one."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for attr, (var, parse) in _ENV.items():
            raw = env.get(ENV_PREFIX + var)
            if raw is not None:
                values[attr] = _parse_setting(var, raw, parse)
        token_file = env.get(ENV_PREFIX + "ADMIN_TOKEN_FILE")
        if token_file and "admin_token" not in values:
            values["admin_token"] = _read_token(token_file)
        return _validated(cls(**values))


def _parse_setting(var: str, raw: str, parse: Callable[[str], _T]) -> _T:
    try:
        return parse(raw)
    except (InvalidInput, UnitError) as exc:
        raise SettingsError(f"{ENV_PREFIX}{var}={raw!r}: {exc.message}", hint=exc.hint) from exc


def _read_token(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise SettingsError(f"{ENV_PREFIX}ADMIN_TOKEN_FILE: cannot read {path!r}: {exc.strerror}") from exc


def _validated(settings: Settings) -> Settings:
    if not str(settings.root):
        raise SettingsError("the cache root must not be empty")
    if settings.admin_token is not None and len(settings.admin_token) < 16:
        raise SettingsError("the admin token must be at least 16 characters", hint="generate one with: openssl rand -hex 16")
    if settings.log_level not in ("critical", "error", "warning", "info", "debug"):
        raise SettingsError(f"unknown log level {settings.log_level!r}", hint="use one of critical, error, warning, info, debug")
    if len(str(settings.socket).encode()) > 107:
        raise SettingsError(f"socket path {str(settings.socket)!r} is too long for a unix socket (max 107 bytes)")
    return replace(settings, root=Path(settings.root).expanduser().absolute())


_ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "root": ("ROOT", Path),
    "socket_path": ("SOCKET", Path),
    "listen": ("LISTEN", parse_listen),
    "admin_token": ("ADMIN_TOKEN", str),
    "node_name": ("NODE_NAME", str),
    "capacity_bytes": ("CAPACITY", _optional_size),
    "evict_ratio": ("EVICT_RATIO", _ratio),
    "idle_ttl": ("IDLE_TTL", parse_duration),
    "lease_ttl": ("LEASE_TTL", parse_duration),
    "sweep_interval": ("SWEEP_INTERVAL", parse_duration),
    "max_fetches": ("MAX_FETCHES", _positive_int),
    "fetch_workers": ("FETCH_WORKERS", _positive_int),
    "max_body_bytes": ("MAX_BODY", parse_size),
    "local_sources": ("LOCAL_SOURCES", lambda raw: tuple(Path(p) for p in raw.split(os.pathsep) if p)),
    "kubernetes": ("KUBERNETES", _flag),
    "log_level": ("LOG_LEVEL", str.lower),
    # --- issue 12: CSI ---
    "csi_socket": ("CSI_SOCKET", Path),
    "csi_driver_name": ("CSI_DRIVER_NAME", str),
    "csi_kubelet_pods_dir": ("CSI_KUBELET_PODS_DIR", Path),
    # --- end issue 12 ---
}

__all__ = ["ENV_PREFIX", "Settings", "default_root", "parse_duration", "parse_listen"]
