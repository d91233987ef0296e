"""The CSI node plugin: datasets mounted into pods as ephemeral inline ``csi`` volumes.

Who calls it: ``dsagent serve`` (:mod:`dsagent.nodeagent.nodeparts`) when ``DSAGENT_CSI_SOCKET`` is
set: it builds :class:`NodeDriver` on the running :class:`~dsagent.cache.service.CacheService`
and serves it with :func:`serve` on that unix socket (the DaemonSet's kubelet plugin dir,
found by the kubelet through the node-driver-registrar sidecar). Tests drive it with a
real gRPC client over the socket.

What it owns (``docs/design.md#csi``): the CSI v1 Identity service and the Node RPCs of
an ephemeral volume driver (no controller, no staging), and the life of each published
volume:

- ``NodePublishVolume`` validates every field (:mod:`dsagent.nodeplugins.csi.volumes`), records
  the volume atomically, submits the pod's task (task id = pod UID, rule 1: the same
  request as any other for that pod), binds the volume's view directory read-only at the
  target path and returns at once, so the kubelet goes on to pull images while the agent
  caches (rule 3). A watcher then binds each dataset's version, read-only, on
  ``<target>/datasets/<name>`` as soon as it is ready; the bind propagates to the
  container through its ``HostToContainer`` mount. The view also holds ``status.json``
  (the pod's own task only) and the ``ready``/``failed`` marks. While published, the
  watcher renews the task's lease and re-submits a failed task (retry with back-off).
- a striped version the volume names (``stripe``: docs/design-striping.md#csi) is not
  in the task: the watcher binds this node's share of it read-only on
  ``<target>/datasets/<name>`` once its first bundles are held, and the agent's own socket
  on ``<target>/agent.sock``, for the rank-aware reader.
- ``NodeUnpublishVolume`` stops the watcher, removes every mount under and at the target,
  removes the view, releases the pod's task (unless another published volume of the pod
  still holds it) and deletes the record; it is idempotent.
- :meth:`NodeDriver.recover` (at start-up) re-reads the records: a target still present
  gets its mounts back and its watcher; one the kubelet removed meanwhile is cleaned up.

Binds need CAP_SYS_ADMIN: without it publish fails with INTERNAL and the reason (there is
no unprivileged fallback). Errors leave as gRPC codes per the CSI spec: bad fields
INVALID_ARGUMENT, an incompatible re-publish ALREADY_EXISTS, a pod not on this node
PERMISSION_DENIED, an agent not started yet UNAVAILABLE: each error's own ``grpc_status``,
answered by the plugins' one helper (:mod:`dsagent.nodeplugins.grpcstatus`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import wrappers_pb2

from dsagent import __version__
from dsagent.cache.service import CacheService, TaskRecord
from dsagent.cache.settings import Settings
from dsagent.errors import (
    Conflict,
    DsagentError,
    InvalidInput,
    NotFound,
    SettingsError,
    TransientError,
)
from dsagent.format.durable import write_atomic
from dsagent.nodeplugins import grpcstatus
from dsagent.nodeplugins.csi import mounts
from dsagent.nodeplugins.csi.volumes import (
    VolumeRecord,
    Volumes,
    check_target,
    datasets_from_context,
    pod_info,
    validate_volume_id,
)
from dsagent.nodeplugins.proto.csi import csi_pb2, csi_pb2_grpc
from dsplatform.names import is_dns_subdomain

log = logging.getLogger("dsagent.csi")
PROGRESS_SECONDS = 1.0  # how often a watcher refreshes the pod's progress while datasets are pending
RETRY_SECONDS = 10.0  # how long a failed dataset waits before it is started again
AGENT_SOCKET = "agent.sock"  # in a volume that shows a share: the agent's socket, for the reader
CSI_DRIVER_NAME_MAX_LENGTH = 63  # the CSI spec and the CSIDriver object agree on this one


@dataclass
class _Published:
    record: VolumeRecord
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)  # memory only, never stored
    watcher: asyncio.Task[None] | None = None


class NodeDriver:
    """The node side of the driver: publish, unpublish, recover; no gRPC in here."""

    def __init__(self, service: CacheService, settings: Settings, *, clock: Any = time.monotonic) -> None:
        _check_settings(settings)
        self.service = service
        self.settings = settings
        self.pods_dir = Path(settings.csi_kubelet_pods_dir)
        self.volumes = Volumes(settings.root)
        self._published: dict[str, _Published] = {}
        self._lock = asyncio.Lock()
        self._clock = clock

    # -- publish ----------------------------------------------------------------------

    async def publish(
        self,
        volume_id: str,
        target_path: str,
        context: Mapping[str, str],
        secrets: Mapping[str, str],
        *,
        block: bool = False,
    ) -> None:
        validate_volume_id(volume_id)
        if block:
            raise InvalidInput("this driver publishes filesystem volumes only, not block volumes")
        pod = pod_info(context)
        target = check_target(target_path, self.pods_dir, pod.uid)
        datasets = datasets_from_context(context)
        record = VolumeRecord(volume_id, str(target), pod.uid, pod.namespace, pod.name, datasets)
        requests = record.requests(secrets)  # options checked now, so a bad Secret fails the publish
        if record.stripes() and not self.settings.socket.is_socket():
            raise TransientError("the agent's socket is not there yet; the kubelet retries")
        if not self.service.started:
            raise TransientError("the agent is starting; the kubelet retries")
        async with self._lock:
            existing = self.volumes.load(volume_id)
            if existing is not None and (existing.target_path, existing.pod_uid) != (
                record.target_path,
                record.pod_uid,
            ):
                raise Conflict(f"volume {volume_id} is already published at another target path")
            if existing is not None and existing.datasets != record.datasets:
                raise Conflict(f"volume {volume_id} is already published with other datasets")
            if requests:  # a volume of striped shares only has no task: it shows what the node holds
                await self.service.submit_task(pod.uid, requests)
            self.volumes.save(record)  # before the mount: a crash after it is recovered from here
            self._mount_view(record)
            self._track(record, secrets)
        log.info("published volume %s for pod %s/%s at %s", volume_id, pod.namespace, pod.name, target)

    def _mount_view(self, record: VolumeRecord) -> None:
        view = self.volumes.view(record.volume_id)
        for dataset in record.datasets:
            (view / "datasets" / dataset["name"]).mkdir(parents=True, exist_ok=True)
        if record.stripes():
            (view / AGENT_SOCKET).touch()  # the mount point of the agent's socket, for the reader
        if not (view / "status.json").exists():
            _write_status(view, {"task": record.pod_uid, "state": "pending", "datasets": []})
        target = Path(record.target_path)
        target.mkdir(mode=0o750, exist_ok=True)  # the plugin creates the target (CSI v1); the kubelet its parent
        if not mounts.is_mount_point(target):
            self._bind_readonly(view, target, f"{record.volume_id}-view")
        if record.stripes() and not mounts.is_mount_point(target / AGENT_SOCKET):
            # the reader asks the agent for the bundles other members own; the agent tells
            # this pod apart by its socket peer, as on the hostPath socket
            self._bind_readonly(self.settings.socket, target / AGENT_SOCKET, f"{record.volume_id}-sock")

    def _bind_readonly(self, source: Path, target: Path, scratch_name: str) -> None:
        """Bind ``source`` read-only on ``target`` through a private scratch mount: the
        bind that reaches ``target`` (and propagates to the host and the container) is
        read-only from its first moment, since a remount does not propagate. A file (the
        agent's socket) is bound through a scratch file, a directory through a scratch
        directory."""
        scratch = self.volumes.scratch / scratch_name
        if source.is_dir():
            scratch.mkdir(exist_ok=True)
        else:
            scratch.touch()
        mounts.unmount(scratch)
        mounts.bind_readonly(source, scratch)
        try:
            mounts.bind(scratch, target)
        finally:
            mounts.unmount(scratch)
            if scratch.is_dir():
                scratch.rmdir()
            else:
                scratch.unlink()

    def _track(self, record: VolumeRecord, secrets: Mapping[str, str]) -> None:
        current = self._published.get(record.volume_id)
        if current is not None and current.watcher is not None and not current.watcher.done():
            current.secrets = dict(secrets) or current.secrets
            return
        published = _Published(record, dict(secrets))
        published.watcher = asyncio.create_task(self._watch(published), name=f"dsagent-csi-{record.volume_id}")
        self._published[record.volume_id] = published

    async def _watch(self, published: _Published) -> None:
        """Bind each dataset once ready (each share once ready enough) and keep status.json
        current, waking when the service says a dataset settled (or to refresh the progress);
        renew the task's lease and start failed datasets again through the service."""
        record = published.record
        view, target = self.volumes.view(record.volume_id), Path(record.target_path)
        last: dict[str, Any] | None = None
        retry_at: float | None = None
        renew_every = max(self.settings.lease_ttl / 3, PROGRESS_SECONDS)
        renew_at = self._clock() + renew_every
        has_task = any(not d.get("stripe") for d in record.datasets)
        while True:
            try:
                task = await self.service.get_task(record.pod_uid) if has_task else None
                for dataset in task.datasets if task is not None else ():
                    if dataset.state == "ready" and dataset.digest:
                        await asyncio.to_thread(self._bind_dataset, target, dataset.name, dataset.digest)
                shares = [self._share(*key) for key in record.stripes()]  # on the loop: the service's state
                for share in shares:
                    if share["state"] in ("ready", "complete"):
                        await asyncio.to_thread(self._bind_share, target, share["name"], share["digest"])
                status = pod_status(task, shares, record.pod_uid)
                if status != last:
                    await asyncio.to_thread(_write_status, view, status)
                    last = status
                now = self._clock()
                if task is not None and task.state == "failed":
                    if retry_at is None:
                        retry_at = now + RETRY_SECONDS
                    elif now >= retry_at:
                        retry_at = None
                        await self.service.retry_failed(record.pod_uid, record.requests(published.secrets))
                if task is not None and now >= renew_at:
                    renew_at = now + renew_every
                    await self.service.renew_task(record.pod_uid)
                settled = status["state"] == "ready" and all(s["state"] == "complete" for s in shares)
                wake = min(renew_at - now, RETRY_SECONDS if retry_at is not None else renew_every)
                await self.service.task_settled(max(0.0, wake) if settled else min(PROGRESS_SECONDS, wake))
            except asyncio.CancelledError:
                raise
            except NotFound:  # released under us (an operator, the pod watch): say so, keep the mounts
                await asyncio.to_thread(
                    _write_status, view, {"task": record.pod_uid, "state": "released", "datasets": []}
                )
                return
            except DsagentError as exc:
                log.warning("volume %s: %s; retrying", record.volume_id, exc)
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("volume %s: watcher failed; retrying", record.volume_id)
                await asyncio.sleep(1.0)

    def _share(self, name: str, digest: str) -> dict[str, Any]:
        """This node's share of ``name@digest`` as the pod may see it in ``status.json``:
        ``waiting`` until the node holds a share (the controller holds it on the group's
        members), ``filling``, ``ready`` once its first bundles are held (the reader may
        start), ``complete``, or ``failed``."""
        try:
            share = self.service.stripes.status((name, digest))
        except NotFound:
            why = "this node holds no share of it yet (the Dataset's controller holds it on the group's members)"
            return {"name": name, "digest": digest, "state": "waiting", "message": why}
        state = (
            "failed"
            if share["error"]
            else "complete"
            if share["complete"]
            else "ready"
            if share["ready_enough"]
            else "filling"
        )
        return {
            "name": name,
            "digest": digest,
            "state": state,
            "bundles": share["bundles_owned"],
            "bundlesDone": share["bundles_held"],
            "bytes": share["bytes_owned"],
            "bytesDone": share["bytes_held"],
            **({"error": share["error"]} if share["error"] else {}),
        }

    def _bind_share(self, target: Path, name: str, digest: str) -> None:
        """The share read-only on ``datasets/<name>``: its files, its done markers and its
        layout file, which says who holds the rest. Never a whole tree: the reader fetches
        the other bundles through the agent."""
        point = target / "datasets" / name
        if mounts.is_mount_point(point):
            return
        self._bind_readonly(self.service.stripes.share_dir((name, digest)), point, f"{target.parent.name}-{name}")
        log.info("bound the share of %s@%s into %s", name, digest[:12], target)

    def _bind_dataset(self, target: Path, name: str, digest: str) -> None:
        point = target / "datasets" / name
        if mounts.is_mount_point(point):
            return
        version = self.service.store.ready_dir(name, digest)  # validates name and digest
        self._bind_readonly(version, point, f"{target.parent.name}-{name}")
        log.info("bound %s@%s into %s", name, digest, target)

    # -- unpublish --------------------------------------------------------------------

    async def unpublish(self, volume_id: str, target_path: str) -> None:
        validate_volume_id(volume_id)
        target = check_target(target_path, self.pods_dir, None)
        async with self._lock:
            # Only what this volume id published at this target is touched: an id with no
            # record published nothing (OK, idempotent: the CSI spec), and a known id at
            # another target is refused before its mounts or its lease renewal are touched.
            record = self.volumes.load(volume_id)
            if record is None:
                log.info("unpublish of volume %s, which this node does not hold: nothing to do", volume_id)
                return
            if record.target_path != str(target):
                raise NotFound(f"volume {volume_id} is not published at {target_path}")
            published = self._published.pop(volume_id, None)
            if published is not None and published.watcher is not None:
                published.watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await published.watcher
            await asyncio.to_thread(self._remove_mounts, volume_id, target)
            others = [r for r in self.volumes.all() if r.pod_uid == record.pod_uid and r.volume_id != volume_id]
            if not others:
                with contextlib.suppress(NotFound):
                    await self.service.release_task(record.pod_uid)
            self.volumes.delete(volume_id)
        log.info("unpublished volume %s from %s", volume_id, target)

    def _remove_mounts(self, volume_id: str, target: Path) -> None:
        """Unmount everything at and under the target, deepest first; then remove the
        target directory and the view. Nothing is deleted while anything is still mounted."""
        for point in sorted((p for p in mounts.mount_points() if _at_or_under(p, target)), key=len, reverse=True):
            while mounts.is_mount_point(Path(point)):
                mounts.unmount(Path(point))
        if target.is_dir() and not target.is_symlink():
            target.rmdir()
        view = self.volumes.view(volume_id)
        if any(_at_or_under(p, view) for p in mounts.mount_points()):
            raise DsagentError(f"the view of volume {volume_id} is still mounted; not removing it")
        if view.exists():
            shutil.rmtree(view)

    # -- restart ----------------------------------------------------------------------

    async def recover(self) -> None:
        """After a restart: re-mount and watch what the records say is published."""
        for record in self.volumes.all():
            try:
                target = check_target(record.target_path, self.pods_dir, record.pod_uid)
                if not target.parent.is_dir():  # the kubelet removed the pod's volume dir: it is gone
                    await self.unpublish(record.volume_id, record.target_path)
                    continue
                async with self._lock:
                    # a fetch that needs the Secret's options waits: secrets are never stored
                    await self.service.submit_task(record.pod_uid, record.requests())
                    self._mount_view(record)
                    self._track(record, {})
                log.info("recovered volume %s of pod %s/%s", record.volume_id, record.pod_namespace, record.pod_name)
            except DsagentError as exc:
                log.warning("cannot recover volume %s: %s", record.volume_id, exc)

    async def stop(self) -> None:
        """Stop the watchers; the mounts stay (the pods keep running through a restart)."""
        watchers = [p.watcher for p in self._published.values() if p.watcher is not None]
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        self._published.clear()


def pod_status(task: TaskRecord | None, shares: Sequence[Mapping[str, Any]] = (), uid: str = "") -> dict[str, Any]:
    """What the pod may see of its task (``status.json``): its own datasets, no paths, no
    options; and of each striped version its volume shows, this node's share. Ready when the
    task is (or there is none) and every share is ready enough."""
    states = {s["state"] for s in shares}
    if task is not None and task.state != "ready":
        state = task.state
    else:
        state = "failed" if "failed" in states else "pending" if states - {"ready", "complete"} else "ready"
    return {
        "task": task.task_id if task is not None else uid,
        "state": state,
        **({"stripes": [dict(s) for s in shares]} if shares else {}),
        "datasets": [
            {
                "name": d.name,
                "digest": d.digest,
                "state": d.state,
                "bytes": d.size_bytes,
                "bytesDone": d.bytes_done,
                "files": d.files,
                "filesDone": d.files_done,
                "eta": d.eta,
                **({"error": {k: d.error[k] for k in ("code", "message", "hint") if k in d.error}} if d.error else {}),
            }
            for d in (task.datasets if task is not None else ())
        ],
    }


def _write_status(view: Path, status: Mapping[str, Any]) -> None:
    write_atomic(view / "status.json", json.dumps(status, indent=1).encode() + b"\n")
    for mark, on in (("ready", status.get("state") == "ready"), ("failed", status.get("state") == "failed")):
        path = view / mark
        if on and not path.exists():
            write_atomic(path, b"")
        elif not on:
            path.unlink(missing_ok=True)


def _at_or_under(path: str, base: Path) -> bool:
    return path == str(base) or path.startswith(str(base) + "/")


def _check_settings(settings: Settings) -> None:
    # The API server's rule for a CSIDriver's name: at most 63 characters and, lower-cased,
    # a DNS-1123 subdomain (the CSI spec's looser "domain notation" let 'a..b' through).
    name = settings.csi_driver_name
    if len(name) > CSI_DRIVER_NAME_MAX_LENGTH or not is_dns_subdomain(name.lower()):
        raise SettingsError(
            f"invalid DSAGENT_CSI_DRIVER_NAME {settings.csi_driver_name!r}",
            hint="a domain name of at most 63 characters, e.g. datasets.dsagent.io",
        )
    if not Path(settings.csi_kubelet_pods_dir).is_absolute():
        raise SettingsError(
            f"DSAGENT_CSI_KUBELET_PODS_DIR must be absolute, got {str(settings.csi_kubelet_pods_dir)!r}"
        )
    if settings.csi_socket is not None and len(str(settings.csi_socket).encode()) > 107:
        raise SettingsError(
            f"DSAGENT_CSI_SOCKET {str(settings.csi_socket)!r} is too long for a unix socket (max 107 bytes)"
        )


# -- the gRPC edge ----------------------------------------------------------------------


class IdentityServicer(csi_pb2_grpc.IdentityServicer):
    def __init__(self, driver: NodeDriver) -> None:
        self.driver = driver

    async def GetPluginInfo(self, request: csi_pb2.GetPluginInfoRequest, context: Any) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=self.driver.settings.csi_driver_name, vendor_version=__version__)

    async def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: Any
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        return csi_pb2.GetPluginCapabilitiesResponse()  # node only: no controller, no topology constraints

    async def Probe(self, request: csi_pb2.ProbeRequest, context: Any) -> csi_pb2.ProbeResponse:
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=self.driver.service.started))


class NodeServicer(csi_pb2_grpc.NodeServicer):
    def __init__(self, driver: NodeDriver) -> None:
        self.driver = driver

    async def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: Any
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        return csi_pb2.NodeGetCapabilitiesResponse()  # no staging, no stats, no expansion

    async def NodeGetInfo(self, request: csi_pb2.NodeGetInfoRequest, context: Any) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(node_id=self.driver.settings.node_name)

    async def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: Any
    ) -> csi_pb2.NodePublishVolumeResponse:
        try:
            if not request.HasField("volume_capability"):
                raise InvalidInput("volume_capability is required")
            await self.driver.publish(
                request.volume_id,
                request.target_path,
                dict(request.volume_context),
                dict(request.secrets),
                block=request.volume_capability.HasField("block"),
            )
        except DsagentError as exc:
            await grpcstatus.abort(context, exc)
        except OSError as exc:  # a filesystem step failed: say which, as INTERNAL
            await context.abort(grpc.StatusCode.INTERNAL, f"{exc.strerror}: {exc.filename}")
        return csi_pb2.NodePublishVolumeResponse()

    async def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: Any
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        try:
            await self.driver.unpublish(request.volume_id, request.target_path)
        except DsagentError as exc:
            await grpcstatus.abort(context, exc)
        except OSError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, f"{exc.strerror}: {exc.filename}")
        return csi_pb2.NodeUnpublishVolumeResponse()


async def serve(driver: NodeDriver, socket_path: Path) -> grpc.aio.Server:
    """Start the Identity and Node services on ``socket_path`` (a stale socket is replaced)."""
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    if socket_path.is_socket() or socket_path.is_symlink():
        socket_path.unlink()
    server = grpc.aio.server()
    csi_pb2_grpc.add_IdentityServicer_to_server(IdentityServicer(driver), server)
    csi_pb2_grpc.add_NodeServicer_to_server(NodeServicer(driver), server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    return server


__all__ = ["IdentityServicer", "NodeDriver", "NodeServicer", "pod_status", "serve"]
