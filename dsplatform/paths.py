"""Where the platform keeps per-user files: the one XDG cache-base rule.

Who calls it: the agent's settings (its default cache root and the socket pointer,
:mod:`dsagent.cache.settings`, through :mod:`dsagent.envsettings`) and ``dsctl`` (its digest
cache, :mod:`dsagent.cli.bundles`; the local agent's root and records, :mod:`dsagent.cli.options`).
What it owns: ``$XDG_CACHE_HOME``, else ``~/.cache`` (the XDG Base Directory rule: an unset
or empty variable means the default), and the two per-user places of the local agent
derived from it. It reads no environment itself: callers at the edges pass theirs
(``os.environ``), so nothing below them depends on the process's variables. It imports
nothing beyond the standard library: ``dsctl cache`` finds its agent from here without
:mod:`dsagent.envsettings`, whose pydantic-settings import measured 70-115 ms of each run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_home(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME`` from ``environ``, else ``~/.cache``."""
    base = environ.get("XDG_CACHE_HOME")
    return Path(base) if base else Path(os.path.expanduser("~")) / ".cache"


def agent_default_root(environ: Mapping[str, str]) -> Path:
    """The local agent's default root: ``$XDG_CACHE_HOME/dsagent`` (or ``~/.cache/dsagent``)."""
    return cache_home(environ) / "dsagent"


def agent_records_dir(environ: Mapping[str, str]) -> Path:
    """The per-user folder where each running ``dsagent serve`` records its root and socket
    (``$XDG_RUNTIME_DIR/dsagent/agents``, else ``~/.cache/dsagent-agents``)."""
    if environ.get("XDG_RUNTIME_DIR"):
        return Path(environ["XDG_RUNTIME_DIR"]) / "dsagent" / "agents"
    return cache_home(environ) / "dsagent-agents"


__all__ = ["agent_default_root", "agent_records_dir", "cache_home"]
