"""Bundle store garbage collection: bundles that no manifest in the store references.

Who calls it: ``dsctl gc STORE`` (:mod:`dsagent.cli.gc`); a Dataset controller may call
:func:`collect` on the stores it manages.

What it owns:

- **which bundles are garbage** (:func:`plan_collection`, pure): a bundle is an orphan when
  no manifest under ``<store>/<name>/manifest`` lists its digest; an orphan is deleted only
  when it is older than the grace period, because ``dsctl pack`` writes bundles first and
  the manifest last (docs/design.md#bundles), so a young orphan may belong to a pack still
  running. A bundle whose age cannot be read is never deleted;
- **the I/O around it** (:func:`scan`, :func:`collect`): one listing of ``bundles/``, every
  manifest read whole. A manifest that cannot be read stops the collection (its bundles
  would look orphaned). Deleting is three steps, because a pack *reuses* bundles the store
  already holds and so may come to reference an old orphan at any moment
  (docs/design.md#store-gc): the manifests are read again and the orphans still
  unreferenced are **moved aside** to ``bundles/.gc/``; the manifests are read a third time
  and any bundle moved aside that a manifest now references is **put back**; only then are
  the others removed. A pack that saw the bundle before it was moved and wrote its manifest
  after that third read finds it gone when it checks its reused bundles after its manifest
  (:func:`dsagent.format.bundles.bundle.pack_dataset`) and writes it again. Bundles left in
  ``bundles/.gc/`` by an interrupted collection are put back or removed by the next one.
  Moves and removes are one request per object (a server-side copy on object stores), no
  lock.

Decisions: dry run by default (the CLI lists, ``--delete`` deletes); the default grace is
24 h, far longer than any pack we measured. One collection per store at a time (two could
remove each other's moved-aside bundles before the third read): the controller's Jobs
never overlap (:mod:`dsagent.controller.storegc`).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsagent.errors import IntegrityError, NotFound
from dsagent.format.digester import is_local
from dsagent.format.manifest import BUNDLE_SUFFIX, BUNDLES_DIR, MANIFEST_FILE, bundle_path, read_manifest
from dsagent.format.names import is_digest, validate_name
from dsagent.format.storage import resolve, translate_errors
from dsagent.format.storageconfig import Options

DEFAULT_GRACE_SECONDS = 24 * 3600.0
#: where a collection moves the bundles it is about to delete (under ``bundles/``)
ASIDE_DIR = ".gc"


@dataclass(frozen=True)
class StoredBundle:
    digest: str
    path: str
    size: int
    modified: float | None  # seconds since the epoch; None when the store does not say


@dataclass(frozen=True)
class Plan:
    """What a collection would do: ``delete`` (old orphans), ``young`` (orphans inside the
    grace period or of unknown age, kept), and the count of referenced bundles."""

    delete: tuple[StoredBundle, ...]
    young: tuple[StoredBundle, ...]
    referenced: int
    manifests: int = 0
    deleted: tuple[StoredBundle, ...] = field(default=())
    restored: tuple[str, ...] = field(default=())  # digests put back: a manifest referenced them meanwhile

    @property
    def reclaimable_bytes(self) -> int:
        return sum(b.size for b in self.delete)


def plan_collection(
    bundles: Mapping[str, StoredBundle], referenced: set[str], *, now: float, grace_seconds: float
) -> Plan:
    """Pure: split ``bundles`` into referenced, young orphans and orphans old enough to delete."""
    delete, young = [], []
    for digest in sorted(bundles):
        if digest in referenced:
            continue
        bundle = bundles[digest]
        if bundle.modified is None or now - bundle.modified < grace_seconds:
            young.append(bundle)
        else:
            delete.append(bundle)
    return Plan(tuple(delete), tuple(young), sum(1 for d in bundles if d in referenced))


def _modified(info: Mapping[str, Any]) -> float | None:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, dt.datetime):
            return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
        if isinstance(value, str):
            try:
                parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)).timestamp()
    return None


def _bundle_files(fs: Any, directory: str, what: str) -> dict[str, Mapping[str, Any]]:
    """digest -> listing entry of the bundle files directly in ``directory`` (none when it
    does not exist); temp files and foreign objects are not ours to judge and are skipped."""
    with translate_errors(what):
        if not fs.exists(directory):
            return {}
        listing = fs.ls(directory, detail=True)
    found = {}
    for info in listing:
        base = str(info["name"]).rstrip("/").rpartition("/")[2]
        digest = base[: -len(BUNDLE_SUFFIX)] if base.endswith(BUNDLE_SUFFIX) else ""
        if info.get("type") == "file" and is_digest(digest):
            found[digest] = info
    return found


def _list_bundles(fs: Any, root: str, store: str) -> dict[str, StoredBundle]:
    files = _bundle_files(fs, f"{root.rstrip('/')}/{BUNDLES_DIR}", f"bundles of store {store}")
    return {
        digest: StoredBundle(digest, str(info["name"]), int(info.get("size") or 0), _modified(info))
        for digest, info in files.items()
    }


def _dataset_names(fs: Any, root: str, store: str) -> list[str]:
    with translate_errors(f"manifests of store {store}"):
        paths = fs.glob(f"{root.rstrip('/')}/*/{MANIFEST_FILE}")
    names = []
    for path in paths:
        name = str(path).rstrip("/").split("/")[-2]
        try:
            names.append(validate_name(name))
        except Exception:  # noqa: BLE001 - not a dataset directory this tool wrote
            continue
    return sorted(names)


def referenced_digests(store: str, storage_options: Options = None) -> tuple[set[str], int]:
    """Every bundle digest any manifest in ``store`` lists, and the number of manifests.

    A manifest that cannot be read raises (:class:`IntegrityError` for a damaged one):
    collecting without it would delete the bundles it needs."""
    fs, root = resolve(store, storage_options)
    names = _dataset_names(fs, root, store)
    digests: set[str] = set()
    for name in names:
        try:
            manifest = read_manifest(store, name, storage_options=storage_options)
        except Exception as exc:
            raise IntegrityError(
                f"cannot read the manifest of {name!r} in {store}: {exc}; nothing was deleted",
                hint="repair or remove that manifest (dsctl verify), then run gc again",
            ) from exc
        digests.update(ref.digest for ref in manifest.bundles)
    return digests, len(names)


def scan(
    store: str,
    storage_options: Options = None,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: float | None = None,
) -> Plan:
    """The collection plan for ``store`` (nothing is deleted)."""
    fs, root = resolve(store, storage_options)
    bundles = _list_bundles(fs, root, store)
    referenced, manifests = referenced_digests(store, storage_options)
    if not bundles and not manifests:
        with translate_errors(f"store {store}"):
            missing = not fs.exists(root)
        if missing:  # a mistyped store is not an empty one: "0 orphans" would mislead
            raise NotFound(f"no bundle store at {store}", hint="check the path or URL that dsctl pack --to wrote")
    plan = plan_collection(bundles, referenced, now=time.time() if now is None else now, grace_seconds=grace_seconds)
    return Plan(plan.delete, plan.young, plan.referenced, manifests)


def _aside_path(root: str, digest: str) -> str:
    return f"{root.rstrip('/')}/{BUNDLES_DIR}/{ASIDE_DIR}/{digest}{BUNDLE_SUFFIX}"


def _set_aside(fs: Any, root: str, store: str) -> dict[str, str]:
    """digest -> path of the bundles an earlier collection moved aside and did not finish."""
    directory = f"{root.rstrip('/')}/{BUNDLES_DIR}/{ASIDE_DIR}"
    files = _bundle_files(fs, directory, f"bundles set aside in store {store}")
    return {digest: str(info["name"]) for digest, info in files.items()}


def _put_back(fs: Any, aside: str, path: str) -> None:
    """Return a moved-aside bundle; when a pack has written it again meanwhile, drop the copy."""
    if fs.exists(path):
        fs.rm_file(aside)
    else:
        fs.mv(aside, path)


def _move_aside(fs: Any, root: str, store: str, bundles: list[StoredBundle]) -> dict[str, str]:
    """Move each bundle to ``bundles/.gc/``; digest -> its new path (the ones that moved)."""
    moved: dict[str, str] = {}
    if not bundles:
        return moved
    if is_local(fs):  # object stores have no directories to make
        with translate_errors(f"store {store}"):
            fs.makedirs(f"{root.rstrip('/')}/{BUNDLES_DIR}/{ASIDE_DIR}", exist_ok=True)
    for bundle in bundles:
        aside = _aside_path(root, bundle.digest)
        with translate_errors(f"bundle {bundle.digest} in {store}"):
            if not fs.exists(bundle.path):
                continue  # gone already (another tool): nothing to delete
            fs.mv(bundle.path, aside)
        moved[bundle.digest] = aside
    return moved


def collect(
    store: str,
    storage_options: Options = None,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    delete: bool = False,
    now: float | None = None,
) -> Plan:
    """:func:`scan`, then with ``delete`` remove the old orphans: moved aside when still
    unreferenced after a second read of the manifests, put back when a third read finds a
    manifest referencing them, else removed. ``Plan.deleted`` lists what went,
    ``Plan.restored`` what was put back."""
    plan = scan(store, storage_options, grace_seconds=grace_seconds, now=now)
    if not delete:
        return plan
    fs, root = resolve(store, storage_options)
    leftovers = _set_aside(fs, root, store)
    if not plan.delete and not leftovers:
        return plan
    still_referenced, _ = referenced_digests(store, storage_options)
    moved = _move_aside(fs, root, store, [b for b in plan.delete if b.digest not in still_referenced])
    referenced_now, _ = referenced_digests(store, storage_options)
    restored = []
    for digest, aside in {**leftovers, **moved}.items():
        with translate_errors(f"bundle {digest} in {store}"):
            if digest in referenced_now:
                _put_back(fs, aside, bundle_path(root, digest))
                restored.append(digest)
            else:
                fs.rm_file(aside)
    deleted = tuple(b for b in plan.delete if b.digest in moved and b.digest not in referenced_now)
    return Plan(plan.delete, plan.young, plan.referenced, plan.manifests, deleted, tuple(sorted(restored)))


__all__ = [
    "ASIDE_DIR",
    "DEFAULT_GRACE_SECONDS",
    "Plan",
    "StoredBundle",
    "collect",
    "plan_collection",
    "referenced_digests",
    "scan",
]
