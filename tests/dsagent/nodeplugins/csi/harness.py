"""Real parts for the CSI tests: an agent (CacheService + NodeDriver + the gRPC server on a
unix socket) on its own event loop thread, a CSI client speaking real gRPC, and a
kubelet's directory layout with real mount propagation.

``CsiAgent`` can be stopped and started again on the same root: that is an agent restart
(the mounts it made stay, as they do on a node). ``Kubelet`` plays the kubelet's part of
the mount dance: its pods dir is a shared mount (as on a node), it creates a volume's
parent directory, and ``container_view`` bind-mounts a target the way a runtime does for
``mountPropagation: HostToContainer`` (rbind, then rslave).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc

from dsagent.cache.service import CacheService
from dsagent.cache.settings import Settings
from dsagent.nodeplugins.csi.driver import NodeDriver, serve
from dsagent.nodeplugins.proto.csi import csi_pb2, csi_pb2_grpc

DRIVER = "datasets.dsagent.io"


def mount_rights(scratch: Path) -> str | None:
    """None when this process can bind-mount, else why not (the reason a test skips with)."""
    if os.geteuid() != 0:
        return f"bind mounts need root with CAP_SYS_ADMIN; the tests run as uid {os.geteuid()}"
    a, b = scratch / "probe-a", scratch / "probe-b"
    a.mkdir(exist_ok=True)
    b.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "--bind", str(a), str(b)], capture_output=True, text=True)
    if done.returncode != 0:
        return f"this sandbox refuses bind mounts: {done.stderr.strip()}"
    subprocess.run(["umount", str(b)], check=True)
    return None


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True)


class CsiAgent:
    """The agent's CSI side on a private event loop thread; ``stop()`` is a restart's first half."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.socket = settings.csi_socket
        assert self.socket is not None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.service: CacheService
        self.driver: NodeDriver
        self.server: grpc.aio.Server
        self.call(self._start())

    def call(self, coro: Any, timeout: float = 30) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    async def _start(self) -> None:
        self.service = CacheService(self.settings)
        await self.service.start()
        self.driver = NodeDriver(self.service, self.settings)
        await self.driver.recover()
        assert self.socket is not None
        self.server = await serve(self.driver, self.socket)

    async def _stop(self) -> None:
        await self.server.stop(None)
        await self.driver.stop()
        await self.service.stop()

    def stop(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class CsiClient:
    """The kubelet's side of the wire: real gRPC over the unix socket."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)

    def publish(
        self,
        volume_id: str,
        target: Path | str,
        context: dict[str, str],
        *,
        secrets: dict[str, str] | None = None,
        block: bool = False,
        timeout: float = 10,
    ) -> csi_pb2.NodePublishVolumeResponse:
        capability = csi_pb2.VolumeCapability(
            access_mode=csi_pb2.VolumeCapability.AccessMode(
                mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY
            )
        )
        if block:
            capability.block.SetInParent()
        else:
            capability.mount.SetInParent()
        request = csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id,
            target_path=str(target),
            volume_capability=capability,
            readonly=True,
            volume_context=context,
            secrets=secrets or {},
        )
        return self.node.NodePublishVolume(request, timeout=timeout)

    def unpublish(self, volume_id: str, target: Path | str, timeout: float = 10) -> csi_pb2.NodeUnpublishVolumeResponse:
        return self.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target)), timeout=timeout
        )

    def close(self) -> None:
        self.channel.close()


class Kubelet:
    """A kubelet's pods dir (a shared mount, as on a node) and its volume paths."""

    def __init__(self, base: Path) -> None:
        self.pods = base / "kubelet" / "pods"
        self.pods.mkdir(parents=True)
        self.containers = base / "containers"
        self.containers.mkdir()
        sh("mount", "--bind", str(self.pods), str(self.pods))
        sh("mount", "--make-shared", str(self.pods))
        self.views: list[Path] = []

    def pod(self, volume: str = "datasets") -> tuple[str, str, Path]:
        """A new pod: ``(uid, volume_id, target)``; the kubelet creates the target's parent."""
        uid = str(uuid.uuid4())
        target = self.pods / uid / "volumes" / "kubernetes.io~csi" / volume / "mount"
        target.parent.mkdir(parents=True)
        return uid, "csi-" + uuid.uuid4().hex, target

    def container_view(self, target: Path) -> Path:
        """What a container with ``mountPropagation: HostToContainer`` sees of the volume."""
        view = self.containers / uuid.uuid4().hex
        view.mkdir()
        sh("mount", "--rbind", str(target), str(view))
        sh("mount", "--make-rslave", str(view))
        self.views.append(view)
        return view

    def close(self) -> None:
        for view in self.views:
            subprocess.run(["umount", "-R", "-l", str(view)], capture_output=True)
        subprocess.run(["umount", "-R", "-l", str(self.pods)], capture_output=True)


def context(
    uid: str, datasets: list[dict[str, Any]], *, name: str = "trainer-0", namespace: str = "ml"
) -> dict[str, str]:
    """The volume context the kubelet sends for an inline volume of a pod (podInfoOnMount)."""
    import json

    return {
        "csi.storage.k8s.io/pod.uid": uid,
        "csi.storage.k8s.io/pod.name": name,
        "csi.storage.k8s.io/pod.namespace": namespace,
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/serviceAccount.name": "default",
        "datasets": json.dumps(datasets),
    }
