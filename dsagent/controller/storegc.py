"""Bundle-store garbage collection run by the Dataset controller (docs/design.md#store-gc).

Who calls it: :class:`dsagent.controller.reconcile.DatasetController`, each pass of the
leader, when ``DSAGENT_CONTROLLER_STORE_GC`` sets an interval (the chart's
``controller.storeGC.enabled``; off by default).

What it owns:

- **which stores are collected** (:func:`due`, pure): the bundle stores of Datasets the
  controller packs itself (``spec.pack.auto: true`` with ``spec.bundles``), the same trust
  the pack Jobs already have: a Dataset author can point either at a store the pack
  service account can write. A store is skipped while any of its Datasets' pack Job runs
  (the controller's own packs never race its gc) and while the previous interval's gc Job
  for it still runs (two collections of one store never overlap, see
  :mod:`dsagent.format.bundles.bundlegc` on why that matters);
- **one Kubernetes Job per store and interval** (:func:`gc_job`): ``dsctl gc --delete
  --grace G -- STORE``, named ``store-gc-<store hash>-<interval number>`` so a new leader,
  or the next pass, never starts a second one for the same interval (409 is success). It
  runs as the pack Jobs do (their image, their service account: the one with the store's
  credentials) and is stopped after 90% of the interval (``activeDeadlineSeconds``), so it
  has ended before the next interval's Job may start. Credentials and the deletion itself
  are ``dsctl gc``'s (:mod:`dsagent.format.bundles.bundlegc`): grace period, manifests read again
  before anything is deleted, deletions moved aside first and restored when a manifest
  referenced them meanwhile.

Decision: a Job, not a call in the controller, because the controller has no store
credentials (it never reads Secrets; the pack service account may have IRSA or workload
identity), and because a long listing of a big store must not hold up a reconcile pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dsagent.controller.jobpod import JobPlace

log = logging.getLogger("dsagent.controller")

JSON = dict[str, Any]
COMPONENT = "store-gc"
#: the longest store URL a Dataset may make a gc Job for (the Job's args are hostile input)
MAX_STORE = 2048


def store_key(store: str) -> str:
    return hashlib.sha256(store.encode()).hexdigest()[:16]


def gc_job_name(store: str, interval_number: int) -> str:
    return f"store-gc-{store_key(store)}-{interval_number}"


@dataclass(frozen=True)
class Due:
    store: str
    job: str  # this interval's Job
    previous: str  # the previous interval's Job: must have ended


def due(datasets: Iterable[Mapping[str, Any]], *, now: float, interval_s: float) -> list[Due]:
    """Pure: the stores to collect in the interval holding ``now``, sorted by store."""
    stores: dict[str, bool] = {}  # store -> a pack of it is running
    for ds in datasets:
        spec = ds.get("spec") if isinstance(ds.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        pack = spec.get("pack") if isinstance(spec.get("pack"), dict) else {}
        store = spec.get("bundles")
        if not (isinstance(pack, dict) and pack.get("auto") is True and isinstance(store, str)):
            continue
        if not store or len(store) > MAX_STORE:
            continue
        status = ds.get("status") if isinstance(ds.get("status"), dict) else {}
        assert isinstance(status, dict)
        packing = isinstance(status.get("pack"), dict) and status["pack"].get("state") == "Running"
        stores[store] = stores.get(store, False) or packing
    number = int(now // interval_s)
    return [
        Due(store, gc_job_name(store, number), gc_job_name(store, number - 1))
        for store, packing in sorted(stores.items())
        if not packing
    ]


def gc_job(name: str, store: str, *, place: JobPlace, grace_s: float, interval_s: float) -> JSON:
    """The Job running ``dsctl gc --delete`` on ``store`` (the store after ``--``: never a flag)."""
    labels = {
        "app.kubernetes.io/part-of": "dsplatform",
        "app.kubernetes.io/component": COMPONENT,
        "dsagent.io/store": store_key(store),
    }
    args = ["gc", "--delete", "--grace", f"{int(grace_s)}s", "--", store]
    pod = place.pod("gc", args)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": place.namespace,
            "labels": labels,
            "annotations": {"dsagent.io/store": store},
        },
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": max(60, int(interval_s * 0.9)),
            "ttlSecondsAfterFinished": max(3600, int(interval_s * 2)),
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _active(job: Mapping[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return not any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)


class StoreCollector:
    """Creates the gc Jobs :func:`due` names, through ``batch`` (a ``BatchV1Api``)."""

    def __init__(self, batch: Any, place: JobPlace, *, interval_s: float, grace_s: float) -> None:
        self.batch, self.place, self.interval_s, self.grace_s = batch, place, interval_s, grace_s

    def run(self, datasets: Iterable[Mapping[str, Any]], now: float) -> list[str]:
        """One pass: the names of the Jobs created."""
        from kubernetes.client.exceptions import ApiException

        created = []
        for item in due(datasets, now=now, interval_s=self.interval_s):
            try:
                answer = self.batch.read_namespaced_job(item.previous, self.place.namespace, _preload_content=False)
                previous = json.loads(answer.data)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                previous = None
            if previous is not None and _active(previous):
                log.info(
                    "store gc of %s: the previous Job %s still runs; not starting another", item.store, item.previous
                )
                continue
            job = gc_job(item.job, item.store, place=self.place, grace_s=self.grace_s, interval_s=self.interval_s)
            try:
                self.batch.create_namespaced_job(self.place.namespace, job)
            except ApiException as exc:
                if exc.status != 409:  # 409: this interval's Job exists (an earlier pass or leader)
                    raise
                continue
            log.info("store gc of %s: Job %s", item.store, item.job)
            created.append(item.job)
        return created


__all__ = ["COMPONENT", "Due", "StoreCollector", "due", "gc_job", "gc_job_name", "store_key"]
