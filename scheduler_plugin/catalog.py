"""Current dataset versions from the ``Dataset`` custom resources (``dsagent.io/v1alpha1``).

``dsctl pack --publish`` records each Dataset's current version in its status
(``status.digest``, ``status.bytes``). With the watch cache running, a pod that names a
dataset without pinning a digest is resolved against its namespace's Dataset, so that
"ready and current" (docs/design.md#dataset-affinity) means "holds the current version", not "holds some
version"; the size also lets the filter rule out caches too small for a dataset no node
holds yet. Without a Dataset (or without the CRD) an unpinned name accepts any ready copy.
Pure functions; the node cache keeps the map, the view applies it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsplatform.names import is_digest
from scheduling.podspec import PodRequest

GROUP = "dsagent.io"
VERSION = "v1alpha1"
PLURAL = "datasets"


@dataclass(frozen=True)
class CurrentVersion:
    """A Dataset's published current version."""

    digest: str
    size_bytes: int | None = None


def read_dataset(obj: Any) -> tuple[tuple[str, str] | None, CurrentVersion | None]:
    """A Dataset object -> ((namespace, name), current version or None when unpublished)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None, None
    key = (str(meta.get("namespace") or "default"), meta["name"])
    status = obj.get("status")
    digest = status.get("digest") if isinstance(status, dict) else None
    if not isinstance(digest, str) or not is_digest(digest.lower()):
        return key, None
    size = status.get("bytes") if isinstance(status, dict) else None
    valid_size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    return key, CurrentVersion(digest.lower(), valid_size)


def resolve(pod: PodRequest, current: Mapping[tuple[str, str], CurrentVersion]) -> PodRequest:
    """Pin each unpinned dataset of ``pod`` to its namespace's current version.

    A digest the pod pins itself wins; the size is filled in when the versions agree.
    """
    if not pod.datasets or not current:
        return pod
    wants = []
    for want in pod.datasets:
        version = current.get((pod.namespace, want.name))
        if version is not None and want.digest in (None, version.digest):
            want = dataclasses.replace(want, digest=version.digest, size_bytes=version.size_bytes)
        wants.append(want)
    return dataclasses.replace(pod, datasets=tuple(wants))


__all__ = ["GROUP", "PLURAL", "VERSION", "CurrentVersion", "read_dataset", "resolve"]
