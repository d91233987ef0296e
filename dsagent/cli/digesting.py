"""``dsctl digest``'s work, and the quick way in that skips click for a local source.

Who calls it: the ``digest`` click command (:mod:`dsagent.cli.bundles`) and
:func:`dsagent.cli.main`, which first offers the command line to :func:`quick_digest`.

Why a second way in: users time ``dsctl digest`` against ``xxh128sum``, and on a small
dataset the process is mostly start-up. Importing click costs about as much CPU as the
interpreter's own start, so the plain form ``dsctl digest PATH [--name N] [-o text|json]
[--json] [--[no-]digest-cache]`` of a local path (no ``:`` in it) is parsed here with no
import beyond what digesting needs; any other form (``--help``, storage options, a URL,
anything unrecognised) returns None and goes through click, whose options and help stay
the reference. Both ways run :func:`digest_source`.

Nothing here imports click.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from dsplatform.heap import collector_paused
from dsplatform.units import format_size

if TYPE_CHECKING:
    from pathlib import Path

    from dsagent.format.digestcache import DigestCache
    from dsagent.format.manifest import Manifest, Progress
    from dsagent.format.storageconfig import Options


def default_name(source: str) -> str:
    """The dataset name ``digest`` and ``pack`` use when none is given: the source's last path component."""
    base = source.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", base).lstrip("-._")
    return cleaned or "dataset"


def rate(size: int, seconds: float) -> str:
    return f"{format_size(size / seconds)}/s" if seconds > 0 else "-"


def digest_cache_path(environ: Mapping[str, str]) -> Path:
    """``$DSAGENT_DIGEST_CACHE``, else ``$XDG_CACHE_HOME/dsplatform/digests.sqlite``."""
    from pathlib import Path  # here: a command without the digest cache needs no path objects

    from dsplatform.paths import cache_home

    explicit = environ.get("DSAGENT_DIGEST_CACHE")
    return Path(explicit) if explicit else cache_home(environ) / "dsplatform" / "digests.sqlite"


def open_cache(enabled: bool) -> DigestCache | None:
    if not enabled:
        return None  # and sqlite3 is not imported
    from dsagent.format.digestcache import DigestCache

    return DigestCache(digest_cache_path(os.environ))


class Counter:
    """Files and bytes done, on one line of a terminal; once the work's size is known
    (:func:`dsagent.format.manifest.expect_total`), against the totals, with a percentage,
    the rate and an ETA: ``packing: 12,000/50,000 files, 190 MB/800 MB (23%), 45 MB/s, eta 13s``."""

    def __init__(self, label: str, stream: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.stream, self.clock = label, stream or sys.stderr, clock
        self.bytes = self.files = 0
        self.total_bytes: int | None = None
        self.total_files: int | None = None
        self.started = clock()
        self.shown = 0.0

    def expect(self, total_bytes: int, total_files: int) -> None:
        self.total_bytes, self.total_files = total_bytes, total_files

    def __call__(self, done_bytes: int, files: int) -> None:
        self.bytes += done_bytes
        self.files += files
        now = self.clock()
        if now - self.shown > 0.2:
            self.shown = now
            self.stream.write(f"\r{self.line(now)}\x1b[K")
            self.stream.flush()

    def line(self, now: float) -> str:
        if self.total_bytes is None or self.total_files is None:
            return f"{self.label}: {self.files:,} files, {format_size(self.bytes)}"
        elapsed = max(now - self.started, 1e-6)
        rate = self.bytes / elapsed
        left = max(0, self.total_bytes - self.bytes)
        eta = f", eta {left / rate:.0f}s" if rate > 0 and self.bytes else ""
        percent = 100 * self.bytes // self.total_bytes if self.total_bytes else 100
        return (
            f"{self.label}: {self.files:,}/{self.total_files:,} files, "
            f"{format_size(self.bytes)}/{format_size(self.total_bytes)} ({percent}%), {format_size(rate)}/s{eta}"
        )

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


@contextmanager
def counter(label: str) -> Iterator[Progress | None]:
    """A :class:`Counter` on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    shown = Counter(label)
    try:
        yield shown
    finally:
        shown.clear()


def manifest_json(manifest: Manifest) -> dict[str, Any]:
    return {
        "name": manifest.name,
        "digest": manifest.digest,
        "files": manifest.file_count,
        "bytes": manifest.total_bytes,
        "emptyDirectories": list(manifest.directories),
        "entries": [
            {"path": e.path, "size": e.size, "mtimeNs": e.mtime_ns, "digest": e.digest} for e in manifest.entries
        ],
    }


def digest_source(
    source: str,
    name: str | None,
    output: str,
    storage_options: Options,
    use_cache: bool,
    echo: Callable[[str], None],
) -> None:
    """Digest ``source`` and print its digest line (``output == "json"``: the manifest)."""
    from dsagent.format.digester import build_manifest

    start = time.monotonic()
    cache = open_cache(use_cache)
    try:
        with counter("digesting") as progress:
            manifest = build_manifest(
                source,
                name=name or default_name(source),
                storage_options=storage_options,
                digest_cache=cache,
                progress=progress,
            )
    finally:
        if cache is not None:
            cache.close()
    elapsed = time.monotonic() - start
    if output == "json":
        echo(json.dumps(manifest_json(manifest), ensure_ascii=False))
        return
    echo(
        f"{manifest.name}: {manifest.file_count} files, {format_size(manifest.total_bytes)}, "
        f"digest {manifest.digest} ({elapsed:.1f} s, {rate(manifest.total_bytes, elapsed)})"
    )


def _parse(args: Sequence[str]) -> dict[str, Any] | None:
    """``digest``'s plain form, or None for anything click should see."""
    if not args or args[0] != "digest":
        return None
    parsed: dict[str, Any] = {"source": None, "name": None, "output": "text", "use_cache": True}
    rest = list(args[1:])
    while rest:
        arg = rest.pop(0)
        key, eq, value = arg.partition("=")
        if key in ("--name", "-o", "--output") and not (eq and key == "-o"):
            if not eq:
                if not rest:
                    return None
                value = rest.pop(0)
            if key == "--name":
                parsed["name"] = value
            elif value in ("text", "json"):
                parsed["output"] = value
            else:
                return None
        elif arg == "--json":
            parsed["output"] = "json"
        elif arg in ("--digest-cache", "--no-digest-cache"):
            parsed["use_cache"] = arg == "--digest-cache"
        elif arg.startswith("-") or parsed["source"] is not None or ":" in arg or not arg:
            return None
        else:
            parsed["source"] = arg
    return parsed if parsed["source"] is not None else None


def quick_digest(args: Sequence[str]) -> bool:
    """Run ``dsctl digest`` from ``args`` when it is the plain form of a local path; False
    (having done nothing) when click must parse it."""
    parsed = _parse(args)
    if parsed is None:
        return False

    def echo(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    with collector_paused():  # a few objects a file, no cycles (dsplatform.heap)
        digest_source(parsed["source"], parsed["name"], parsed["output"], None, parsed["use_cache"], echo)
    return True


__all__ = [
    "default_name",
    "digest_cache_path",
    "digest_source",
    "manifest_json",
    "quick_digest",
    "rate",
]
