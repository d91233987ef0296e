"""Recovery after any stop, clean or kill -9: catalog and disk agree again, and the work
that was interrupted is found.

Who calls it: :meth:`dsagent.cache.service.CacheService.start`, before it serves anything:
first :func:`open_catalog` (a damaged catalog is kept aside and rebuilt from the cache
directory, docs/design.md#catalog-rebuild), then :func:`reconcile`. A
version is ready only after its directory was renamed into place, so the disk is the
truth about data and the catalog the truth about intent:

- a ready directory the catalog knows as fetching: the rename happened, the commit was
  lost; it is marked ready through the one ready check (:func:`dsagent.cache.ready.make_ready`,
  docs/design.md#ready-invariant), or removed when it fails it. One it does not know at
  all is an orphan and is removed.
- a staging directory no unfinished version owns is removed; one that is owned is kept,
  so a resumed fetch skips the bundles verified before the stop.
- a version the catalog calls ready whose directory is gone is forgotten;
- "bundle done" records of a version with no staging directory (or no unfinished row)
  are dropped: a record never outlives its files.

:func:`interrupted` lists what live tasks still wait for. Requests that carried storage
options are left out: those options (credentials) are never stored, so such a fetch
resumes when the task's init-container repeats its request.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

from dsagent.cache import ready
from dsagent.cache.catalog import Catalog, CatalogDamaged, VersionRow
from dsagent.cache.layout import Store
from dsagent.cache.metrics import Metrics
from dsagent.cache.pools import Pools
from dsagent.cache.task import DatasetRequest
from dsagent.errors import DsagentError, IntegrityError
from dsagent.format.bundles.extract import verify_tree
from dsagent.format.manifest import Manifest

log = logging.getLogger("dsagent")


async def open_catalog(pools: Pools, store: Store, metrics: Metrics, *, workers: int, now: float) -> Catalog:
    """The catalog; a damaged one is kept aside and rebuilt (docs/design.md#catalog-rebuild).

    The damaged file (and its ``-wal`` / ``-shm``) is renamed to ``catalog.db.damaged-<time>``
    beside it, for a person to look at; a new catalog is created and every ready directory
    on disk whose stored manifest it verifies against (every file read and hashed, as
    ``dsctl verify`` does) is recorded ready again; the others are removed. Tasks and
    fetches in progress are not recoverable from the disk: tasks repeat their requests
    (then their fetches start over, :func:`reconcile` removing the staging no row owns)."""
    path = store.catalog_path
    try:
        return await pools.db(Catalog, path)
    except CatalogDamaged as exc:
        damaged = exc
    aside = path.with_name(f"{path.name}.damaged-{int(now)}")
    for suffix in ("", "-wal", "-shm"):
        part = path.with_name(path.name + suffix)
        if await pools.work(part.exists):
            await pools.work(os.rename, part, aside.with_name(aside.name + suffix))
    catalog = await pools.db(Catalog, path)
    kept = discarded = 0
    ready_on_disk, _ = await pools.work(store.on_disk)
    for key in sorted(ready_on_disk):
        data = await pools.work(store.read_manifest_bytes, *key)
        try:
            if data is None:
                raise IntegrityError(f"{key[0]}@{key[1][:12]} has no stored manifest")
            manifest = Manifest.from_bytes(data)
            if manifest.name != key[0] or manifest.digest != key[1]:
                raise IntegrityError(f"the stored manifest of {key[0]}@{key[1][:12]} is another version's")
            await pools.work(functools.partial(verify_tree, store.ready_dir(*key), manifest, workers=workers))
        except DsagentError as exc:
            log.warning("catalog rebuild: discarding %s@%s: %s", *key, exc)
            await pools.work(store.remove, *key)
            discarded += 1
            continue
        await pools.db(catalog.adopt_ready, *key, size_bytes=manifest.total_bytes, files=manifest.file_count, now=now)
        kept += 1
    metrics.catalog_rebuilt(kept, discarded)
    log.warning(
        "the catalog was damaged (%s); kept it as %s and rebuilt it from the cache directory:"
        " %d ready versions verified and kept, %d discarded",
        damaged.message,
        aside,
        kept,
        discarded,
    )
    return catalog


async def reconcile(pools: Pools, catalog: Catalog, store: Store, *, now: Callable[[], float]) -> None:
    """Make catalog and disk agree (see the module docstring)."""
    ready_on_disk, staged_on_disk = await pools.work(store.on_disk)
    known = {(r.name, r.digest): r for r in await pools.db(catalog.versions)}
    for key in ready_on_disk - {k for k, r in known.items() if r.state == "ready"}:
        if key in known:  # renamed into place but the catalog commit was lost
            await _finish_commit(pools, catalog, store, known[key], now=now())
        else:
            log.info("removing orphan dataset directory %s/%s", *key)
            await pools.work(store.remove, *key)
    for key in staged_on_disk - {k for k, r in known.items() if r.state != "ready"}:
        log.info("removing orphan staging directory %s@%s", *key)
        await pools.work(store.discard_staging, *key)
    for key, row in known.items():
        if row.state == "ready" and key not in ready_on_disk:
            log.warning("dataset %s@%s is gone from disk; forgetting it", *key)
            await pools.db(catalog.delete_version, *key)
            await pools.work(store.remove, *key)
    # a "bundle done" record never outlives its files (docs/design.md#ready-invariant)
    for key in await pools.db(catalog.with_bundles_done):
        owner = known.get(key)
        if owner is None or owner.state == "ready" or key not in staged_on_disk:
            await pools.db(catalog.forget_bundles, *key)
    await pools.work(store.empty_trash)
    await pools.work(store.clear_temporary_manifests)
    await pools.work(store.prune_empty_names)


async def _finish_commit(pools: Pools, catalog: Catalog, store: Store, row: VersionRow, *, now: float) -> None:
    """Commit a version published before a stop, through the one ready check; a version
    that fails it (or whose manifest is gone) is removed, to be fetched again."""
    key = (row.name, row.digest)
    data = await pools.work(store.read_manifest_bytes, *key)
    try:
        if data is None:
            raise IntegrityError(f"{row.name}@{row.digest[:12]} has no stored manifest")
        manifest = Manifest.from_bytes(data)
        await ready.make_ready(
            pools, catalog, store, manifest, bundles=row.bundles is not None, now=now, published=True
        )
    except IntegrityError as exc:
        log.warning("dataset %s@%s was published but fails its check (%s); removing it", *key, exc)
        await pools.db(catalog.delete_version, *key)
        await pools.work(store.remove, *key)


async def interrupted(pools: Pools, catalog: Catalog, *, now: float) -> list[tuple[str, DatasetRequest, str | None]]:
    """``(task, request, bound digest)`` for each dataset a live task still waits for and
    that can be resumed without the requester (no storage options)."""
    todo: list[tuple[str, DatasetRequest, str | None]] = []
    for task in await pools.db(catalog.tasks):
        if task.lease_until <= now:
            continue
        for item in task.request:
            digest = task.digests.get(item["name"])
            row = await pools.db(catalog.version, item["name"], digest) if digest else None
            if (row is None or row.state != "ready") and not item.get("hasStorageOptions"):
                request = DatasetRequest(
                    item["name"], item["source"], item.get("bundles"), allow_per_file=item.get("allowPerFile") is True
                )
                todo.append((task.task_id, request, digest))
    return todo


__all__ = ["interrupted", "open_catalog", "reconcile"]
