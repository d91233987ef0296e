"""The one way a dataset version becomes ready (docs/design.md#ready-invariant).

Who calls it: :meth:`dsagent.cache.versions.Versions._stage_and_commit` (every fetch and every
adopted per-file copy) and :func:`dsagent.cache.recovery.reconcile` (a version whose
directory was renamed into place before a stop lost its ready commit). Nothing else
writes ``state = 'ready'``.
What it owns: the check made before that commit, from the disk and not from records:

- every file of the version's manifest is a regular file in its directory with the
  manifest's size, and every empty directory of the manifest exists
  (:func:`check_complete`: one ``lstat`` per file, no read, in C without the GIL where the
  native loops run; the contents were verified while they were written);
- for a version fetched bundle by bundle, every bundle of the manifest is recorded as
  verified by the unpack that wrote it (the catalog's "bundle done" records, which exist
  only while the staging directory holding their files does; :func:`trusted_bundles`
  drops a record whose files a resumed fetch does not find).

And the order: check, then rename the staging directory into place (unless a stop
happened after the rename), then commit ``ready``. A failed check raises
:class:`IntegrityError` and nothing is published.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dsagent.cache.catalog import Catalog
from dsagent.cache.layout import Store
from dsagent.cache.pools import Pools
from dsagent.errors import IntegrityError
from dsagent.format import native
from dsagent.format.manifest import BundleRef, EntryTable, Manifest
from dsplatform import cores

#: How many problems an error message names (the rest are counted).
_SHOWN = 5


def incomplete(directory: Path, manifest: Manifest, entries: Iterable[int] | None = None) -> list[str]:
    """What of ``manifest`` is not in ``directory``: missing or non-regular files, files of
    another size, missing empty directories. ``entries``: only these entry indexes (and
    no directories); all by default. Reads no file."""
    table = EntryTable.of(manifest.entries)
    prefix = f"{directory}/"
    problems: list[str] = []
    indexes: Iterable[int] = range(len(table)) if entries is None else entries
    if native.AVAILABLE and isinstance(indexes, range) and indexes.step == 1 and os.path.isdir(directory):
        # the lstat loop in C, without the GIL; only what it finds is looked at again to word it
        indexes = _sized_files(str(directory), table, indexes)
    for index in indexes:
        path = table.paths[index]
        try:
            st = os.lstat(prefix + path)
        except FileNotFoundError:
            problems.append(f"missing file: {path}")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"not a regular file: {path}")
        elif st.st_size != table.sizes[index]:
            problems.append(f"wrong size: {path} ({st.st_size} bytes, expected {table.sizes[index]})")
    if entries is None:
        problems += [f"missing directory: {d}" for d in manifest.directories if not os.path.isdir(prefix + d)]
    return problems


#: Files a thread of the native check takes at least (below, one thread does all).
_PER_THREAD = 8192


def _sized_files(directory: str, table: EntryTable, indexes: range) -> list[int]:
    """The indexes of ``indexes`` that :func:`dsagent.format.native.sized_files` finds wrong,
    on up to a thread a core (the kernel's lookups are the time: 1.1 us a file on one thread)."""
    threads = max(1, min(cores.usable(), len(indexes) // _PER_THREAD))
    if threads == 1:
        return native.sized_files(directory, table.paths, table.sizes, indexes.start, indexes.stop)
    step = -(-len(indexes) // threads)
    cuts = [(start, min(start + step, indexes.stop)) for start in range(indexes.start, indexes.stop, step)]
    with ThreadPoolExecutor(len(cuts), thread_name_prefix="dsagent-check") as pool:
        found = pool.map(lambda cut: native.sized_files(directory, table.paths, table.sizes, *cut), cuts)
        return [index for part in found for index in part]


def check_complete(directory: Path, manifest: Manifest) -> None:
    """Raise :class:`IntegrityError` unless ``directory`` holds every file of ``manifest``
    with its size and every empty directory (docs/design.md#ready-invariant)."""
    if not directory.is_dir():
        raise IntegrityError(f"{manifest.name}@{manifest.digest[:12]}: {directory} is not a directory")
    problems = incomplete(directory, manifest)
    if problems:
        shown = "; ".join(problems[:_SHOWN]) + (
            f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        )
        raise IntegrityError(
            f"{manifest.name}@{manifest.digest[:12]} is not complete on disk, not publishing it: {shown}",
            hint="request the dataset again; the fetch starts over",
        )


def bundle_on_disk(staging: Path, manifest: Manifest, bundle: BundleRef) -> bool:
    """Whether every file of ``bundle`` is in ``staging`` with its manifest size."""
    return not incomplete(staging, manifest, range(bundle.first, bundle.first + bundle.count))


def trusted_bundles(staging: Path, manifest: Manifest, recorded: set[str]) -> set[str]:
    """The recorded bundles a resumed fetch may skip: those whose files are all in staging
    with their sizes (a record never outlives its files: docs/design.md#ready-invariant)."""
    return {b.digest for b in manifest.bundles if b.digest in recorded and bundle_on_disk(staging, manifest, b)}


async def make_ready(
    pools: Pools,
    catalog: Catalog,
    store: Store,
    manifest: Manifest,
    *,
    bundles: bool,
    now: float,
    published: bool = False,
) -> None:
    """Check, publish and commit one version: the one place a version becomes ready.

    ``bundles``: the version was fetched bundle by bundle, so each bundle must be recorded
    as verified. ``published``: its staging directory was renamed into place before a stop
    lost the commit (recovery); then the ready directory is checked and nothing renamed."""
    key = (manifest.name, manifest.digest)
    if bundles:
        done = await pools.db(catalog.bundles_done, *key)
        unverified = [b.digest for b in manifest.bundles if b.digest not in done]
        if unverified:
            raise IntegrityError(
                f"{manifest.name}@{manifest.digest[:12]}: {len(unverified)} of {len(manifest.bundles)} bundles"
                f" were never verified (e.g. {unverified[0]}), not publishing it",
                hint="request the dataset again; the fetch starts over",
            )
    directory = store.ready_dir(*key) if published else store.staging_dir(*key)
    await pools.work(check_complete, directory, manifest)
    if not published:
        await pools.work(store.publish, *key)
    await pools.db(catalog.mark_ready, *key, now=now)


__all__ = ["bundle_on_disk", "check_complete", "incomplete", "make_ready", "trusted_bundles"]
