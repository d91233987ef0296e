"""The webhook's CSI wiring: a pod's datasets as one inline ``csi`` volume, no ``hostPath``.

Who calls it: :func:`dsagent.webhook.mutation.mutate`, which builds the patch in one
pass from these parts when the chart's injection says ``volumeMode: csi`` (the chart's
default). Pure: no I/O. What it decides
(``docs/design.md#csi``):

- one volume ``dsagent-datasets``: ``csi`` with the agent's driver (``datasets.dsagent.io``),
  ``readOnly``, ``volumeAttributes`` by the contract :mod:`dsplatform.wire.csivolume` (the
  JSON list ``[{name, source, bundles?, secretKey?}]`` and its version); a dataset whose
  Dataset names a storage Secret gets ``secretKey`` and the volume ``nodePublishSecretRef``
  (the kubelet reads the Secret in the pod's namespace and passes it to the agent: the
  agent never reads Secrets, the pod spec never holds credentials). One Secret per pod;
  inline storage options in the annotation are refused;
- every app container mounts it read-only at ``/dsagent-run`` with
  ``mountPropagation: HostToContainer`` (so the datasets bound when ready appear inside)
  and gets ``DSAGENT_TASK_ID``, ``DSAGENT_DATASETS``, ``DSAGENT_DATASETS_DIR`` and
  ``DSAGENT_STATUS_FILE``; the agent's socket is not mounted: ``status.json`` in the
  volume is the pod's own task status;
- a striped Dataset the pod starts before it is whole (``spec.stripe`` and
  ``spec.startBeforeWhole``) is carried with its version as ``stripe``: the volume shows
  this node's share (``datasets/<name>``: its files and layout file) and the agent's
  socket (``agent.sock``, the reader asks it for the bundles other members hold), and
  app containers get the reader's environment (:mod:`dsplatform.wire.readerenv`: the
  shares, ``DSAGENT_SOCKET`` and the node's name); the ready mark waits for the share's first bundles;
- waiting, as in :mod:`dsagent.webhook.mutation`: ``overlap`` wraps each app command to wait
  for ``/dsagent-run/ready`` (the kubelet pulls app images while the agent caches: it
  caches from ``NodePublishVolume``, before any container starts); ``init`` adds a
  blocking init-container ``dsagent-wait`` that only waits for the mark.

Every injected container satisfies Pod Security ``restricted`` (non-root, no privilege
escalation, all capabilities dropped, RuntimeDefault seccomp), and ``csi`` volumes are
allowed there, so the mutation keeps a restricted pod restricted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dsagent.errors import InvalidInput
from dsagent.webhook.injectconfig import Injection, ResolvedDataset
from dsplatform.wire import csivolume, readerenv

DRIVER = "datasets.dsagent.io"
#: Not ``dsagent-cache``: this one caches nothing; the cluster agent then submits the pod's
#: task at bind from its annotation, as for a pod without an init-container.
WAIT_CONTAINER = "dsagent-wait"
MOUNT_PATH = "/dsagent-run"
STATUS_FILE = MOUNT_PATH + "/status.json"
AGENT_SOCKET = MOUNT_PATH + "/agent.sock"  # in a volume that shows a striped share
INIT_WAIT_SCRIPT = (
    f"while [ ! -e {MOUNT_PATH}/ready ]; do "
    f"if [ -e {MOUNT_PATH}/failed ]; then cat {STATUS_FILE} >&2; exit 1; fi; sleep 0.2; done"
)


def volume(datasets: Sequence[ResolvedDataset], injection: Injection) -> dict[str, Any]:
    """The inline csi volume carrying the pod's dataset list."""
    secrets = sorted({d.secret.name for d in datasets if d.secret is not None})
    if len(secrets) > 1:
        raise InvalidInput(
            f"the datasets of one pod name {len(secrets)} storage Secrets {secrets}; CSI mode passes one",
            hint="put every dataset's storage options in one Secret, one key per dataset",
        )
    entries = []
    for dataset in datasets:
        if dataset.storage_options:
            raise InvalidInput(
                f"dataset {dataset.name!r} has inline storage options, which CSI mode does not put in a pod spec",
                hint="name a storage Secret in its Dataset instead",
            )
        secret_key = (dataset.secret.key or injection.storage_options_key) if dataset.secret is not None else None
        entries.append(
            csivolume.VolumeDataset(
                dataset.name, dataset.source, dataset.bundles or None, secret_key, stripe=dataset.stripe_digest
            )
        )
    csi: dict[str, Any] = {
        "driver": injection.csi_driver,
        "readOnly": True,
        "volumeAttributes": csivolume.encode(entries),
    }
    if secrets:
        csi["nodePublishSecretRef"] = {"name": secrets[0]}
    return {"name": "dsagent-datasets", "csi": csi}


def mount() -> dict[str, Any]:
    return {
        "name": "dsagent-datasets",
        "mountPath": MOUNT_PATH,
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }


def app_env(datasets: Sequence[ResolvedDataset]) -> list[dict[str, Any]]:
    listed = json.dumps([d.request(with_options=False) for d in datasets], separators=(",", ":"))
    env: list[dict[str, Any]] = [
        {"name": "DSAGENT_TASK_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "DSAGENT_DATASETS", "value": listed},
        {"name": "DSAGENT_DATASETS_DIR", "value": MOUNT_PATH + "/datasets"},
        {"name": "DSAGENT_STATUS_FILE", "value": STATUS_FILE},
    ]
    striped = [d for d in datasets if d.stripe_digest is not None]
    if striped:  # the reader's share directories, and the socket it asks for the rest on
        shares = [readerenv.Share(d.name, d.stripe_digest or "", f"{MOUNT_PATH}/datasets/{d.name}") for d in striped]
        env += readerenv.env(shares, AGENT_SOCKET)
    return env


def wait_container(injection: Injection, name: str) -> dict[str, Any]:
    """``init`` mode: a blocking init-container that returns once the datasets are bound."""
    container: dict[str, Any] = {
        "name": name,
        "image": injection.image,
        "imagePullPolicy": injection.image_pull_policy,
        "command": ["/bin/sh", "-c", INIT_WAIT_SCRIPT],
        "volumeMounts": [mount()],
        "securityContext": injection.security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if injection.resources:
        container["resources"] = dict(injection.resources)
    return container


def container_wiring(
    container: Mapping[str, Any], datasets: Sequence[ResolvedDataset]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The mount and the env an app container gets in CSI mode (env it sets itself wins)."""
    taken = {m.get("mountPath") for m in container.get("volumeMounts") or []}
    if MOUNT_PATH in taken:
        raise InvalidInput(f"container {container.get('name')!r} already mounts something at {MOUNT_PATH}")
    defined = {e.get("name") for e in container.get("env") or []}
    return [mount()], [e for e in app_env(datasets) if e["name"] not in defined]


__all__ = [
    "AGENT_SOCKET",
    "DRIVER",
    "WAIT_CONTAINER",
    "MOUNT_PATH",
    "STATUS_FILE",
    "app_env",
    "container_wiring",
    "mount",
    "volume",
    "wait_container",
]
