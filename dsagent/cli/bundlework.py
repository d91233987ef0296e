"""``dsctl pack`` and ``dsctl unpack``'s work, and the quick way in that skips click.

Who calls it: the ``pack`` and ``unpack`` click commands (:mod:`dsagent.cli.bundles`) and
:func:`dsagent.cli.main`, which offers the command line to :func:`quick_bundles` after
:func:`dsagent.cli.digesting.quick_digest`.

Why a second way in: ``dsctl pack`` and ``dsctl unpack`` are timed against ``tar | zstd``,
and importing click costs 20 ms on the 2-core build machine (more on a GPU node, whose
interpreter starts slower): a tenth of one bundle's unpack there. The plain forms,

    dsctl pack SOURCE --name N --to STORE [--max-files N] [--max-bytes SIZE] [--level L]
               [--threads N] [--processes N] [-o text|json] [--[no-]digest-cache]
    dsctl unpack STORE DEST --name N [--workers N] [-o text|json]

of local paths (no ``:`` in them), each option once, are parsed here. Any other form
(``--help``, storage options, ``--publish``, a URL, a value click would refuse, an unpack
with a terminal to draw its bar on) returns False and goes through click, whose options,
checks and help stay the reference: a value is taken here only where click takes it the
same, and anything else is left to click to refuse in its words. Both ways run
:func:`pack_source` and :func:`unpack_store`.

Nothing here imports click.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from dsagent.cli.digesting import counter, open_cache, rate
from dsagent.errors import InvalidInput
from dsplatform.heap import collector_paused
from dsplatform.units import format_size, parse_size

if TYPE_CHECKING:
    from dsagent.format.manifest import Progress
    from dsagent.format.storageconfig import StorageConfig, StoreOptions

#: ``(label, total bytes or None)`` -> a progress reporter (None: nothing shown)
ProgressFor = Callable[[str, "int | None"], AbstractContextManager["Progress | None"]]
Echo = Callable[[str], None]


def options_for_stores(options: Mapping[str, Any]) -> StoreOptions:
    """``options`` (as :func:`dsagent.cli.options.storage_options` read them) with the storage
    bounds of the settings beside them, for every filesystem the command builds
    (:mod:`dsagent.format.storageconfig`)."""
    from dsagent.format.storageconfig import with_config

    return with_config(options, settings_storage_config)


def settings_storage_config(environ: Mapping[str, str] | None = None) -> StorageConfig:
    """The storage bounds the settings (``os.environ`` unless given) make; called when the
    first remote filesystem is built (a local-only command never imports pydantic); a bad
    setting is a SettingsError then."""
    from dsagent.errors import SettingsError
    from dsagent.format.storagesettings import StorageSettings
    from dsplatform.settings import InvalidSettings

    try:
        return StorageSettings.read(environ).storage_config
    except InvalidSettings as exc:
        raise SettingsError(exc.message) from None


def emit(echo: Echo, output: str, data: dict[str, Any], line: str) -> None:
    """The command's result: ``data`` as one JSON line (``-o json``), else ``line``."""
    echo(json.dumps(data, ensure_ascii=False) if output == "json" else line)


def pack_source(
    source: str, name: str, store: str, *, max_files: int, max_bytes: str, level: int, threads: int | None,
    processes: int, source_options: Mapping[str, Any], store_options: Mapping[str, Any], output: str,
    digest_cache: bool, publish_namespace: str | None, echo: Echo,
) -> None:  # fmt: skip
    """Digest ``source`` and pack it into bundles in ``store`` as dataset ``name``; print the result."""
    from dsagent.format.bundles.bundle import PackOptions, pack_dataset

    cap = parse_size(max_bytes)
    if cap < 1:
        raise InvalidInput("--max-bytes must be at least 1 byte")
    src_options = options_for_stores(source_options)
    dst_options = options_for_stores(store_options)
    start = time.monotonic()
    cache = open_cache(digest_cache)
    try:
        with counter("packing") as progress:
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
    emit(echo, output, data, line)


def unpack_store(
    store: str, dest: str, name: str, *, workers: int | None, store_options: Mapping[str, Any], output: str,
    progress_for: ProgressFor, echo: Echo,
) -> None:  # fmt: skip
    """Unpack dataset ``name`` from ``store`` into the new directory ``dest``; print the result."""
    from dsagent.format.bundles.extract import unpack as unpack_dataset
    from dsagent.format.manifest import read_manifest

    options = options_for_stores(store_options)
    start = time.monotonic()
    manifest = read_manifest(store, name, storage_options=options)
    with progress_for("unpacking", manifest.total_bytes) as progress:
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
    emit(echo, output, data, (
        f"unpacked {manifest.name} into {dest}: {manifest.file_count} files, {format_size(manifest.total_bytes)} "
        f"from {len(manifest.bundles)} bundles, all verified, in {elapsed:.1f} s "
        f"({rate(manifest.total_bytes, elapsed)}); digest {manifest.digest}"
    ))  # fmt: skip


def _count(low: int, high: int | None = None) -> Callable[[str], int | None]:
    """A whole number in ``[low, high]`` as click's ``IntRange`` reads it (None: click's to refuse)."""

    def read(value: str) -> int | None:
        try:
            number = int(value.strip())  # click's int: int(), surrounding blanks allowed
        except ValueError:
            return None
        return number if number >= low and (high is None or number <= high) else None

    return read


def _output(value: str) -> str | None:
    return value if value in ("text", "json") else None


#: each command's plain form: positional parameters, then its options (flag -> (parameter,
#: reader of the value: None for a flag), and its defaults (a parameter absent from them is
#: required)
_FORMS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, Callable[[str], Any] | None]], dict[str, Any]]] = {
    "pack": (
        ("source",),
        {
            "--name": ("name", str), "--to": ("store", str), "--max-files": ("max_files", _count(1)),
            "--max-bytes": ("max_bytes", str), "--level": ("level", _count(-7, 22)),
            "--threads": ("threads", _count(0)), "--processes": ("processes", _count(1)),
            "-o": ("output", _output), "--output": ("output", _output),
            "--digest-cache": ("digest_cache", None), "--no-digest-cache": ("digest_cache", None),
        },
        {"max_files": 50_000, "max_bytes": "800MB", "level": 1, "threads": None, "processes": 1, "output": "text",
         "digest_cache": True},
    ),
    "unpack": (
        ("store", "dest"),
        {"--name": ("name", str), "--workers": ("workers", _count(1)), "-o": ("output", _output),
         "--output": ("output", _output)},
        {"workers": None, "output": "text"},
    ),
}  # fmt: skip


def parse_plain(args: Sequence[str]) -> tuple[str, dict[str, Any]] | None:
    """``(command, parameters)`` for the plain form of ``pack`` or ``unpack`` in ``args``; None
    for any other command line (click's to read)."""
    if not args or args[0] not in _FORMS:
        return None
    command = args[0]
    positionals, options, defaults = _FORMS[command]
    given: dict[str, Any] = {}
    values: list[str] = []
    rest = list(args[1:])
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-"):
            if ":" in arg or len(values) == len(positionals):
                return None  # a URL (fsspec's way, through click) or one argument too many
            values.append(arg)
            continue
        flag, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if flag not in options:
            return None
        parameter, read = options[flag]
        if parameter in given:
            return None  # given twice: click's rule (the last wins, or an error) applies
        if read is None:
            if eq:
                return None
            given[parameter] = flag == "--digest-cache"
            continue
        if not eq:
            if not rest:
                return None
            value = rest.pop(0)
        parsed = read(value)
        if parsed is None or (parameter == "store" and ":" in parsed):
            return None  # a value click refuses, or a URL
        given[parameter] = parsed
    if len(values) != len(positionals):
        return None
    parameters = {**defaults, **dict(zip(positionals, values, strict=True)), **given}
    if any(parameter not in parameters for parameter, _ in options.values()):
        return None  # a required option is missing: click says which
    if command == "unpack" and os.path.isfile(parameters["dest"]):
        return None  # click's path check says it is a file
    return command, parameters


@contextmanager
def _no_progress(_label: str, _total: int | None) -> Iterator[None]:
    yield None


def quick_bundles(args: Sequence[str]) -> bool:
    """Run ``dsctl pack`` or ``dsctl unpack`` from ``args`` when it is the plain form of local
    paths; False (having done nothing) when click must parse it."""
    plain = parse_plain(args)
    if plain is None:
        return False
    command, parameters = plain
    if command == "unpack" and sys.stderr.isatty():
        return False  # the bar a terminal is shown is click's

    def echo(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    with collector_paused():  # a few objects a file, no cycles (dsplatform.heap)
        if command == "pack":
            source, name, store = parameters.pop("source"), parameters.pop("name"), parameters.pop("store")
            pack_source(
                source, name, store, **parameters, source_options={}, store_options={}, publish_namespace=None,
                echo=echo,
            )  # fmt: skip
        else:
            store, dest, name = parameters.pop("store"), parameters.pop("dest"), parameters.pop("name")
            unpack_store(store, dest, name, **parameters, store_options={}, progress_for=_no_progress, echo=echo)
    return True


__all__ = [
    "emit", "options_for_stores", "pack_source", "parse_plain", "quick_bundles", "settings_storage_config",
    "unpack_store",
]  # fmt: skip
