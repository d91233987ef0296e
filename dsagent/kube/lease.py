"""``coordination.k8s.io/v1`` Leases: the one reader and writer, for the controller and the webhook.

Two parts of dsagent hold a Lease: the Dataset controller elects its leader with one
(:class:`dsagent.controller.leader.LeaseElector`) and the admission webhook keeps each
job's GPU class in one (:mod:`dsagent.webhook.roceclass`). Both read, create and
replace through :class:`Leases`, raw JSON both ways (the wire format as is, no client
models), with the client's errors translated once (:func:`dsagent.kube.apiclient.translated`):
a missing Lease reads as None; :class:`~dsagent.errors.Conflict` (409) from
:meth:`Leases.create` means another writer created it first and from :meth:`Leases.replace`
that it changed since it was read (the body carries the ``resourceVersion`` read), so in
both cases the caller lost a race and reads the winner's Lease; anything else
(:class:`~dsagent.kube.apiclient.KubeForbidden` for a missing RBAC rule,
:class:`~dsagent.kube.apiclient.KubeUnavailable`, ...) is a real failure for the caller
to report. Times are :mod:`dsplatform.kubetime`'s ``MicroTime``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dsagent.errors import NotFound
from dsagent.kube.apiclient import translated
from dsplatform.kubetime import parse_or_none

API_VERSION, KIND = "coordination.k8s.io/v1", "Lease"

JSON = dict[str, Any]


def new_lease(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> JSON:
    """A Lease body to create (or, with ``metadata.resourceVersion``, to replace)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": dict(metadata), "spec": dict(spec)}


def expiry(spec: Mapping[str, Any], default_duration: int | None = None) -> float | None:
    """When a Lease lapses, in epoch seconds: its ``renewTime`` (else ``acquireTime``) plus
    ``leaseDurationSeconds`` (else ``default_duration``); None when either is unknown."""
    renewed = parse_or_none(spec.get("renewTime") or spec.get("acquireTime"))
    given = spec.get("leaseDurationSeconds")
    duration = given if isinstance(given, int) and not isinstance(given, bool) else default_duration
    if renewed is None or duration is None:
        return None
    return renewed + duration


def next_transitions(previous: Mapping[str, Any] | None) -> int:
    """``leaseTransitions`` for a Lease taken over from ``previous`` (its spec)."""
    given = (previous or {}).get("leaseTransitions")
    return (given if isinstance(given, int) and not isinstance(given, bool) and given >= 0 else 0) + 1


class Leases:
    """Leases through an unmodified ``kubernetes`` ApiClient (``request_timeout`` per call, None: none)."""

    def __init__(self, api_client: Any, *, request_timeout: float | None = None) -> None:
        from kubernetes.client import CoordinationV1Api

        self._api: Any = CoordinationV1Api(api_client)
        self._options: dict[str, Any] = {"_preload_content": False}
        if request_timeout is not None:
            self._options["_request_timeout"] = request_timeout

    def read(self, namespace: str, name: str) -> JSON | None:
        """The Lease, or None when there is none."""
        try:
            with translated(f"read Lease {namespace}/{name}"):
                raw = self._api.read_namespaced_lease(name, namespace, **self._options)
        except NotFound:
            return None
        return _object(raw)

    def create(self, namespace: str, body: JSON) -> JSON:
        """The created Lease; :class:`~dsagent.errors.Conflict` when it exists already."""
        with translated(f"create Lease {namespace}/{body['metadata']['name']}"):
            raw = self._api.create_namespaced_lease(namespace, body, **self._options)
        return _object(raw)

    def replace(self, namespace: str, body: JSON) -> JSON:
        """The replaced Lease; :class:`~dsagent.errors.Conflict` when it changed since
        ``body``'s ``metadata.resourceVersion`` was read."""
        name = body["metadata"]["name"]
        with translated(f"replace Lease {namespace}/{name}"):
            raw = self._api.replace_namespaced_lease(name, namespace, body, **self._options)
        return _object(raw)


def _object(raw: Any) -> JSON:
    found: JSON = json.loads(raw.data)
    return found


__all__ = ["API_VERSION", "KIND", "Leases", "expiry", "new_lease", "next_transitions"]
