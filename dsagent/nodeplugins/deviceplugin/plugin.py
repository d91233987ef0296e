"""The kubelet device plugin (API v1beta1) for GPU+VF allocation per RoCE class.

Who calls it: ``dsagent serve`` when ``DSAGENT_DEVICE_PLUGIN`` is on (``dsagent.nodeagent.nodeparts``),
and the tests with a fake kubelet. What it owns: the gRPC servers, one unix socket per
resource in the kubelet's device-plugins directory, their registration with the kubelet,
the allocation record under ``<root>/kubelet/`` and the ``nccl.conf`` files it mounts.
The bookkeeping itself is :mod:`dsagent.nodeplugins.deviceplugin.allocation` (docs/design.md#roce-allocation).

Per resource (``<prefix>/gpu-roce<N>`` per class, ``<prefix>/gpu-roce<N>-<M>...`` per run of
classes, for the workers of a job's class set, ``<prefix>/gpu-all`` for whole-node workers,
and the plain ``nvidia.com/gpu`` where the agent serves the node in NVIDIA's plugin's place):

* ``ListAndWatch`` streams the resource's GPUs by UUID with their NUMA node; a GPU held
  under another resource is Unhealthy here, so the kubelet never hands it out twice;
* ``GetPreferredAllocation`` is :func:`gpu_topology.best_gpu_set` over the offered devices
  with the kubelet's must-include devices; for a class-set resource, the rail-aligned share
  of every class of the set (:func:`gpu_topology.classsets.gpus_in_set`); for the plain
  resource, the best set inside one class where one holds it (``NodeDevices.one_class``);
* ``Allocate`` answers ``NVIDIA_VISIBLE_DEVICES=<uuids>``, one free VF of a RoCE NIC near
  the GPUs (its ``/dev/infiniband/*`` nodes as devices) and the NCCL settings naming it as
  environment and as ``/etc/nccl.conf`` (a file written atomically under
  ``<root>/kubelet/nccl/``).

The kubelet deletes plugin sockets and recreates ``kubelet.sock`` when it restarts; the
supervisor notices (inode change or our socket gone) and serves and registers again.
Every ``reconcile_interval`` the pod-resources API (:mod:`dsagent.nodeplugins.deviceplugin.podresources`)
says which allocations still exist; VFs of the others are freed after a grace period.
Errors answer the kubelet with their own gRPC status (INVALID_ARGUMENT, FAILED_PRECONDITION
for a VF or GPU taken, UNAVAILABLE, ...: :mod:`dsagent.nodeplugins.grpcstatus`, the same rule
as the CSI node plugin's), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from dsagent.errors import DsagentError, InvalidInput
from dsagent.format.durable import write_atomic
from dsagent.nodeplugins import grpcstatus
from dsagent.nodeplugins.deviceplugin.allocation import (
    NCCL_CONF_IN_CONTAINER,
    NVIDIA_VISIBLE_DEVICES,
    Allocation,
    Ledger,
    NodeDevices,
    nccl_conf,
    nccl_settings,
)
from dsagent.nodeplugins.deviceplugin.vfsetup import VfSetupFailed
from dsagent.nodeplugins.proto import deviceplugin_v1beta1_pb2 as pb
from dsagent.nodeplugins.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from gpu_topology import best_gpu_set
from gpu_topology.classsets import gpus_in_set

log = logging.getLogger("dsagent.nodeplugins")
API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
VF_ADDRESS_TIMEOUT = 10.0  # seconds a container's VF addresses may take over netlink
OTHERS_TIMEOUT = 2.0  # seconds an Allocate waits for pod-resources' list of other plugins' devices
ListedDevices = Callable[[], Awaitable[list[tuple[str, list[str]]]]]


class DevicePlugin:
    """Every resource of one node; see the module docstring."""

    def __init__(
        self,
        node: NodeDevices,
        *,
        state_dir: Path,
        host_state_dir: Path | None = None,
        plugin_dir: Path = DEFAULT_PLUGIN_DIR,
        listed: ListedDevices | None = None,
        poll_interval: float = 1.0,
        reconcile_interval: float = 10.0,
        grace: float = 30.0,
        clock: Callable[[], float] = time.time,
        vf_addresses: Callable[[list[str]], dict[str, str]] | None = None,
        others: Callable[[], Awaitable[set[str]]] | None = None,
        foreign: set[str] | None = None,
    ) -> None:
        self.node = node
        # the device IDs other plugins advertise (pod-resources), looked at again at each
        # reconcile: a VF among them is never handed out (another plugin's, e.g. SR-IOV's);
        # ``foreign``: those the caller found already
        self.others = others
        self.foreign: set[str] = set(foreign or ())
        # sets the address of the VFs a container is given as it is created (vfsetup.AddressAtAllocation)
        self.vf_addresses = vf_addresses
        self.state_dir = Path(state_dir)
        # the kubelet mounts files by their path on the host, which differs when the agent
        # sees its root through a hostPath volume mounted elsewhere
        self.host_state_dir = Path(host_state_dir) if host_state_dir is not None else self.state_dir
        self.plugin_dir = Path(plugin_dir)
        self.listed = listed
        self.poll_interval = poll_interval
        self.reconcile_interval = reconcile_interval
        self.grace = grace
        self.clock = clock
        self.ledger = Ledger(node)
        self.registrations = 0
        self._servers: list[grpc.aio.Server] = []
        self._kubelet_id: tuple[int, int] | None = None
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._lock = asyncio.Lock()

    # -- life cycle -------------------------------------------------------------------------

    def socket_name(self, resource: str) -> str:
        return "dsagent-" + resource.rsplit("/", 1)[-1] + ".sock"

    async def start(self) -> None:
        """Load the record, serve every resource, register, and supervise in the background."""
        (self.state_dir / "nccl").mkdir(parents=True, exist_ok=True)
        record = self.state_dir / "allocations.json"
        if record.exists():
            try:
                self.ledger.load_json(record.read_text(encoding="utf-8"))
            except (InvalidInput, ValueError, OSError) as exc:
                log.warning("ignoring the allocation record %s: %s", record, exc)
        await self._serve_and_register()
        self._tasks = [asyncio.create_task(self._supervise(), name="dsagent-deviceplugin")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._stop_servers()

    async def _serve_and_register(self) -> None:
        await self._stop_servers()
        kubelet = self.plugin_dir / KUBELET_SOCKET
        self._kubelet_id = _identity(kubelet)
        for resource in self.node.resources:
            path = self.plugin_dir / self.socket_name(resource)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server = grpc.aio.server()
            pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self, resource), server)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers.append(server)
        if self._kubelet_id is None:
            log.info("no kubelet socket at %s yet; will register when it appears", kubelet)
            return
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            stub = pb_grpc.RegistrationStub(channel)
            for resource in self.node.resources:
                request = pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket_name(resource),
                    resource_name=resource,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                )
                try:
                    await stub.Register(request, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    log.warning("registering %s with the kubelet failed: %s", resource, exc.details())
                    self._kubelet_id = None  # try again at the next poll
                    return
        self.registrations += 1
        log.info("registered %s with the kubelet", ", ".join(self.node.resources))

    async def _stop_servers(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(grace=1)

    async def _supervise(self) -> None:
        last_reconcile = self.clock()
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                ours_gone = any(not (self.plugin_dir / self.socket_name(r)).exists() for r in self.node.resources)
                current = _identity(self.plugin_dir / KUBELET_SOCKET)
                if current is not None and (current != self._kubelet_id or ours_gone):
                    log.info("the kubelet restarted (or removed our sockets): registering again")
                    await self._serve_and_register()
                if self.listed is not None and self.clock() - last_reconcile >= self.reconcile_interval:
                    last_reconcile = self.clock()
                    await self.reconcile()
            except asyncio.CancelledError:
                raise
            except DsagentError as exc:
                log.warning("device plugin supervision: %s", exc)
            except Exception:  # keep supervising: a failed round is retried at the next poll
                log.exception("device plugin supervision failed")

    async def _read_others(self) -> None:
        """The device IDs other plugins advertise, read again (at each reconcile and each
        Allocate); where pod-resources does not answer within :data:`OTHERS_TIMEOUT`, what
        was known stands."""
        if self.others is None:
            return
        try:
            self.foreign = await asyncio.wait_for(self.others(), OTHERS_TIMEOUT)
        except (DsagentError, asyncio.TimeoutError) as exc:
            log.info("other device plugins' devices not read: %s", exc or "no answer in time")

    async def reconcile(self) -> list[Allocation]:
        """Free the allocations pod-resources no longer lists (after the grace period)."""
        if self.listed is None:
            return []
        await self._read_others()
        listed = await self.listed()
        async with self._lock:
            freed = self.ledger.release_unlisted(listed, self.clock(), self.grace)
            if freed:
                for allocation in freed:
                    with contextlib.suppress(FileNotFoundError):
                        self.nccl_path(allocation).unlink()
                self._save()
                self._notify()
                log.info("freed %d allocation(s) no longer on the node", len(freed))
        return freed

    # -- what the servicers ask -------------------------------------------------------------

    def nccl_path(self, allocation: Allocation) -> Path:
        return self.state_dir / "nccl" / f"{allocation.id}.conf"

    def devices(self, resource: str) -> list[pb.Device]:
        held = self.ledger.held_elsewhere(resource)
        found = []
        for device in self.node.resource_devices(resource):
            topology = None
            if device.numa_node is not None:
                topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa_node)])
            health = UNHEALTHY if device.gpu in held else HEALTHY
            found.append(pb.Device(ID=device.id, health=health, topology=topology))
        return found

    async def watch(self, resource: str) -> AsyncIterator[pb.ListAndWatchResponse]:
        last: list[pb.Device] | None = None
        while True:
            event = self._changed
            devices = self.devices(resource)
            if devices != last:
                last = devices
                yield pb.ListAndWatchResponse(devices=devices)
            await event.wait()

    def preferred(self, resource: str, request: Any) -> list[str]:
        available = self.node.resolve(resource, request.available_deviceIDs, "available_deviceIDs")
        must = self.node.resolve(resource, request.must_include_deviceIDs, "must_include_deviceIDs")
        size = request.allocation_size
        if size < 1 or size > len(self.node.resource_devices(resource)):
            raise InvalidInput(f"allocation_size {size} is not between 1 and the resource's device count")
        held = self.ledger.held_elsewhere(resource)
        free = [d.index for d in available if d.gpu not in held]
        classes = self.node.sets.get(resource)
        if classes is not None and not must:
            # a class-set resource: the worker's rail-aligned share of every class of the set
            # (docs/design.md#class-sets), each share go-gpuallocator's best inside its class
            names = tuple(c.resource for c in classes)
            in_set = gpus_in_set(self.node.topology, {c.resource: c.gpus for c in classes}, free, names, size)
            if in_set is not None:
                return [self.node.by_index[i].id for i in in_set]
        if resource == self.node.plain:
            # the plain GPU resource: inside one class where one holds it (NodeDevices.one_class)
            free = list(self.node.one_class(free, size, [d.index for d in must]) or free)
        best = best_gpu_set(self.node.topology, free, size, [d.index for d in must])
        if best is None:
            return []  # the kubelet then chooses by itself
        return [self.node.by_index[i].id for i in best.gpus]

    async def allocate(self, resource: str, request: Any) -> pb.ContainerAllocateResponse:
        await self._read_others()  # a VF another plugin took since the last reconcile is not chosen
        async with self._lock:
            allocation = self.ledger.allocate(resource, list(request.devices_ids), self.clock(), unusable=self.foreign)
            vfs = [vf for vf in (self.ledger.vf(v) for v in allocation.vfs) if vf is not None]
            if self.vf_addresses is not None and vfs:  # the VF's address as its container starts
                netdevs = [vf.netdev for vf in vfs if vf.netdev]
                try:
                    await asyncio.wait_for(asyncio.to_thread(self.vf_addresses, netdevs), VF_ADDRESS_TIMEOUT)
                except asyncio.TimeoutError:
                    raise VfSetupFailed(
                        f"setting the addresses of {', '.join(netdevs)} took over {VF_ADDRESS_TIMEOUT:g} s"
                    ) from None
            nccl = nccl_settings(vfs)
            response = pb.ContainerAllocateResponse(envs={NVIDIA_VISIBLE_DEVICES: ",".join(allocation.gpus), **nccl})
            for vf in vfs:
                for node in vf.device_nodes:
                    response.devices.append(pb.DeviceSpec(container_path=node, host_path=node, permissions="rw"))
            if nccl:
                path = self.nccl_path(allocation)
                _write(path, nccl_conf(allocation, nccl))
                host_path = self.host_state_dir / path.relative_to(self.state_dir)
                response.mounts.append(
                    pb.Mount(container_path=NCCL_CONF_IN_CONTAINER, host_path=str(host_path), read_only=True)
                )
            self._save()
            self._notify()
        log.info(
            "allocated %s to a container: GPUs %s, VFs %s",
            resource,
            ",".join(allocation.gpus),
            ",".join(allocation.vfs) or "none",
        )
        return response

    def _save(self) -> None:
        _write(self.state_dir / "allocations.json", self.ledger.to_json())

    def _notify(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        old.set()


class _Servicer(pb_grpc.DevicePluginServicer):
    """One resource's DevicePlugin service; errors become gRPC statuses here."""

    def __init__(self, plugin: DevicePlugin, resource: str) -> None:
        self.plugin = plugin
        self.resource = resource

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:
        async for response in self.plugin.watch(self.resource):
            yield response

    async def GetPreferredAllocation(self, request: Any, context: Any) -> pb.PreferredAllocationResponse:
        response = pb.PreferredAllocationResponse()
        for container in request.container_requests:
            try:
                ids = self.plugin.preferred(self.resource, container)
            except DsagentError as exc:
                await grpcstatus.abort(context, exc)
            response.container_responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return response

    async def Allocate(self, request: Any, context: Any) -> pb.AllocateResponse:
        response = pb.AllocateResponse()
        if not request.container_requests:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Allocate: no container request")
        for container in request.container_requests:
            try:
                answer = await self.plugin.allocate(self.resource, container)
            except DsagentError as exc:
                await grpcstatus.abort(context, exc)
            response.container_responses.append(answer)
        return response

    async def PreStartContainer(self, request: Any, context: Any) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime) of the kubelet's socket: a new kubelet makes a new socket."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"))


__all__ = ["API_VERSION", "DEFAULT_PLUGIN_DIR", "KUBELET_SOCKET", "DevicePlugin"]
