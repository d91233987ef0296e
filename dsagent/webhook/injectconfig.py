"""What the webhook injects and the datasets it injects for: the values mutation works on.

Who calls it: :mod:`dsagent.webhook.mutation` (the hostPath wiring),
:mod:`dsagent.webhook.csiwiring` (the CSI wiring) and
:mod:`dsagent.webhook.server`, which reads :class:`Injection` from the chart's
``injection.json``. Values only: no I/O.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsagent.errors import InvalidInput
from dsagent.kube.datasets import SecretRef


@dataclass(frozen=True)
class Injection:
    """What the webhook injects; from the chart's ``injection.json``."""

    image: str
    image_pull_policy: str = "IfNotPresent"
    scheduler_name: str = ""  # empty: leave schedulerName alone
    cache_dir: str = "/var/lib/dsagent"
    socket_dir: str = "/run/dsagent"
    datasets_mount_path: str = "/datasets"
    socket_mount_path: str = "/run/dsagent"
    run_as_user: int = 65532
    run_as_group: int = 65532
    storage_options_key: str = "storage_options"
    resources: Mapping[str, Any] = field(default_factory=dict)
    volume_mode: str = "hostPath"  # "csi" wires the inline CSI volume (docs/design.md#csi)
    csi_driver: str = "datasets.dsagent.io"

    def __post_init__(self) -> None:
        if self.volume_mode not in ("hostPath", "csi"):
            raise InvalidInput(f"injection: volumeMode must be hostPath or csi, got {self.volume_mode!r}")
        if not self.image:
            raise InvalidInput("injection: image must not be empty")
        for name in ("cache_dir", "socket_dir", "datasets_mount_path", "socket_mount_path"):
            value = getattr(self, name)
            if not isinstance(value, str) or not posixpath.isabs(value):
                raise InvalidInput(f"injection: {name} must be an absolute path, got {value!r}")
        for name in ("run_as_user", "run_as_group"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInput(f"injection: {name} must be a non-root id (>= 1)")

    def security_context(self) -> dict[str, Any]:
        """The injected containers' security context: Pod Security ``restricted``, as the image's user."""
        return {
            "runAsUser": self.run_as_user,
            "runAsGroup": self.run_as_group,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }

    @property
    def socket_path(self) -> str:
        return posixpath.join(self.socket_mount_path, "dsagent.sock")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Injection:
        keys = {
            "image": "image",
            "imagePullPolicy": "image_pull_policy",
            "schedulerName": "scheduler_name",
            "cacheDir": "cache_dir",
            "socketDir": "socket_dir",
            "datasetsMountPath": "datasets_mount_path",
            "socketMountPath": "socket_mount_path",
            "runAsUser": "run_as_user",
            "runAsGroup": "run_as_group",
            "storageOptionsKey": "storage_options_key",
            "resources": "resources",
            "volumeMode": "volume_mode",
            "csiDriver": "csi_driver",
        }
        unknown = sorted(set(raw) - set(keys))
        if unknown:
            raise InvalidInput(f"injection: unknown keys {unknown}", hint=f"known: {sorted(keys)}")
        if "image" not in raw:
            raise InvalidInput("injection: 'image' is required")
        return cls(**{keys[k]: v for k, v in raw.items()})


@dataclass(frozen=True)
class ResolvedDataset:
    """A dataset of the pod with its source known."""

    name: str
    source: str
    bundles: str | None = None
    digest: str | None = None
    secret: SecretRef | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    stripe_digest: str | None = None  # a striped version the pod may start before it is whole

    def request(self, *, with_options: bool) -> dict[str, Any]:
        """The entry of ``DSAGENT_DATASETS``."""
        entry: dict[str, Any] = {"name": self.name, "source": self.source}
        if self.bundles:
            entry["bundles"] = self.bundles
        if self.digest:
            entry["digest"] = self.digest
        if with_options and self.storage_options:
            entry["storage_options"] = dict(self.storage_options)
        return entry


__all__ = ["Injection", "ResolvedDataset"]
