"""``dsctl digest / pack / unpack / verify``: datasets, manifests and bundles from the shell.

Who calls it: operators and CI jobs preparing datasets (``pack``), init-containers and
humans checking a copy (``unpack``, ``verify``). Each command prints one summary line
on stdout (``--json`` for machines where it makes sense) and, on a terminal, a progress
bar on stderr. Errors are the package's own (:mod:`dsagent.errors`); the CLI's edge in
:mod:`dsagent.cli` turns them into one line and a distinct exit code.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from dsagent.format.digestcache import DigestCache, default_cache_path
from dsagent.errors import InvalidInput
from dsagent.format.manifest import Manifest, Progress, read_manifest
from dsagent.format.digester import build_manifest
from dsplatform.units import format_size, parse_size


@contextmanager
def progress_bar(label: str, total_bytes: int | None) -> Iterator[Progress | None]:
    """Progress on stderr when it is a terminal: a bar when the total is known, a counter otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    if total_bytes is None:
        with _counter(label) as advance:
            yield advance
        return
    with click.progressbar(length=max(total_bytes, 1), label=label, file=sys.stderr, show_pos=False, show_percent=True, show_eta=True) as bar:

        def advance_bar(done_bytes: int, _files: int) -> None:
            bar.update(done_bytes)

        yield advance_bar


@contextmanager
def _counter(label: str) -> Iterator[Progress]:
    done = {"bytes": 0, "files": 0, "shown": 0.0}

    def advance(done_bytes: int, files: int) -> None:
        done["bytes"] += done_bytes
        done["files"] += files
        now = time.monotonic()
        if now - done["shown"] > 0.2:
            done["shown"] = now
            click.echo(f"\r{label}: {int(done['files'])} files, {format_size(done['bytes'])}\x1b[K", file=sys.stderr, nl=False)

    try:
        yield advance
    finally:
        if done["shown"]:
            click.echo("\r\x1b[K", file=sys.stderr, nl=False)


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` flags as fsspec storage options (values parsed as JSON when they are)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"storage option {pair!r} is not KEY=VALUE", hint="e.g. -o anon=true -o endpoint_url=http://minio:9000")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _default_name(source: str) -> str:
    base = source.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", base).lstrip("-._")
    return cleaned or "dataset"


def _rate(size: int, seconds: float) -> str:
    return f"{format_size(size / seconds)}/s" if seconds > 0 else "-"


def _cache(enabled: bool) -> DigestCache | None:
    return DigestCache(default_cache_path()) if enabled else None


_source_options = click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE", help="fsspec storage option for the source (repeatable).")
_cache_flag = click.option("--digest-cache/--no-digest-cache", default=True, show_default=True, help="Reuse digests of unchanged local files (SQLite under ~/.cache/dsplatform).")


@click.command()
@click.argument("source")
@click.option("--name", help="Dataset name for the manifest (default: the source's last path component).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON instead of a summary line.")
@_source_options
@_cache_flag
def digest(source: str, name: str | None, as_json: bool, options: tuple[str, ...], digest_cache: bool) -> None:
    """Digest SOURCE (a local path or fsspec URL) and print its dataset digest."""
    start = time.monotonic()
    cache = _cache(digest_cache)
    try:
        with progress_bar("digesting", None) as progress:
            manifest = build_manifest(source, name=name or _default_name(source), storage_options=_options(options), digest_cache=cache, progress=progress)
    finally:
        if cache is not None:
            cache.close()
    elapsed = time.monotonic() - start
    if as_json:
        click.echo(json.dumps(_manifest_json(manifest), ensure_ascii=False))
        return
    click.echo(
        f"{manifest.name}: {manifest.file_count} files, {format_size(manifest.total_bytes)}, "
        f"digest {manifest.digest} ({elapsed:.1f} s, {_rate(manifest.total_bytes, elapsed)})"
    )


def _manifest_json(manifest: Manifest) -> dict[str, Any]:
    return {
        "name": manifest.name,
        "digest": manifest.digest,
        "files": manifest.file_count,
        "bytes": manifest.total_bytes,
        "emptyDirectories": list(manifest.directories),
        "entries": [{"path": e.path, "size": e.size, "mtimeNs": e.mtime_ns, "digest": e.digest} for e in manifest.entries],
    }


@click.command()
@click.argument("source")
@click.option("--name", required=True, help="Dataset name in the store.")
@click.option("--to", "store", required=True, metavar="STORE", help="Bundle store: a directory or fsspec URL.")
@click.option("--max-files", type=click.IntRange(min=1), default=50_000, show_default=True, help="At most this many files per bundle.")
@click.option("--max-bytes", default="800MB", show_default=True, help="At most this many uncompressed bytes per bundle (800MB, 1GiB, ...).")
@click.option("--level", type=click.IntRange(min=-7, max=22), default=1, show_default=True, help="zstd compression level.")
@click.option("--threads", type=click.IntRange(min=0), default=None, help="zstd threads per bundle (default: automatic).")
@_source_options
@click.option("--store-option", "store_options", multiple=True, metavar="KEY=VALUE", help="fsspec storage option for the store (repeatable).")
@_cache_flag
@click.option("--publish", "publish_namespace", metavar="NAMESPACE", default=None,
              help="Record the packed digest in the status of Dataset NAME in NAMESPACE (created if missing; needs a kubeconfig or a service account).")
def pack(
    source: str, name: str, store: str, max_files: int, max_bytes: str, level: int, threads: int | None,
    options: tuple[str, ...], store_options: tuple[str, ...], digest_cache: bool, publish_namespace: str | None,
) -> None:  # fmt: skip
    """Digest SOURCE and pack it into tar+zstd bundles in STORE as dataset NAME."""
    from dsagent.format.bundle import write_bundles

    cap = parse_size(max_bytes)
    if cap < 1:
        raise InvalidInput("--max-bytes must be at least 1 byte")
    src_options, dst_options = _options(options), _options(store_options)
    start = time.monotonic()
    cache = _cache(digest_cache)
    try:
        with progress_bar("digesting", None) as progress:
            manifest = build_manifest(source, name=name, storage_options=src_options, digest_cache=cache, progress=progress)
    finally:
        if cache is not None:
            cache.close()
    with progress_bar("packing  ", manifest.total_bytes) as progress:
        packed, reused = write_bundles(
            manifest, source, store, max_files=max_files, max_bytes=cap, level=level, threads=threads,
            storage_options=src_options, store_options=dst_options, progress=progress,
        )  # fmt: skip
    elapsed = time.monotonic() - start
    compressed = sum(b.compressed_size for b in packed.bundles)
    click.echo(
        f"packed {packed.name}: {packed.file_count} files, {format_size(packed.total_bytes)} into "
        f"{len(packed.bundles)} bundles ({len(packed.bundles) - reused} written, {reused} reused, "
        f"{format_size(compressed)} stored) in {elapsed:.1f} s ({_rate(packed.total_bytes, elapsed)}); digest {packed.digest}"
    )
    if publish_namespace:
        from dsagent.kube.datasets import publish

        dataset = publish(packed, namespace=publish_namespace, source=source, bundles=store)
        click.echo(f"published Dataset {dataset.namespace}/{dataset.name}: digest {dataset.digest}")


@click.command()
@click.argument("store")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--name", required=True, help="Dataset name in the store.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Bundles unpacked at once (default: one per core, at most 4).")
@click.option("--store-option", "store_options", multiple=True, metavar="KEY=VALUE", help="fsspec storage option for the store (repeatable).")
def unpack(store: str, dest: str, name: str, workers: int | None, store_options: tuple[str, ...]) -> None:
    """Unpack dataset NAME from STORE into the new directory DEST, verifying every file."""
    from dsagent.format.bundle import unpack as unpack_dataset

    options = _options(store_options)
    start = time.monotonic()
    manifest = read_manifest(store, name, storage_options=options)
    with progress_bar("unpacking", manifest.total_bytes) as progress:
        unpack_dataset(store, name=name, dest=dest, manifest=manifest, workers=workers, storage_options=options, progress=progress)
    elapsed = time.monotonic() - start
    click.echo(
        f"unpacked {manifest.name} into {dest}: {manifest.file_count} files, {format_size(manifest.total_bytes)} "
        f"from {len(manifest.bundles)} bundles, all verified, in {elapsed:.1f} s ({_rate(manifest.total_bytes, elapsed)}); digest {manifest.digest}"
    )


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--manifest", "store", required=True, metavar="STORE", help="Bundle store holding the dataset's manifest.")
@click.option("--name", required=True, help="Dataset name in the store.")
@click.option("--store-option", "store_options", multiple=True, metavar="KEY=VALUE", help="fsspec storage option for the store (repeatable).")
def verify(directory: str, store: str, name: str, store_options: tuple[str, ...]) -> None:
    """Check that DIRECTORY holds exactly dataset NAME's files (reads and hashes every file)."""
    from dsagent.format.bundle import verify_tree

    start = time.monotonic()
    manifest = read_manifest(store, name, storage_options=_options(store_options))
    verify_tree(os.fspath(directory), manifest)
    elapsed = time.monotonic() - start
    click.echo(f"{directory} matches {manifest.name}: {manifest.file_count} files, {format_size(manifest.total_bytes)}, digest {manifest.digest} ({elapsed:.1f} s)")
