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
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dsagent.cli.digesting import counter, digest_source, open_cache, rate
from dsagent.cli.options import options_for_stores, output_option, source_options, store_options
from dsagent.errors import InvalidInput
from dsagent.format.manifest import Progress, read_manifest
from dsplatform.heap import collector_paused
from dsplatform.units import format_size, parse_size

if TYPE_CHECKING:
    pass

_F = TypeVar("_F", bound=Callable[..., Any])


@contextmanager
def progress_bar(label: str, total_bytes: int | None) -> Iterator[Progress | None]:
    """Progress on stderr when it is a terminal: a bar when the total is known, a counter otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    if total_bytes is None:
        with counter(label) as advance:
            yield advance
        return
    with click.progressbar(
        length=max(total_bytes, 1), label=label, file=sys.stderr, show_pos=False, show_percent=True, show_eta=True
    ) as bar:

        def advance_bar(done_bytes: int, _files: int) -> None:
            bar.update(done_bytes)

        yield advance_bar


_cache_flag = click.option(
    "--digest-cache/--no-digest-cache",
    default=True,
    show_default=True,
    help="Reuse digests of unchanged local files (SQLite under ~/.cache/dsplatform).",
)


def _count_option(flag: str, default: int | None, text: str) -> Callable[[_F], _F]:
    """An option taking a count: a whole number of at least 1, its default shown when it has one."""
    shown: dict[str, Any] = {"show_default": True} if default is not None else {}
    return click.option(flag, type=click.IntRange(min=1), default=default, help=text, **shown)


def _emit(output: str, data: dict[str, Any], line: str) -> None:
    click.echo(json.dumps(data, ensure_ascii=False) if output == "json" else line)


@click.command()
@click.argument("source")
@click.option("--name", help="Dataset name for the manifest (default: the source's last path component).")
@output_option
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Old spelling of -o json.")
@source_options
@_cache_flag
def digest(
    source: str,
    name: str | None,
    output: str,
    as_json: bool,
    source_opts: dict[str, Any],
    digest_cache: bool,
) -> None:
    """Digest SOURCE (a local path or fsspec URL) and print its dataset digest (-o json: the manifest)."""
    options = options_for_stores(source_opts)
    digest_source(source, name, "json" if as_json else output, options, digest_cache, click.echo)


@click.command()
@click.argument("source")
@click.option("--name", required=True, help="Dataset name in the store.")
@click.option(
    "--to",
    "store",
    required=True,
    metavar="STORE",
    help="Bundle store: a directory or fsspec URL (its bucket must exist).",
)
@_count_option("--max-files", 50_000, "At most this many files per bundle.")
@click.option(
    "--max-bytes",
    default="800MB",
    show_default=True,
    help="At most this many uncompressed bytes per bundle (800MB, 1GiB, ...).",
)
@click.option(
    "--level", type=click.IntRange(min=-7, max=22), default=1, show_default=True, help="zstd compression level."
)
@click.option(
    "--threads", type=click.IntRange(min=0), default=None, help="zstd threads per bundle (default: automatic)."
)
@_count_option(
    "--processes", 1, "Pack each large bundle of a local source in this many segments, one forked process each."
)
@source_options
@store_options
@output_option
@_cache_flag
@click.option(
    "--publish",
    "publish_namespace",
    metavar="NAMESPACE",
    default=None,
    help="Record the packed digest in the status of Dataset NAME in NAMESPACE"
    " (created if missing; needs a kubeconfig or a service account).",
)
@collector_paused()
def pack(
    source: str, name: str, store: str, max_files: int, max_bytes: str, level: int, threads: int | None,
    processes: int, source_opts: dict[str, Any], store_opts: dict[str, Any], output: str, digest_cache: bool,
    publish_namespace: str | None,
) -> None:  # fmt: skip
    """Digest SOURCE and pack it into tar+zstd bundles in STORE as dataset NAME.

    A local SOURCE is read once: each file is hashed while it is packed.
    """
    from dsagent.format.bundles.bundle import PackOptions, pack_dataset

    cap = parse_size(max_bytes)
    if cap < 1:
        raise InvalidInput("--max-bytes must be at least 1 byte")
    src_options = options_for_stores(source_opts)
    dst_options = options_for_stores(store_opts)
    start = time.monotonic()
    cache = open_cache(digest_cache)
    try:
        with progress_bar("packing", None) as progress:
            options = PackOptions(
                max_files=max_files, max_bytes=cap, level=level, threads=threads, storage_options=src_options,
                store_options=dst_options, progress=progress, digest_cache=cache, processes=processes,
            )  # fmt: skip
            packed, reused = pack_dataset(source, store, options, name=name)
    finally:
        if cache is not None:
            cache.close()
    elapsed = time.monotonic() - start
    compressed = sum(b.compressed_size for b in packed.bundles)
    published = None
    if publish_namespace:
        from dsagent.kube.datasets import publish

        published = publish(packed, namespace=publish_namespace, source=source, bundles=store)
    data = {
        "name": packed.name, "digest": packed.digest, "files": packed.file_count, "bytes": packed.total_bytes,
        "bundles": len(packed.bundles), "written": len(packed.bundles) - reused, "reused": reused,
        "storedBytes": compressed,
        "seconds": round(elapsed, 3), **({"published": f"{published.namespace}/{published.name}"} if published else {}),
    }  # fmt: skip
    line = (
        f"packed {packed.name}: {packed.file_count} files, {format_size(packed.total_bytes)} into "
        f"{len(packed.bundles)} bundles ({len(packed.bundles) - reused} written, {reused} reused, "
        f"{format_size(compressed)} stored) in {elapsed:.1f} s ({rate(packed.total_bytes, elapsed)}); "
        f"digest {packed.digest}"
    )
    if published is not None:
        line += f"\npublished Dataset {published.namespace}/{published.name}: digest {published.digest}"
    _emit(output, data, line)


@click.command()
@click.argument("store")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--name", required=True, help="Dataset name in the store.")
@_count_option("--workers", None, "Bundles unpacked at once (default: one per core, at most 4).")
@store_options
@output_option
@collector_paused()
def unpack(
    store: str,
    dest: str,
    name: str,
    workers: int | None,
    store_opts: dict[str, Any],
    output: str,
) -> None:
    """Unpack dataset NAME from STORE into the new directory DEST, verifying every file."""
    from dsagent.format.bundles.extract import unpack as unpack_dataset

    options = options_for_stores(store_opts)
    start = time.monotonic()
    manifest = read_manifest(store, name, storage_options=options)
    with progress_bar("unpacking", manifest.total_bytes) as progress:
        unpack_dataset(
            store, name=name, dest=dest, manifest=manifest, workers=workers, storage_options=options, progress=progress
        )
    elapsed = time.monotonic() - start
    data = {
        "name": manifest.name,
        "digest": manifest.digest,
        "dest": dest,
        "files": manifest.file_count,
        "bytes": manifest.total_bytes,
        "bundles": len(manifest.bundles),
        "seconds": round(elapsed, 3),
    }
    _emit(output, data, (
        f"unpacked {manifest.name} into {dest}: {manifest.file_count} files, {format_size(manifest.total_bytes)} "
        f"from {len(manifest.bundles)} bundles, all verified, in {elapsed:.1f} s "
        f"({rate(manifest.total_bytes, elapsed)}); digest {manifest.digest}"
    ))  # fmt: skip


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option(
    "--manifest", "store", required=True, metavar="STORE", help="Bundle store holding the dataset's manifest."
)
@click.option("--name", required=True, help="Dataset name in the store.")
@store_options
@output_option
def verify(
    directory: str,
    store: str,
    name: str,
    store_opts: dict[str, Any],
    output: str,
) -> None:
    """Check that DIRECTORY holds exactly dataset NAME's files (reads and hashes every file)."""
    from dsagent.format.bundles.extract import verify_tree

    start = time.monotonic()
    manifest = read_manifest(store, name, storage_options=options_for_stores(store_opts))
    verify_tree(os.fspath(directory), manifest)
    elapsed = time.monotonic() - start
    data = {
        "directory": directory,
        "name": manifest.name,
        "digest": manifest.digest,
        "files": manifest.file_count,
        "bytes": manifest.total_bytes,
        "seconds": round(elapsed, 3),
    }
    _emit(
        output,
        data,
        f"{directory} matches {manifest.name}: {manifest.file_count} files, {format_size(manifest.total_bytes)}, "
        f"digest {manifest.digest} ({elapsed:.1f} s)",
    )
