"""What a node's stripe shares keep on disk, and holding them again after a restart
(docs/design-striping.md#agent: leases, restarts, superseded versions).

Who calls it: :class:`dsagent.cache.striped.stripes.StripeShares` mixes in
:class:`ShareRecords` and uses its paths. What it owns, under ``<root>/stripes/<name>/<digest>/``:

- ``hold.json`` (:data:`HOLD_FILE`): what a restarted agent needs to hold the share again:
  store, members, peers, the Datasets it is held for, its lease, its expiry and its last
  use; never storage options, which may hold credentials;
- ``manifest``: the version's manifest, written once, so that a restarted agent holds a
  version the store has moved on from for the job still reading it;
- ``share/stripe-layout.jsonl`` and the done markers under ``share/``: which bundles the
  share holds (a marker means verified files);
- :meth:`ShareRecords.recover`: the shares held again at start, a lapsed one only when
  its record says it was used within its lease.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dsagent.cache.layout import Key
from dsagent.cache.pools import Pools
from dsagent.cache.settings import Settings
from dsagent.cache.striped.sharefill import Share
from dsagent.errors import DsagentError
from dsagent.format import durable
from dsagent.format.manifest import MANIFEST_FILE, Manifest, read_manifest_stream
from dsagent.format.storageconfig import user_options
from dsplatform.boundedjson import count
from dsplatform.data import DONE_DIR
from dsplatform.stripe import LAYOUT_FILE

log = logging.getLogger("dsagent.stripes")

HOLD_FILE = "hold.json"


class ShareRecords:
    """The shares' records on disk (mixed into :class:`~dsagent.cache.striped.stripes.StripeShares`,
    whose attributes and :meth:`hold` it uses)."""

    settings: Settings
    pools: Pools
    clock: Callable[[], float]
    root: Path
    _shares: dict[Key, Share]
    reading: frozenset[tuple[str, str]] | None  # StripeShares.read_by's: None until the pods are reported
    hold: Callable[..., Awaitable[dict[str, Any]]]  # StripeShares.hold: take part in a group

    async def _keep(self, share: Share) -> None:
        raise NotImplementedError

    def version_dir(self, key: Key) -> Path:
        return self.root / key[0] / key[1]

    def share_dir(self, key: Key) -> Path:
        return self.version_dir(key) / "share"

    def window_dir(self, key: Key) -> Path:
        """Where the bundles this node's readers take through the window land, one folder each."""
        return self.version_dir(key) / "window"

    def _done_markers(self, key: Key) -> set[str]:
        """The bundles this node already holds of version ``key`` (their markers)."""
        try:
            return {marker.name for marker in (self.share_dir(key) / DONE_DIR).iterdir()}
        except FileNotFoundError:
            return set()

    def _kept_manifest(self, directory: Path, digest: str) -> Manifest | None:
        """The manifest kept beside a share (:meth:`_prepare`), when it is there, whole and of
        ``digest``; else None (the store's is read)."""
        try:
            with open(directory / MANIFEST_FILE, "rb") as stream:
                manifest = read_manifest_stream(stream, max_files=self.settings.max_dataset_files)
        except (OSError, DsagentError) as exc:
            if not isinstance(exc, FileNotFoundError):
                log.warning("the manifest kept for %s: %s; reading the store's", directory, exc)
            return None
        return manifest if manifest.digest == digest else None

    def _remember(self, share: Share) -> None:
        """What a restarted agent needs to hold the share again (:meth:`recover`): never the
        storage options, which may hold credentials; a share that needed them waits for its
        holder (the controller's renewed task) to ask again."""
        path = self.version_dir(share.key) / HOLD_FILE
        if user_options(share.storage_options):
            path.unlink(missing_ok=True)
            return
        record = {"store": share.store, "members": list(share.layout.members), "peers": share.peers,
                  "noShare": sorted(share.no_share), "readyAfter": share.ready_after, "whole": share.whole,
                  "storeOnDemand": share.on_demand,
                  # a kept whole copy has no lease (JSON has no infinity)
                  "expiresAt": None if math.isinf(share.expires) else share.expires,
                  "heldFor": sorted(share.holders), "windowBytes": share.window_bytes,
                  "lastUsed": share.last_used, "lease": share.lease}  # fmt: skip
        durable.write_atomic(path, json.dumps(record).encode())

    async def recover(self) -> None:
        """Hold again the shares this node held before a restart (their bundles on disk are
        kept: a marker means a verified bundle), so that peers and readers find them: from the
        manifest kept beside each (a version the store has moved on from is still held for
        the job reading it), else the store's. One whose lease lapsed goes, unless it was used
        within its lease (:meth:`expire`'s rule: its record says when it was last used), or the
        node's pods are reported and not yet known (cluster mode: an agent down for longer
        than a lease holds it again, and :meth:`expire` drops it once the pods are known
        unless they still read it)."""
        found = await self.pools.work(lambda: sorted(self.root.glob(f"*/*/{HOLD_FILE}")))
        for path in found:
            name, digest = path.parent.parent.name, path.parent.name
            try:
                record = json.loads(await self.pools.work(path.read_text))
                kept = record.get("expiresAt", 0) is None  # a whole copy kept with no lease
                left = math.inf if kept else float(record.get("expiresAt", math.inf)) - self.clock()
                lease = _seconds(record.get("lease"), self.settings.stripe_lease)
                used = _seconds(record.get("lastUsed"), -1.0)  # -1: not recorded
                unused = self.clock() - used >= lease and self.reading is not None  # by no pod we know of
                if left <= 0 and unused:  # lapsed while the agent was down, unused
                    log.info("share of %s@%s: its lease lapsed; dropping it", name, digest[:12])
                    await self.pools.work(shutil.rmtree, path.parent, True)
                    continue
                manifest = await self.pools.work(self._kept_manifest, path.parent, digest)
                # the window's bundles of the run before: this run's window does not know them,
                # so nothing would count their disk or ever evict them
                await self.pools.work(shutil.rmtree, self.window_dir((name, digest)), True)
                await self.hold(name, record["store"], record["members"], record["peers"], digest=digest,
                                no_share=record.get("noShare", ()), ready_after=int(record.get("readyAfter", 1)),
                                lease=min(left, lease) if left > 0 else lease, whole=record.get("whole") is True,
                                store_on_demand=record.get("storeOnDemand") is True,
                                holders=[(str(ns), str(ds)) for ns, ds in record.get("heldFor", ())],
                                manifest=manifest,
                                # what its readers took through the window before (the placement
                                # weighs it), and the eviction's LRU order, survive a restart
                                window_bytes=count(record.get("windowBytes")),
                                last_used=used if used >= 0 else None)  # fmt: skip
                share = self._shares.get((name, digest))
                if share is not None and kept and share.whole:
                    await self._keep(share)
                if share is not None and left <= 0:  # lapsed, and used within its lease: expire() decides
                    share.expires = self.clock() + left
                    await self.pools.work(self._remember, share)
            except (DsagentError, OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("share of %s@%s not held again after the restart: %s", name, digest[:12], exc)

    def _prepare(self, share: Share, done: set[str]) -> None:
        """The share's directories and layout file; of the bundles ``done`` (marked held on
        disk), those it owns are held, the others handed over."""
        directory = self.share_dir(share.key)
        (directory / DONE_DIR).mkdir(parents=True, exist_ok=True)
        self.window_dir(share.key).mkdir(exist_ok=True)
        durable.write_atomic(directory / LAYOUT_FILE, b"".join(share.layout.dump()))
        kept = self.version_dir(share.key) / MANIFEST_FILE
        if not kept.exists():  # a restarted agent holds the version again even once the store moved on
            durable.write_atomic(kept, share.manifest.to_bytes())
        share.kept_bytes = kept.stat().st_size  # counted against the cache, as the bundles are
        mine = {b.digest for b in share.owned}
        for digest in done:
            (share.held if digest in mine else share.handover).add(digest)


def _seconds(value: object, default: float) -> float:
    """A number of a hold record (hostile to the extent a damaged file is): ``default`` when it is not one."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return default


def remove_version(directory: Path) -> None:
    """A share's directory, its hold record first (a restart must not hold it again)."""
    (directory / HOLD_FILE).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


__all__ = ["HOLD_FILE", "ShareRecords", "remove_version"]
