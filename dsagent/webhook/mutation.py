"""The webhook's pure policy: a pod that asks for datasets -> the JSONPatch that wires it.

Given the pod (as the API server sends it in the AdmissionReview), its datasets resolved
to sources, and the chart's :class:`Injection` settings, :func:`mutate` returns RFC 6902
operations that

- prepend the container ``dsagent-cache`` running ``dsctl cache --from-env`` with
  ``DSAGENT_DATASETS`` (the JSON list), ``DSAGENT_TASK_ID`` (the pod UID, downward API),
  ``DSAGENT_SOCKET`` and one ``DSAGENT_STORAGE_OPTIONS_<NAME>`` per dataset whose Dataset
  names a storage Secret (a ``secretKeyRef``: credentials never appear in the pod spec);
  then links ``/dsagent-run/datasets/<name>`` to the version the task is bound to
  (:mod:`dsagent.kube.stablelinks`);
- mount the agent's socket directory into it and into every app container;
- mount the node's cached datasets read-only into every app container (``/datasets``,
  where a version is ``/datasets/<name>/<digest>``) and the links read-only at
  ``/dsagent-run``;
- give every app container ``DSAGENT_TASK_ID``, ``DSAGENT_DATASETS`` (without options),
  ``DSAGENT_SOCKET`` and ``DSAGENT_DATASETS_DIR=/dsagent-run/datasets`` (so
  ``$DSAGENT_DATASETS_DIR/imagenet`` is the pod's ImageNet), and make ``dsctl wait
  --from-env`` and ``dsctl status`` work there;
- add the agent's group to the pod's supplementalGroups (the socket is group-writable);
- set the dsplatform scheduler's name when the pod uses the default scheduler.

A **striped** Dataset (``spec.stripe``) with ``spec.startBeforeWhole: true`` and a packed
version is read with the rank-aware reader from the node's share, never as a whole copy
(docs/design-striping.md#start): it is left out of the caching task, and an ordinary
init-container ``dsagent-stripe-wait`` runs ``dsctl stripe wait NAME DIGEST`` for each such
dataset (it prints the share's progress and returns once its first bundles are held); app
containers get the reader's environment (:mod:`dsplatform.wire.readerenv`: the shares, the
node's name) and the node's shares read-only at ``/dsagent-stripes/<name>``. In CSI mode
the volume carries the share instead (:mod:`~dsagent.webhook.csiwiring`): the volume's
ready mark waits for its first bundles.

Two ways to wait (docs/design.md#rule-3: caching overlaps image pulls). The kubelet pulls a
container's image only when it starts that container, and starts app containers only
after every ordinary init-container has finished, so a blocking init-container would
serialise caching and the app image pull. Hence, by default (``overlap``):
``dsagent-cache`` is a native sidecar (an init-container with ``restartPolicy: Always``,
Kubernetes >= 1.29) that caches, then marks ``/dsagent-run/ready`` in a shared
``emptyDir`` and sleeps; the kubelet goes on to pull the app images meanwhile, and each
app container's command is wrapped in a ``/bin/sh`` loop that waits for the mark and
then ``exec``s the original command. The pod's training starts at max(pull, caching)
instead of pull + caching. When an app container has no explicit ``command`` (its image's
ENTRYPOINT is unknown here) or the pod says ``dsagent.io/wait: init``, the
``init`` mode is used instead: an ordinary init-container that returns once the datasets
are ready (the agent has been caching since the pod was bound).

With ``volumeMode: csi`` (the chart's default) the volumes, mounts and init-container
parts come from :mod:`dsagent.webhook.csiwiring` instead: one inline ``csi`` volume served by
the agent's CSI node plugin, no ``hostPath``, no socket, no caching container.

A pod already carrying ``dsagent-cache`` gets no operations (re-invocation is harmless).
Who calls it: :mod:`dsagent.webhook.server`. Pure: no I/O; tests feed it real pod JSON.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dsagent.errors import InvalidInput
from dsagent.kube.datasets import Dataset
from dsagent.kube.podenv import INIT_CONTAINER, STRIPE_WAIT_CONTAINER, options_env_name
from dsagent.webhook import csiwiring
from dsagent.webhook.injectconfig import Injection, ResolvedDataset
from dsagent.webhook.jsonpatch import JSONPatch, append_all, escape, prepend
from dsplatform.wire import readerenv
from dsplatform.wire.podannotations import DatasetRef

SOCKET_VOLUME = "dsagent-socket"
DATASETS_VOLUME = "dsagent-datasets"
RUN_VOLUME = "dsagent-run"
RUN_DIR = "/dsagent-run"
READY_MARK = RUN_DIR + "/ready"
INJECTED_ANNOTATION = "dsagent.io/injected"
WAIT_ANNOTATION = "dsagent.io/wait"
LINK_DIR = RUN_DIR + "/datasets"
# An app container: wait for the mark, then become the original command ($0 "$@").
WAIT_SCRIPT = (
    f'if [ ! -e {READY_MARK} ]; then echo "dsplatform: waiting for datasets" >&2; fi; '
    f'while [ ! -e {READY_MARK} ]; do sleep 0.2; done; exec "$0" "$@"'
)
DEFAULT_SCHEDULERS = (None, "", "default-scheduler")


STRIPES_VOLUME = "dsagent-stripes"
STRIPES_DIR = "/dsagent-stripes"


def resolve(refs: Sequence[DatasetRef], lookup: Callable[[str], Dataset]) -> tuple[ResolvedDataset, ...]:
    """Fill in what the pod left out from its Datasets (``lookup(name)``; raises NotFound)."""
    resolved = []
    for ref in refs:
        if ref.source is not None:
            resolved.append(ResolvedDataset(ref.name, ref.source, ref.bundles, ref.digest, None, ref.storage_options))
            continue
        dataset = lookup(ref.name)
        resolved.append(
            ResolvedDataset(
                name=ref.name,
                source=dataset.source,
                bundles=ref.bundles or dataset.bundles,
                digest=ref.digest,
                secret=dataset.storage_secret,
                storage_options=ref.storage_options,
                stripe_digest=dataset.share_read(ref.digest),
            )
        )
    return tuple(resolved)


def mutate(pod: Mapping[str, Any], datasets: Sequence[ResolvedDataset], injection: Injection) -> JSONPatch:
    """The JSONPatch wiring ``pod`` to its datasets (empty when already wired or none asked).

    One pass, in the patch's order: the first init-container, the pod's volumes, each app
    container (its mounts, its env, its wait wrapper), the pod's group, its scheduler, the
    annotation. The volume mode picks the parts (CSI: :mod:`~dsagent.webhook.csiwiring`;
    hostPath: this module); the wait mode whether app commands are wrapped."""
    spec = pod.get("spec") or {}
    if not datasets or _already_injected(spec):
        return []
    overlap = wait_mode(pod) == "overlap"
    csi = injection.volume_mode == "csi"
    striped = [] if csi else [d for d in datasets if d.stripe_digest is not None]
    whole = [d for d in datasets if d not in striped]
    overlap = overlap and bool(whole)  # nothing to mark ready without a caching container
    if csi:  # the agent caches at NodePublishVolume: an init-container only to wait in init mode
        first = None if overlap else csiwiring.wait_container(injection, csiwiring.WAIT_CONTAINER)
        pod_volumes = [csiwiring.volume(datasets, injection)]
    else:
        first = init_container(whole, injection, sidecar=overlap) if whole else None
        pod_volumes = volumes(injection) + ([stripes_volume(injection)] if striped else [])
    ops: JSONPatch = []
    inits = spec.get("initContainers")
    if first is not None:
        ops += prepend("/spec/initContainers", inits, first)
        inits = [first, *(inits or [])]
    if striped:  # after the caching container and the pod's own: the last step before the app
        ops += append_all("/spec/initContainers", inits, [stripe_wait_container(striped, injection)])
    ops += append_all("/spec/volumes", spec.get("volumes"), pod_volumes)
    for index, container in enumerate(spec.get("containers") or []):
        path = f"/spec/containers/{index}"
        if csi:
            mounts, env = csiwiring.container_wiring(container, datasets)
        else:
            mounts, env = _container_wiring(container, datasets, injection)
            if striped:
                mounts += _stripe_mounts(container, striped)
                defined = {e.get("name") for e in container.get("env") or []}
                env += [e for e in readerenv.env(_shares(striped)) if e["name"] not in defined]
        ops += append_all(f"{path}/volumeMounts", container.get("volumeMounts"), mounts)
        ops += append_all(f"{path}/env", container.get("env"), env)
        if overlap:
            ops += _wait_before(path, container)
    if not csi:  # the agent's socket is group-writable
        ops += _supplemental_group(spec.get("securityContext"), injection.run_as_group)
    if injection.scheduler_name and spec.get("schedulerName") in DEFAULT_SCHEDULERS:
        op = "replace" if "schedulerName" in spec else "add"
        ops.append({"op": op, "path": "/spec/schedulerName", "value": injection.scheduler_name})
    ops += _annotate(pod.get("metadata") or {})
    return ops


def wait_mode(pod: Mapping[str, Any]) -> str:
    """``overlap`` (sidecar + wrapped commands) when possible, else ``init``."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(WAIT_ANNOTATION) == "init":
        return "init"
    containers = (pod.get("spec") or {}).get("containers") or []
    return "overlap" if containers and all(c.get("command") for c in containers) else "init"


def cache_script(injection: Injection, *, sidecar: bool) -> str:
    """Cache (waiting with progress), link ``$DSAGENT_DATASETS_DIR/<name>`` to the bound
    versions; as a sidecar also mark ready and stay up until the pod ends. If caching
    fails the container exits, and the kubelet restarts it with back-off: it retries."""
    script = (
        f"dsctl cache --from-env && python -m dsagent.cli.links {LINK_DIR} {shlex.quote(injection.datasets_mount_path)}"
    )
    return script + (f" && touch {READY_MARK} && exec sleep infinity" if sidecar else "")


def init_container(
    datasets: Sequence[ResolvedDataset], injection: Injection, *, sidecar: bool = False
) -> dict[str, Any]:
    """The ``dsagent-cache`` container: a native sidecar (``sidecar``) or a blocking init-container."""
    names = [options_env_name(d.name) for d in datasets]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise InvalidInput(f"dataset names map to the same variable {clashes}; rename one of them")
    env: list[dict[str, Any]] = [
        {"name": "DSAGENT_DATASETS", "value": _datasets_json(datasets, with_options=True)},
        {"name": "DSAGENT_TASK_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "DSAGENT_SOCKET", "value": injection.socket_path},
    ]
    for dataset in datasets:
        if dataset.secret is not None:
            env.append(
                {
                    "name": options_env_name(dataset.name),
                    "valueFrom": {
                        "secretKeyRef": {
                            "name": dataset.secret.name,
                            "key": dataset.secret.key or injection.storage_options_key,
                        }
                    },
                }
            )
    container: dict[str, Any] = {
        "name": INIT_CONTAINER,
        "image": injection.image,
        "imagePullPolicy": injection.image_pull_policy,
        "command": ["/bin/sh", "-c", cache_script(injection, sidecar=sidecar)],
        "env": env,
        "volumeMounts": [
            {"name": SOCKET_VOLUME, "mountPath": injection.socket_mount_path},
            {"name": RUN_VOLUME, "mountPath": RUN_DIR},
            # read-only, only so the link step sees what it links to
            {
                "name": DATASETS_VOLUME,
                "mountPath": injection.datasets_mount_path,
                "subPath": "datasets",
                "readOnly": True,
            },
        ],
        "securityContext": injection.security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if injection.resources:
        container["resources"] = dict(injection.resources)
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


def stripe_wait_container(striped: Sequence[ResolvedDataset], injection: Injection) -> dict[str, Any]:
    """``dsagent-stripe-wait``: ``dsctl stripe wait NAME DIGEST`` for each striped dataset the
    pod starts before it is whole (progress in its log; exit 0 once enough is local)."""
    script = " && ".join(
        f"dsctl stripe wait {shlex.quote(d.name)} {shlex.quote(d.stripe_digest or '')}" for d in striped
    )
    container: dict[str, Any] = {
        "name": STRIPE_WAIT_CONTAINER,
        "image": injection.image,
        "imagePullPolicy": injection.image_pull_policy,
        "command": ["/bin/sh", "-c", script],
        "env": [{"name": "DSAGENT_SOCKET", "value": injection.socket_path}],
        "volumeMounts": [{"name": SOCKET_VOLUME, "mountPath": injection.socket_mount_path}],
        "securityContext": injection.security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if injection.resources:
        container["resources"] = dict(injection.resources)
    return container


def stripes_volume(injection: Injection) -> dict[str, Any]:
    """The node's stripe shares (``<cacheDir>/stripes``), mounted read-only per dataset."""
    path = injection.cache_dir.rstrip("/") + "/stripes"
    return {"name": STRIPES_VOLUME, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def _stripe_mounts(container: Mapping[str, Any], striped: Sequence[ResolvedDataset]) -> list[dict[str, Any]]:
    taken = {m.get("mountPath") for m in container.get("volumeMounts") or []}
    mounts = [
        {"name": STRIPES_VOLUME, "mountPath": f"{STRIPES_DIR}/{d.name}", "subPath": d.name, "readOnly": True}
        for d in striped
    ]
    return [m for m in mounts if m["mountPath"] not in taken]


def _shares(striped: Sequence[ResolvedDataset]) -> list[readerenv.Share]:
    """Where the reader finds each share (``DSAGENT_STRIPES``)."""
    return [
        readerenv.Share(d.name, d.stripe_digest or "", f"{STRIPES_DIR}/{d.name}/{d.stripe_digest}/share")
        for d in striped
    ]


def volumes(injection: Injection) -> list[dict[str, Any]]:
    return [
        {"name": SOCKET_VOLUME, "hostPath": {"path": injection.socket_dir, "type": "DirectoryOrCreate"}},
        {"name": DATASETS_VOLUME, "hostPath": {"path": injection.cache_dir, "type": "DirectoryOrCreate"}},
        {"name": RUN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]


def _wait_before(path: str, container: Mapping[str, Any]) -> JSONPatch:
    """Wrap the container's command so it starts once the datasets are ready."""
    command = list(container.get("command") or [])
    return [{"op": "replace", "path": f"{path}/command", "value": ["/bin/sh", "-c", WAIT_SCRIPT, *command]}]


def _container_wiring(
    container: Mapping[str, Any], datasets: Sequence[ResolvedDataset], injection: Injection
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """hostPath mode: the mounts and env an app container lacks (what the user set wins)."""
    taken = {m.get("mountPath") for m in container.get("volumeMounts") or []}
    mounts = [
        m
        for m in (
            # subPath: only the ready datasets, never the catalog or staging directories
            {
                "name": DATASETS_VOLUME,
                "mountPath": injection.datasets_mount_path,
                "subPath": "datasets",
                "readOnly": True,
            },
            {"name": SOCKET_VOLUME, "mountPath": injection.socket_mount_path},
            {"name": RUN_VOLUME, "mountPath": RUN_DIR, "readOnly": True},  # the links and the ready mark
        )
        if m["mountPath"] not in taken
    ]
    defined = {e.get("name") for e in container.get("env") or []}
    env = [
        e
        for e in (
            {"name": "DSAGENT_TASK_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "DSAGENT_DATASETS", "value": _datasets_json(datasets, with_options=False)},
            {"name": "DSAGENT_SOCKET", "value": injection.socket_path},
            {"name": "DSAGENT_DATASETS_DIR", "value": LINK_DIR},
        )
        if e["name"] not in defined
    ]
    return mounts, env


def _supplemental_group(security: Mapping[str, Any] | None, gid: int) -> JSONPatch:
    if security is None:
        return [{"op": "add", "path": "/spec/securityContext", "value": {"supplementalGroups": [gid]}}]
    groups = security.get("supplementalGroups")
    if groups is None:
        return [{"op": "add", "path": "/spec/securityContext/supplementalGroups", "value": [gid]}]
    return [] if gid in groups else [{"op": "add", "path": "/spec/securityContext/supplementalGroups/-", "value": gid}]


def _annotate(meta: Mapping[str, Any]) -> JSONPatch:
    if meta.get("annotations") is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": {INJECTED_ANNOTATION: "true"}}]
    return [{"op": "add", "path": "/metadata/annotations/" + escape(INJECTED_ANNOTATION), "value": "true"}]


def _already_injected(spec: Mapping[str, Any]) -> bool:
    return any(
        c.get("name") in (INIT_CONTAINER, STRIPE_WAIT_CONTAINER) for c in spec.get("initContainers") or []
    ) or any(v.get("name") in (SOCKET_VOLUME, DATASETS_VOLUME, RUN_VOLUME) for v in spec.get("volumes") or [])


def _datasets_json(datasets: Sequence[ResolvedDataset], *, with_options: bool) -> str:
    return json.dumps([d.request(with_options=with_options) for d in datasets], separators=(",", ":"))


__all__ = [
    "INIT_CONTAINER",
    "READY_MARK",
    "STRIPE_WAIT_CONTAINER",
    "Injection",
    "JSONPatch",
    "ResolvedDataset",
    "init_container",
    "mutate",
    "options_env_name",
    "resolve",
    "stripe_wait_container",
    "wait_mode",
]
