"""What a CSI publish request is allowed to say, and the per-volume state on disk.

Who calls it: :mod:`dsagent.nodeplugins.csi.driver`. What it owns:

- validation of every field the kubelet sends (volume id, target path, pod info, the
  dataset list in the volume context, storage options from ``nodePublishSecretRef``)
  before anything touches the filesystem; each bad field raises
  :class:`~dsagent.errors.InvalidInput` naming it (the CSI edge answers INVALID_ARGUMENT);
- the publish records, one JSON file per volume, written atomically (temp, fsync,
  rename, fsync of the directory), so a restarted agent knows what it had published;
- the per-volume view directory that is bind-mounted, read-only, at the target path.

On-disk layout (``docs/design.md#csi``)::

    <root>/csi/volumes/<volume_id>.json      publish record (no secrets, no options)
    <root>/csi/views/<volume_id>/            bound read-only at the kubelet's target path
        datasets/<name>/                     mount point: the version the pod's task is bound to,
                                             or this node's share of a striped version
        agent.sock                           mount point of the agent's socket (volumes with a share)
        status.json                          the pod's own task status (rewritten atomically)
        ready | failed                       marks the app containers wait for
    <root>/csi/scratch/                      private mount points for read-only binds
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dsagent.cache.task import DatasetRequest
from dsagent.errors import InvalidInput
from dsagent.format.durable import fsync_dir, write_atomic
from dsplatform import boundedjson
from dsplatform.errors import InvalidInput as PlatformInvalidInput
from dsplatform.names import is_dns_label, is_dns_subdomain, is_pod_uid
from dsplatform.wire import csivolume

#: Pod info keys the kubelet puts in the volume context (``podInfoOnMount: true``).
POD_UID = "csi.storage.k8s.io/pod.uid"
POD_NAME = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
SERVICE_ACCOUNT = "csi.storage.k8s.io/serviceAccount.name"
#: beside ours (:data:`dsplatform.wire.csivolume.ATTRIBUTES`: the datasets and the contract's version)
KNOWN_CONTEXT = {POD_UID, POD_NAME, POD_NAMESPACE, EPHEMERAL, SERVICE_ACCOUNT, *csivolume.ATTRIBUTES}
#: one Secret key's storage options: a handful of credentials and endpoints
SECRET_OPTIONS_MAX_BYTES = 64 * 1024

# Checked with fullmatch: ``$`` alone lets a trailing newline through.
_VOLUME_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str


@dataclass(frozen=True)
class VolumeRecord:
    """One published volume; what survives a restart (never secrets or storage options)."""

    volume_id: str
    target_path: str
    pod_uid: str
    pod_namespace: str
    pod_name: str
    datasets: tuple[dict[str, Any], ...]  # {name, source, bundles?, secretKey?, stripe?}

    def requests(self, secrets: Mapping[str, str] | None = None) -> list[DatasetRequest]:
        """The pod's task: every dataset but the striped ones, whose shares the volume shows."""
        return [
            DatasetRequest(d["name"], d["source"], d.get("bundles"), storage_options(d, secrets), allow_per_file=True)
            for d in self.datasets
            if not d.get("stripe")
        ]

    def stripes(self) -> list[tuple[str, str]]:
        """``(name, digest)`` of each striped version whose share on this node the volume shows."""
        return [(d["name"], d["stripe"]) for d in self.datasets if d.get("stripe")]

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> VolumeRecord:
        data = json.loads(raw)
        return cls(
            data["volume_id"],
            data["target_path"],
            data["pod_uid"],
            data["pod_namespace"],
            data["pod_name"],
            tuple(data["datasets"]),
        )


def validate_volume_id(volume_id: str) -> str:
    if not isinstance(volume_id, str) or not _VOLUME_ID.fullmatch(volume_id):
        raise InvalidInput(f"invalid volume_id {volume_id[:80]!r}", hint="1-128 letters, digits, '.', '_' or '-'")
    return volume_id


def pod_info(context: Mapping[str, str]) -> PodInfo:
    """The pod from the volume context; only ephemeral inline volumes are served."""
    if context.get(EPHEMERAL) != "true":
        raise InvalidInput(
            f"volume context lacks {EPHEMERAL}=true: this driver serves ephemeral inline volumes only",
            hint="use an inline csi volume in the pod spec (the CSIDriver lists only Ephemeral)",
        )
    uid, namespace, name = context.get(POD_UID, ""), context.get(POD_NAMESPACE, ""), context.get(POD_NAME, "")
    if not is_pod_uid(uid):
        raise InvalidInput(
            f"volume context {POD_UID} is not a pod UID: {uid[:80]!r}", hint="the CSIDriver needs podInfoOnMount: true"
        )
    if not is_dns_label(namespace):
        raise InvalidInput(f"volume context {POD_NAMESPACE} is not a namespace name: {namespace[:80]!r}")
    if not is_dns_subdomain(name):
        raise InvalidInput(f"volume context {POD_NAME} is not a pod name: {name[:80]!r}")
    unknown = sorted(set(context) - KNOWN_CONTEXT)
    if unknown:
        raise InvalidInput(
            f"unknown volume attributes {[k[:60] for k in unknown[:5]]}", hint=f"known: {sorted(csivolume.ATTRIBUTES)}"
        )
    return PodInfo(uid, namespace, name)


def datasets_from_context(context: Mapping[str, str]) -> tuple[dict[str, Any], ...]:
    """The datasets of the volume attributes (the contract: :mod:`dsplatform.wire.csivolume`), as
    the publish record keeps them: ``{name, source, bundles?, secretKey?, stripe?}``."""
    try:
        found = csivolume.decode(context)
    except PlatformInvalidInput as exc:  # into the agent's tree: the CSI edge answers INVALID_ARGUMENT
        raise InvalidInput(exc.message, hint=exc.hint) from None
    fields = (
        ("name", "name"),
        ("source", "source"),
        ("bundles", "bundles"),
        ("secretKey", "secret_key"),
        ("stripe", "stripe"),
    )
    return tuple({key: getattr(d, attr) for key, attr in fields if getattr(d, attr)} for d in found)


def storage_options(dataset: Mapping[str, Any], secrets: Mapping[str, str] | None) -> dict[str, Any] | None:
    """A dataset's fsspec options from the Secret the kubelet read (``nodePublishSecretRef``).
    Values are credentials: never echoed in errors."""
    key = dataset.get("secretKey")
    if not key:
        return None
    if not secrets or key not in secrets:
        raise InvalidInput(
            f"dataset {dataset['name']!r} needs key {key!r} of the volume's nodePublishSecretRef, "
            "which the kubelet did not pass",
            hint="check the Secret named in the pod's csi volume and its keys",
        )
    try:
        value = boundedjson.loads(secrets[key], what=f"secret key {key!r}", max_bytes=SECRET_OPTIONS_MAX_BYTES)
    except boundedjson.JsonRefused as exc:
        reason = "is not valid JSON" if "not JSON" in exc.message else exc.message.removeprefix(f"secret key {key!r} ")
        raise InvalidInput(f"secret key {key!r} {reason} (value not shown: it may hold credentials)") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"secret key {key!r} must hold a JSON object of storage options")
    return value


def check_target(target: str, pods_dir: Path, pod_uid: str | None) -> Path:
    """The kubelet's target path, checked: ``<pods_dir>/<uid>/volumes/kubernetes.io~csi/<volume>/mount``,
    normalised, for the pod of the volume context, with no symlink between the pods dir
    and the target. Returns it through the pods dir's real path."""
    if not isinstance(target, str) or not target or "\x00" in target or len(target) > 4096:
        raise InvalidInput("target_path is empty or not a path")
    if not os.path.isabs(target) or os.path.normpath(target) != target:
        raise InvalidInput(f"target_path {target[:200]!r} is not an absolute, normalised path")
    try:
        parts = Path(target).relative_to(pods_dir).parts
    except ValueError:
        raise InvalidInput(
            f"target_path {target[:200]!r} is not under the kubelet pods dir {str(pods_dir)!r}"
        ) from None
    if (
        len(parts) != 5
        or parts[1:3] != ("volumes", "kubernetes.io~csi")
        or parts[4] != "mount"
        or not is_pod_uid(parts[0])
        or not is_dns_subdomain(parts[3])
    ):
        raise InvalidInput(
            f"target_path {target[:200]!r} is not a kubelet csi volume path",
            hint=f"expected {pods_dir}/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount",
        )
    if pod_uid is not None and parts[0] != pod_uid:
        raise InvalidInput(f"target_path belongs to pod {parts[0]}, the volume context to pod {pod_uid}")
    real_pods = Path(os.path.realpath(pods_dir))
    expected_parent = real_pods.joinpath(*parts[:4])
    if Path(os.path.realpath(Path(target).parent)) != expected_parent:
        raise InvalidInput(f"target_path {target[:200]!r} passes through a symlink")
    resolved = expected_parent / "mount"
    if resolved.is_symlink() or (resolved.exists() and not resolved.is_dir()):
        raise InvalidInput(f"target_path {target[:200]!r} exists and is not a directory")
    return resolved


class Volumes:
    """The CSI part of the agent root: publish records, views, scratch mount points."""

    def __init__(self, root: Path) -> None:
        self.base = Path(root) / "csi"
        self.records = self.base / "volumes"
        self.views = self.base / "views"
        self.scratch = self.base / "scratch"
        for path in (self.records, self.views, self.scratch):
            path.mkdir(parents=True, exist_ok=True)

    def record_path(self, volume_id: str) -> Path:
        return self.records / f"{validate_volume_id(volume_id)}.json"

    def view(self, volume_id: str) -> Path:
        return self.views / validate_volume_id(volume_id)

    def save(self, record: VolumeRecord) -> None:
        write_atomic(self.record_path(record.volume_id), record.to_json(), 0o600)

    def load(self, volume_id: str) -> VolumeRecord | None:
        try:
            return VolumeRecord.from_json(self.record_path(volume_id).read_bytes())
        except FileNotFoundError:
            return None

    def all(self) -> list[VolumeRecord]:
        """Every record; unreadable ones (a torn write cannot happen, a hand edit can) are skipped."""
        records = []
        for path in sorted(self.records.glob("*.json")):
            try:
                records.append(VolumeRecord.from_json(path.read_bytes()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return records

    def delete(self, volume_id: str) -> None:
        path = self.record_path(volume_id)
        if path.exists():
            path.unlink()
            fsync_dir(path.parent)


__all__ = [
    "PodInfo",
    "VolumeRecord",
    "Volumes",
    "check_target",
    "datasets_from_context",
    "pod_info",
    "storage_options",
    "validate_volume_id",
    "write_atomic",
]
