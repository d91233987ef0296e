"""The ``Dataset`` custom resource (``dsagent.io/v1alpha1``): specs, current digests, status.

A Dataset names a dataset once per namespace (source URL, bundle store, a Secret with
storage options, pack settings) so pods can ask for it by name
(``dsagent.io/datasets: imagenet,coco``). ``dsctl pack --publish`` records what it packed
in the status (digest, files, bytes, bundles, packed time); agents, the webhook and the
extender read the current digest from there.

Who calls it: the webhook (resolve names), the cluster agent (resolve names at bind
time), ``dsctl pack --publish`` (:func:`publish`). Blocking calls: async callers run them
in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from dsagent.errors import InvalidInput, NotFound
from dsagent.kube.apiclient import translated
from dsplatform.kubetime import format_time

GROUP = "dsagent.io"
VERSION = "v1alpha1"
PLURAL = "datasets"
KIND = "Dataset"
MERGE_PATCH = "application/merge-patch+json"


class DatasetObject(TypedDict, total=False):
    """A Dataset as the API server returns it."""

    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: dict[str, Any]
    status: dict[str, Any]


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str | None = None


@dataclass(frozen=True)
class DatasetStatus:
    """What was packed last: the dataset's current version."""

    digest: str
    files: int
    bytes: int
    bundles: int = 0
    compressed_bytes: int = 0
    packed_time: str | None = None
    ready_nodes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "digest": self.digest,
            "files": self.files,
            "bytes": self.bytes,
            "bundles": self.bundles,
            "compressedBytes": self.compressed_bytes,
        }
        if self.packed_time is not None:
            body["packedTime"] = self.packed_time
        return body

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DatasetStatus | None:
        digest = raw.get("digest")
        if not isinstance(digest, str):
            return None
        return cls(
            digest=digest,
            files=int(raw.get("files") or 0),
            bytes=int(raw.get("bytes") or 0),
            bundles=int(raw.get("bundles") or 0),
            compressed_bytes=int(raw.get("compressedBytes") or 0),
            packed_time=raw.get("packedTime"),
            ready_nodes=tuple(raw.get("readyNodes") or ()),
        )


@dataclass(frozen=True)
class Dataset:
    """One Dataset resource, read."""

    namespace: str
    name: str
    source: str
    bundles: str | None = None
    storage_secret: SecretRef | None = None
    status: DatasetStatus | None = None
    generation: int | None = None
    stripe: int | str | None = None  # spec.stripe (:func:`parse_stripe`); None: not striped
    start_before_whole: bool = False  # spec.startBeforeWhole (only with stripe)

    @property
    def digest(self) -> str | None:
        return self.status.digest if self.status else None

    def share_read(self, pinned: str | None) -> str | None:
        """The version a pod reads from this node's stripe share, starting before it is
        whole (docs/design-striping.md#start), or None when the pod gets a whole copy: a
        striped Dataset that opts in, with a packed version that the pod does not pin
        otherwise (``pinned``: the digest its annotation names). The webhook wires such a
        dataset to the share and the cluster agent leaves it out of the pod's task."""
        digest = self.digest
        if self.stripe is None or not self.start_before_whole or digest is None or not self.bundles:
            return None
        return digest if pinned in (None, digest) else None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Dataset:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        where = f"Dataset {meta.get('namespace')}/{meta.get('name')}"
        source = spec.get("source")
        if not isinstance(source, str) or not source:
            raise InvalidInput(f"{where} has no spec.source")
        secret = spec.get("storageSecretRef")
        ref = (
            SecretRef(str(secret["name"]), secret.get("key"))
            if isinstance(secret, dict) and secret.get("name")
            else None
        )
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            source=source,
            bundles=spec.get("bundles") or None,
            storage_secret=ref,
            status=DatasetStatus.from_json(obj.get("status") or {}),
            generation=meta.get("generation"),
            stripe=parse_stripe(spec.get("stripe")),
            start_before_whole=spec.get("startBeforeWhole") is True,
        )


def parse_stripe(value: object) -> int | str | None:
    """``spec.stripe``: ``"auto"`` (the size rule, spread over a subnet), ``{"members": N}`` (1..4096), else None
    (off; docs/design-striping.md#group)."""
    if value == "auto":
        return "auto"
    if isinstance(value, dict):
        members = value.get("members")
        if isinstance(members, int) and not isinstance(members, bool) and 1 <= members <= 4096:
            return members
    return None


class DatasetClient:
    """Reads and writes Datasets through an unmodified ``kubernetes`` ApiClient."""

    def __init__(self, api_client: Any, *, request_timeout: float = 10.0) -> None:
        from kubernetes import client

        self._api = client.CustomObjectsApi(api_client)
        self._timeout = request_timeout

    def get(self, namespace: str, name: str) -> Dataset:
        """The Dataset ``namespace/name``; :class:`NotFound` when there is none."""
        with translated(f"Dataset {namespace}/{name}"):
            obj = self._api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self._timeout
            )
        return Dataset.from_object(cast(dict[str, Any], obj))

    def list(self, namespace: str | None = None) -> list[Dataset]:
        """Every Dataset (in ``namespace``, or in all namespaces); malformed ones are skipped."""
        with translated("list Datasets"):
            if namespace is None:
                raw = self._api.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=self._timeout)
            else:
                raw = self._api.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, _request_timeout=self._timeout
                )
        found = []
        for obj in cast(dict[str, Any], raw).get("items", []):
            try:
                found.append(Dataset.from_object(obj))
            except InvalidInput:
                continue
        return found

    def create(self, namespace: str, name: str, *, source: str, bundles: str | None = None) -> Dataset:
        body: DatasetObject = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"source": source, **({"bundles": bundles} if bundles else {})},
        }
        with translated(f"create Dataset {namespace}/{name}"):
            obj = self._api.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, dict(body), _request_timeout=self._timeout
            )
        return Dataset.from_object(cast(dict[str, Any], obj))

    def update_status(
        self, namespace: str, name: str, status: DatasetStatus, *, observed_generation: int | None = None
    ) -> Dataset:
        """Write the status subresource (a merge patch: fields not named stay)."""
        body = status.to_json()
        if observed_generation is not None:
            body["observedGeneration"] = observed_generation
        with translated(f"update status of Dataset {namespace}/{name}"):
            obj = self._api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": body},
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )
        return Dataset.from_object(cast(dict[str, Any], obj))


def status_from_manifest(manifest: Any, *, packed_time: str) -> DatasetStatus:
    """The status recording a packed :class:`dsagent.format.manifest.Manifest`."""
    return DatasetStatus(
        digest=manifest.digest,
        files=manifest.file_count,
        bytes=manifest.total_bytes,
        bundles=len(manifest.bundles),
        compressed_bytes=sum(b.compressed_size for b in manifest.bundles),
        packed_time=packed_time,
    )


def utc_now() -> str:
    return format_time(time.time())


def publish(
    manifest: Any,
    *,
    namespace: str,
    name: str | None = None,
    source: str,
    bundles: str | None,
    api_client: Any = None,
    create: bool = True,
    now: Callable[[], str] = utc_now,
) -> Dataset:
    """Record a packed manifest as the current version of Dataset ``namespace/name``.

    ``dsctl pack --publish`` calls this after packing. The Dataset is created when missing
    (``create``) with the source and bundle store that were packed; an existing Dataset
    keeps its spec (its owner wrote it) and only gets the new status.
    """
    from dsagent.kube import apiclient

    name = name or manifest.name
    client = DatasetClient(api_client if api_client is not None else apiclient.load())
    try:
        current = client.get(namespace, name)
    except NotFound:
        if not create:
            raise
        current = client.create(namespace, name, source=source, bundles=bundles)
    return client.update_status(
        namespace, name, status_from_manifest(manifest, packed_time=now()), observed_generation=current.generation
    )


__all__ = [
    "Dataset",
    "DatasetClient",
    "DatasetObject",
    "DatasetStatus",
    "SecretRef",
    "parse_stripe",
    "publish",
    "status_from_manifest",
]
