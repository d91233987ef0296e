"""A client of the kubelet's pod-resources API (v1) and the free GPUs it implies.

Who calls it: ``dsagent serve`` (``dsagent.nodeagent.nodeparts``) builds a :class:`PodResourcesClient`
on ``DSAGENT_POD_RESOURCES_SOCKET``; its :meth:`~PodResourcesClient.free_gpus` feeds the
``dsagent.io/free-gpus`` annotation that ``dsagent.nodeagent.clusteragent.ClusterAgent`` publishes
(docs/design.md#annotations), and its :meth:`~PodResourcesClient.listed` tells the device
plugin which allocations still exist. What it owns: the gRPC calls (``List``,
``GetAllocatableResources``) over the unix socket, and the rule turning their answers
into free GPU indices (:func:`free_gpu_indices`).

The rule: a GPU is used when any container holds its UUID under any resource (NVIDIA's
plugin and ours both name GPUs by UUID); it is free when it is not used and, if the kubelet
reports allocatable devices, some plugin advertises it. When the answer cannot be mapped
onto the topology (GPUs without UUIDs, a GPU resource holding an id that is no known UUID,
such as a MIG device) the result is None, and the caller falls back to its estimate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dsagent.errors import TransientError
from dsagent.nodeplugins.deviceplugin.allocation import gpu_of
from dsagent.nodeplugins.proto import podresources_v1_pb2 as pb
from dsagent.nodeplugins.proto import podresources_v1_pb2_grpc as pb_grpc
from gpu_topology import Topology

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCE_PREFIXES = ("nvidia.com/",)


class PodResourcesUnavailable(TransientError):
    """The kubelet's pod-resources socket did not answer."""

    code = "pod_resources_unavailable"


@dataclass(frozen=True)
class ContainerDevices:
    """Devices one container holds under one resource."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodResourcesClient:
    """``List`` and ``GetAllocatableResources`` over ``socket``, each call on a fresh channel.

    A fresh channel per call costs a connect on a local socket and survives the kubelet
    recreating its socket on restart without reconnect logic.
    """

    def __init__(self, socket: Path = DEFAULT_SOCKET, *, timeout: float = 5.0) -> None:
        self.socket = Path(socket)
        self.timeout = timeout

    async def containers(self) -> list[ContainerDevices]:
        response = await self._call("List", pb.ListPodResourcesRequest())
        found = []
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    found.append(
                        ContainerDevices(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource=devices.resource_name,
                            device_ids=tuple(devices.device_ids),
                        )
                    )
        return found

    async def allocatable(self) -> dict[str, tuple[str, ...]] | None:
        """Resource -> allocatable device ids; None when the kubelet lacks the call (< 1.21)."""
        try:
            response = await self._call("GetAllocatableResources", pb.AllocatableResourcesRequest())
        except PodResourcesUnavailable as exc:
            if exc.details.get("status") == grpc.StatusCode.UNIMPLEMENTED.name:
                return None
            raise
        found: dict[str, list[str]] = {}
        for devices in response.devices:
            found.setdefault(devices.resource_name, []).extend(devices.device_ids)
        return {k: tuple(v) for k, v in found.items()}

    async def listed(self) -> list[tuple[str, list[str]]]:
        """(resource, device ids) per container: what the device plugin reconciles with."""
        return [(c.resource, list(c.device_ids)) for c in await self.containers()]

    async def free_gpus(self, topology: Topology, prefixes: Iterable[str] = GPU_RESOURCE_PREFIXES) -> list[int] | None:
        """Free GPU indices of ``topology`` now (see the module docstring), or None."""
        return free_gpu_indices(topology, await self.containers(), await self.allocatable(), prefixes)

    async def _call(self, method: str, request: object) -> Any:
        if not self.socket.exists():
            raise PodResourcesUnavailable(
                f"no pod-resources socket at {self.socket}", hint="mount /var/lib/kubelet/pod-resources into the agent"
            )
        async with grpc.aio.insecure_channel(f"unix://{self.socket}") as channel:
            stub = pb_grpc.PodResourcesListerStub(channel)
            try:
                return await getattr(stub, method)(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as exc:
                raise PodResourcesUnavailable(
                    f"pod-resources {method} failed: {exc.details()}", status=exc.code().name
                ) from exc


def free_gpu_indices(
    topology: Topology,
    used: Iterable[ContainerDevices],
    allocatable: Mapping[str, Iterable[str]] | None,
    prefixes: Iterable[str] = GPU_RESOURCE_PREFIXES,
) -> list[int] | None:
    """The rule of the module docstring, as a pure function."""
    by_uuid = {g.uuid: g.index for g in topology.gpus if g.uuid}
    if len(by_uuid) != len(topology.gpus):
        return None
    prefixes = tuple(prefixes)
    taken: set[int] = set()
    for devices in used:
        gpu_resource = devices.resource.startswith(prefixes)
        for device_id in devices.device_ids:
            if gpu_of(device_id) in by_uuid:  # a GPU, or a GPU/VF pair of the agent's plugin
                taken.add(by_uuid[gpu_of(device_id)])
            elif gpu_resource:
                return None  # a GPU (or MIG slice) we cannot place: do not guess
    offered = set(by_uuid.values())
    if allocatable is not None:
        offered = {by_uuid[gpu_of(i)] for ids in allocatable.values() for i in ids if gpu_of(i) in by_uuid}
    return sorted(offered - taken)


__all__ = ["DEFAULT_SOCKET", "ContainerDevices", "PodResourcesClient", "PodResourcesUnavailable", "free_gpu_indices"]
