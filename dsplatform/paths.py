"""Where the platform keeps per-user files: the one XDG cache-base rule.

Who calls it: the agent's settings (its default cache root and the socket pointer,
:mod:`dsagent.cache.settings`) and ``dsctl`` (its digest cache, :mod:`dsagent.cli.bundles`).
What it owns: ``$XDG_CACHE_HOME``, else ``~/.cache`` (the XDG Base Directory rule: an unset
or empty variable means the default). It reads no environment itself: callers at the edges
pass theirs (``os.environ``), so nothing below them depends on the process's variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_home(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME`` from ``environ``, else ``~/.cache``."""
    base = environ.get("XDG_CACHE_HOME")
    return Path(base) if base else Path(os.path.expanduser("~")) / ".cache"


__all__ = ["cache_home"]
