"""A fake kubelet for the device plugin tests: real gRPC over unix sockets, the real protos.

:class:`FakeKubelet` serves ``Registration`` on ``<plugin dir>/kubelet.sock``, records each
``RegisterRequest`` and, like the kubelet's device manager, dials the plugin's endpoint to
call ``ListAndWatch``, ``GetPreferredAllocation`` and ``Allocate``. :meth:`FakeKubelet.restart`
removes the plugin sockets and recreates ``kubelet.sock``, as a restarting kubelet does.
:class:`FakePodResources` serves ``PodResourcesLister`` (``List``,
``GetAllocatableResources``, ``Get``) from a list the test edits.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from dsagent.nodeplugins.proto import deviceplugin_v1beta1_pb2 as dp
from dsagent.nodeplugins.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from dsagent.nodeplugins.proto import podresources_v1_pb2 as pr
from dsagent.nodeplugins.proto import podresources_v1_pb2_grpc as pr_grpc


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> dp.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        self.kubelet.registrations.append(request)
        self.kubelet.registered.set()
        return dp.Empty()


class FakeKubelet:
    def __init__(self, plugin_dir: Any) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[Any] = []
        self.registered = asyncio.Event()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), self._server)
        self._server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0)
            self._server = None

    async def restart(self) -> None:
        """Stop, delete every socket in the directory (the kubelet does), start again."""
        await self.stop()
        for path in self.plugin_dir.glob("*.sock"):
            path.unlink()
        self.registered = asyncio.Event()
        await self.start()

    def registration(self, resource: str) -> Any:
        return next(r for r in reversed(self.registrations) if r.resource_name == resource)

    def channel(self, resource: str) -> grpc.aio.Channel:
        """A channel to the plugin's endpoint for ``resource``, as the kubelet dials it."""
        return grpc.aio.insecure_channel(f"unix://{self.plugin_dir / self.registration(resource).endpoint}")

    async def first_list(self, resource: str) -> list[Any]:
        async with self.channel(resource) as channel:
            stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
            response = await stream.read()
            stream.cancel()
            return list(response.devices)

    async def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        async with self.channel(resource) as channel:
            request = dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
                    )
                ]
            )
            response = await dp_grpc.DevicePluginStub(channel).GetPreferredAllocation(request, timeout=10)
            return list(response.container_responses[0].deviceIDs)

    async def allocate(self, resource: str, ids: list[str]) -> Any:
        async with self.channel(resource) as channel:
            request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
            response = await dp_grpc.DevicePluginStub(channel).Allocate(request, timeout=10)
            return response.container_responses[0]


class _Lister(pr_grpc.PodResourcesListerServicer):
    def __init__(self, fake: FakePodResources) -> None:
        self.fake = fake

    async def List(self, request: Any, context: Any) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(pod_resources=[self._pod(*p) for p in self.fake.pods])

    async def GetAllocatableResources(self, request: Any, context: Any) -> pr.AllocatableResourcesResponse:
        if self.fake.allocatable is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
        return pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in (self.fake.allocatable or {}).items()
            ]
        )

    async def Get(self, request: Any, context: Any) -> pr.GetPodResourcesResponse:
        for pod in self.fake.pods:
            if (pod[0], pod[1]) == (request.pod_namespace, request.pod_name):
                return pr.GetPodResourcesResponse(pod_resources=self._pod(*pod))
        await context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")
        raise AssertionError("unreachable")

    @staticmethod
    def _pod(namespace: str, name: str, devices: list[tuple[str, list[str]]]) -> Any:
        return pr.PodResources(
            namespace=namespace,
            name=name,
            containers=[
                pr.ContainerResources(
                    name="main", devices=[pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices]
                )
            ],
        )


class FakePodResources:
    """``pods``: (namespace, name, [(resource, device ids), ...]); ``allocatable``: None = UNIMPLEMENTED."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.pods: list[tuple[str, str, list[tuple[str, list[str]]]]] = []
        self.allocatable: dict[str, list[str]] | None = {}
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0)
