"""Packing by the Dataset controller (``spec.pack.auto: true``, the design's rule 7): a
Kubernetes Job per new source listing, and ``status.pack`` from the Job's outcome.

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile`, for each
Dataset with ``spec.pack.auto`` and both ``spec.source`` and ``spec.bundles``. The source is
listed (names, sizes and ETags or mtimes, no data read: :func:`listing_fingerprint`) and the
fingerprint compared with ``status.pack.fingerprint``; on creation or a change a Job runs
``dsctl pack SOURCE --name NAME --to BUNDLES --publish NAMESPACE``, named after the
fingerprint (:func:`job_name`) so a new leader never starts a second Job for the same
listing. A failed listing is not retried until the source changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from dsagent.controller.agents import JSON, raw
from dsagent.controller.jobpod import job_pod
from dsplatform.kubetime import format_micro_time

log = logging.getLogger("dsagent.controller")

#: (source URL, storage options) -> the source listing's fingerprint
Fingerprint = Callable[[str, "Mapping[str, Any] | None"], str]


def listing_fingerprint(url: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """A cheap fingerprint of a source: every file's path, size and ETag (or mtime), hashed.

    A listing reads no data; an object store answers it in a few requests per thousand
    objects. Any change to a file's size, ETag or mtime, or a file added or removed, changes it."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    found = fs.find(path, detail=True)
    digest = hashlib.sha256()
    for name in sorted(found):
        info = found[name]
        if info.get("type") == "directory":
            continue
        stamp = (
            info.get("ETag")
            or info.get("etag")
            or info.get("md5Hash")
            or info.get("mtime")
            or info.get("LastModified")
            or info.get("last_modified")
            or info.get("created")
        )
        digest.update(json.dumps([str(name)[len(str(path)) :], info.get("size"), str(stamp)]).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:32]


def job_name(namespace: str, dataset: str, fingerprint: str) -> str:
    """The pack Job of a Dataset's source listing: one per namespace, Dataset and listing, so
    two namespaces with one Dataset name and source never share a Job (docs/tenancy.md); a
    short hash of ``namespace/name`` tells apart what the cut names would not."""
    tag = hashlib.sha256(f"{namespace}/{dataset}".encode()).hexdigest()[:6]
    readable = f"{dataset[:18].rstrip('.-')}-{namespace[:14].rstrip('-')}".lower()
    return f"{readable}-{tag}-pack-{fingerprint[:12]}"


class PackJobs:
    """Creates the pack Jobs and reads their outcome, through ``batch`` (a ``BatchV1Api``);
    ``created`` counts each Job created (a metric's ``inc``)."""

    def __init__(
        self,
        batch: Any,
        *,
        namespace: str,
        image: str,
        service_account: str | None,
        clock: Callable[[], float],
        fingerprint: Fingerprint = listing_fingerprint,
        created: Callable[[], Any] = lambda: None,
    ) -> None:
        self.batch, self.namespace, self.image, self.service_account = batch, namespace, image, service_account
        self.clock, self.fingerprint, self.created = clock, fingerprint, created

    def status(self, namespace: str, name: str, spec: JSON, pack: JSON, previous: JSON) -> JSON:
        """The Dataset's ``status.pack``: a Job started for a new listing, or the running one's state."""
        from kubernetes.client.exceptions import ApiException

        try:
            fingerprint = self.fingerprint(spec["source"], None)
        except Exception as exc:  # an unreadable source: say so, try again next resync
            return {**previous, "state": "SourceUnreadable", "message": f"{type(exc).__name__}: {exc}"[:500]}
        if fingerprint == previous.get("fingerprint") and previous.get("state") in ("Succeeded", "Failed"):
            return previous  # packed (or failed) for this very listing: nothing new to do
        job = job_name(namespace, name, fingerprint)
        try:
            found = raw(self.batch.read_namespaced_job, job, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.batch.create_namespaced_job(self.namespace, self.job(job, namespace, name, spec, pack, fingerprint))
            self.created()
            log.info(
                "Dataset %s/%s: source listing %s is new; packing in Job %s", namespace, name, fingerprint[:12], job
            )
            return {
                "fingerprint": fingerprint,
                "job": job,
                "state": "Running",
                "startTime": format_micro_time(self.clock()),
            }
        conditions = {
            c.get("type"): c for c in (found.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
        }
        state = "Succeeded" if "Complete" in conditions else "Failed" if "Failed" in conditions else "Running"
        out = {
            "fingerprint": fingerprint,
            "job": job,
            "state": state,
            "startTime": previous.get("startTime") or format_micro_time(self.clock()),
        }
        if state == "Failed":
            out["message"] = str(
                conditions["Failed"].get("message") or conditions["Failed"].get("reason") or "the pack Job failed"
            )[:500]
        return out

    def job(self, job: str, namespace: str, name: str, spec: JSON, pack: JSON, fingerprint: str) -> JSON:
        """The pack Job for one Dataset's listing."""
        # Every field is hostile input: values go after their flag (click never reads them as
        # flags) and the source after "--", so "--publish=other-namespace" is only a path.
        args = ["pack", "--name", name, "--to", spec["bundles"], "--publish", namespace]
        for key, flag in (("maxFiles", "--max-files"), ("maxBytes", "--max-bytes"), ("level", "--level")):
            if isinstance(pack.get(key), int) and not isinstance(pack.get(key), bool):
                args += [flag, str(pack[key])]
        args += ["--", spec["source"]]
        pod = job_pod("pack", self.image, args, self.service_account)
        labels = {
            "app.kubernetes.io/part-of": "dsplatform",
            "app.kubernetes.io/component": "pack",
            "dsagent.io/dataset": name[:63],
            "dsagent.io/dataset-namespace": namespace[:63],
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {"dsagent.io/source-fingerprint": fingerprint},
            },
            "spec": {
                "backoffLimit": 2,
                "ttlSecondsAfterFinished": 7 * 86400,
                "template": {"metadata": {"labels": labels}, "spec": pod},
            },
        }


__all__ = ["Fingerprint", "PackJobs", "job_name", "listing_fingerprint"]
