"""The ``DSAGENT_*`` settings that several dsagent processes read, and the local agent's paths.

Who calls it: the node agent's settings (:mod:`dsagent.cache.settings`, which build on these),
the admission webhook and the Dataset controller (their log variables and listen syntax), and
``dsctl`` (the default root and the socket record it finds a local agent by).
What it owns: the variables' prefix, the token length rule, the ``HOST:PORT`` syntax, the
per-user default root and socket record, and :class:`AgentLogSettings`. Nothing here reads
the environment at import; the functions take it as an argument (default: the process's).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from pydantic_settings import SettingsConfigDict

from dsagent.errors import SettingsError
from dsplatform.logs import LogSettings
from dsplatform.paths import agent_default_root, agent_records_dir
from dsplatform.units import UnitError

ENV_PREFIX = "DSAGENT_"
#: the shortest admin or peer token the agent accepts
TOKEN_MIN_CHARS = 16


def check_token(value: str | None, what: str) -> str | None:
    """``value`` when it is long enough to be ``what`` (the admin or the peer token), or unset."""
    if value is not None and len(value) < TOKEN_MIN_CHARS:
        raise ValueError(
            f"the {what} must be at least {TOKEN_MIN_CHARS} characters (generate one with: openssl rand -hex 16)"
        )
    return value


def default_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/dsagent`` (or ``~/.cache/dsagent``); the chart sets ``DSAGENT_ROOT``."""
    return agent_default_root(os.environ if environ is None else environ)


def agent_records(environ: Mapping[str, str] | None = None) -> Path:
    """The per-user folder where each running ``dsagent serve`` records its root and socket,
    one file per root (``$XDG_RUNTIME_DIR/dsagent/agents``, else ``~/.cache/dsagent-agents``);
    ``dsctl`` reads it when neither ``DSAGENT_SOCKET`` nor ``DSAGENT_ROOT`` is set (through
    :func:`dsplatform.paths.agent_records_dir`, without this module's imports)."""
    return agent_records_dir(os.environ if environ is None else environ)


def agent_record_name(root: Path) -> str:
    """The file name of the record of the agent serving ``root``: one per root."""
    return hashlib.sha256(str(root.absolute()).encode()).hexdigest()[:16] + ".json"


def parse_listen(text: str | tuple[str, int]) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 hosts in brackets) for the optional TCP listener."""
    if isinstance(text, tuple):
        text = f"[{text[0]}]:{text[1]}" if ":" in str(text[0]) else f"{text[0]}:{text[1]}"
    host, sep, port = str(text).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UnitError(f"invalid listen address {text!r}", hint="use HOST:PORT, e.g. 127.0.0.1:7420 or [::1]:7420")
    return host, int(port)


class AgentLogSettings(LogSettings):
    """``DSAGENT_LOG_LEVEL``, ``DSAGENT_LOG_FORMAT`` and ``DSAGENT_ACCESS_LOG``: read by every
    ``DSAGENT_*`` process (the agent as part of :class:`Settings`; the controller and the
    webhook on their own), docs/design.md#logs."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)
    settings_error: ClassVar[type[Exception] | None] = SettingsError


__all__ = [
    "ENV_PREFIX",
    "TOKEN_MIN_CHARS",
    "AgentLogSettings",
    "check_token",
    "default_root",
    "parse_listen",
    "agent_record_name",
    "agent_records",
]
