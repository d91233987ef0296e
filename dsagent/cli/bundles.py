"""``dsctl digest / pack / unpack / verify``: datasets, manifests and bundles from the shell.

Who calls it: operators and CI jobs preparing datasets (``pack``), init-containers and
humans checking a copy (``unpack``, ``verify``). Each command prints one summary line
on stdout (``--json`` for machines where it makes sense) and, on a terminal, a progress
bar on stderr. Errors are the package's own (:mod:`dsagent.errors`); the CLI's edge in
:mod:`dsagent.cli` turns them into one line and a distinct exit code.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from dsagent.cli.bundlework import emit, options_for_stores, pack_source, unpack_store
from dsagent.cli.digesting import counter, digest_source
from dsagent.cli.options import output_option, source_options, store_options
from dsagent.format.manifest import Progress, read_manifest
from dsplatform.heap import collector_paused
from dsplatform.units import format_size

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
    pack_source(
        source, name, store, max_files=max_files, max_bytes=max_bytes, level=level, threads=threads,
        processes=processes, source_options=source_opts, store_options=store_opts, output=output,
        digest_cache=digest_cache, publish_namespace=publish_namespace, echo=click.echo,
    )  # fmt: skip


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
    unpack_store(
        store,
        dest,
        name,
        workers=workers,
        store_options=store_opts,
        output=output,
        progress_for=progress_bar,
        echo=click.echo,
    )


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
    emit(
        click.echo,
        output,
        data,
        f"{directory} matches {manifest.name}: {manifest.file_count} files, {format_size(manifest.total_bytes)}, "
        f"digest {manifest.digest} ({elapsed:.1f} s)",
    )
