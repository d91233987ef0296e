"""What the device plugin advertises and who holds which GPU and VF: pure bookkeeping.

Who calls it: :mod:`dsagent.nodeplugins.deviceplugin.plugin` (the gRPC edge), which owns all I/O.
What it owns (docs/design.md#roce-allocation):

* :func:`node_classes`, the one adapter between ``gpu_topology``'s RoCE classes and the
  kubelet resources ``<prefix>/gpu-roce<N>`` (the classes rule lives in gpu_topology and
  may change; nothing else here calls it);
* :class:`NodeDevices`: per resource, its GPUs (named by UUID, with their NUMA node) and
  the SR-IOV VFs of its NICs; a **class-set resource** per run of consecutive classes
  (``<prefix>/gpu-roce1-2``: the GPUs of classes 1 and 2, for a worker of a job whose
  class set they are, docs/design.md#class-sets); plus ``<prefix>/gpu-all`` with every
  GPU of the node, for a whole-node worker that spans several classes; and, where the
  agent serves the node in NVIDIA's device plugin's place, the **plain GPU resource**
  (``nvidia.com/gpu``) over every GPU, for the pods no class was given
  (docs/design.md#defaults), each placed inside one class where it fits
  (:meth:`NodeDevices.one_class`);
* :class:`Ledger`: the allocations made, each with its GPUs and **one** VF, of a RoCE NIC
  affine to them (the design's "only one VF needs to be chosen";
  docs/design.md#roce-allocation). A GPU held under one resource is
  reported Unhealthy under the others (the kubelet then offers it to nobody else) and an
  Allocate that would share it is refused; a VF is taken until the kubelet's pod-resources
  API stops listing the allocation;
* :func:`nccl_settings` and :func:`nccl_conf`: the NCCL environment and file text.

Decisions: the VF's NIC is one of the allocated GPUs' nearest NICs
(:func:`gpu_topology.nearest_nics`) among their classes' NICs: the first class's (rail
order), the NIC near the most allocated GPUs, then the least used; on it, the lowest free
``virtfn`` (:meth:`Ledger._choose_vf`). A class none of whose GPUs names a nearest NIC of
its own gets the VF of its NIC with the fewest taken VFs. An Allocate repeated for the same devices (the
kubelet does this after its restart) gets the same allocation back. NCCL names use the
``=`` exact-match form (``NCCL_IB_HCA==mlx5_10``): a bare ``mlx5_1`` would also match
``mlx5_10``..``mlx5_19``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dsagent.errors import Conflict, InvalidInput
from dsplatform.gpus import CLASS_STEM, RESOURCE_PREFIX, WHOLE_NODE
from dsplatform.names import is_resource_name, resource_prefix_problem
from gpu_topology import ClassMode, Topology, nearest_nics, roce_classes
from gpu_topology.classsets import resource_name, runs
from gpu_topology.discovery.sriov import PhysicalFunction, VirtualFunction

DEFAULT_PREFIX = RESOURCE_PREFIX
CLASS_RESOURCE = CLASS_STEM  # <prefix>/gpu-roce<N>
WHOLE_NODE_RESOURCE = WHOLE_NODE
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NCCL_CONF_IN_CONTAINER = "/etc/nccl.conf"
MAX_DEVICE_ID = 63  # the kubelet's limit on a device ID


class NoFreeVf(Conflict):
    """Every VF of the class's NICs is taken: the node's state, not a duplicate request."""

    code = "no_free_vf"
    grpc_status = "FAILED_PRECONDITION"


class DeviceInUse(Conflict):
    """A GPU is held under another resource: the node's state, not a duplicate request."""

    code = "device_in_use"
    grpc_status = "FAILED_PRECONDITION"


@dataclass(frozen=True)
class ResourceClass:
    """One kubelet resource: its GPUs (indices) and the NICs whose VFs go with them."""

    resource: str
    gpus: tuple[int, ...]
    nics: tuple[str, ...]


def validate_prefix(prefix: str) -> str:
    """A resource prefix must be a DNS subdomain (``dsagent.io``, ``example.com``)."""
    problem = resource_prefix_problem(prefix)
    if problem is not None:
        raise InvalidInput(problem)
    return prefix


def node_classes(
    topology: Topology, prefix: str = DEFAULT_PREFIX, mode: ClassMode | str = ClassMode.NUMA
) -> tuple[ResourceClass, ...]:
    """The node's class resources, ``<prefix>/gpu-roce<N>`` (docs/design.md#roce-classes).

    The adapter to :func:`gpu_topology.roce_classes`: the only call of it in this package.
    ``mode`` must be the one the agent publishes its topology with (``DSAGENT_ROCE_CLASSES``,
    ``Settings.roce_classes``), so that ``gpu-roce<N>`` here is the class the webhook and the
    extender chose from the published annotation.
    """
    classes = roce_classes(topology, prefix=f"{validate_prefix(prefix)}/{CLASS_RESOURCE}", mode=mode)
    return tuple(ResourceClass(resource=c.name, gpus=tuple(c.gpus), nics=tuple(c.nics)) for c in classes)


#: between a GPU's UUID and its VF's PCI address in a GPU/VF pair's device ID (no UUID has one)
PAIR_SEPARATOR = "_"


def gpu_of(device_id: str) -> str:
    """The GPU UUID a device ID names: the ID itself, or a GPU/VF pair's first part."""
    return device_id.split(PAIR_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class Device:
    """One advertised device: a GPU by UUID, or (``pairs``) a GPU and its VF, ``<uuid>_<VF PCI address>``."""

    id: str
    index: int
    numa_node: int | None
    vf: str | None = None  # a pair's VF, by PCI address

    @property
    def gpu(self) -> str:
        """The GPU's UUID (:func:`gpu_of` the ID)."""
        return gpu_of(self.id)


def without_vfs(pfs: Mapping[str, PhysicalFunction], taken: Collection[str]) -> dict[str, PhysicalFunction]:
    """``pfs`` less the VFs (by PCI address) in ``taken``: those another device plugin hands
    out (the SR-IOV network device plugin names its devices by PCI address), which this one
    must never give a container too."""
    return {nic: replace(pf, vfs=tuple(vf for vf in pf.vfs if vf.pci_bus_id not in taken)) for nic, pf in pfs.items()}


def others_devices(allocatable: Mapping[str, Iterable[str]] | None, ours: Callable[[str], bool]) -> set[str]:
    """The device IDs other plugins advertise (the kubelet's allocatable resources, the
    resources ``ours`` does not claim); empty when the kubelet did not say."""
    return {i for resource, ids in (allocatable or {}).items() if not ours(resource) for i in ids}


def gpu_vf_pairs(
    classes: Iterable[ResourceClass], near: Mapping[int, tuple[str, ...]], vfs: Mapping[str, PhysicalFunction]
) -> dict[int, VirtualFunction]:
    """The embodiment's GPU/VF pairs: each GPU with a VF of its own, of one of its class's NICs,
    a NIC near it first (the one with the fewest pairs yet, then NIC order); a GPU whose
    class's NICs have no free VF left is not paired. Claim 3 gives each NIC as many VFs as
    GPUs are affine to it, so every GPU is paired where the VFs were made that way."""
    pairs: dict[int, VirtualFunction] = {}
    taken: set[str] = set()
    load: dict[str, int] = {}
    for cls in classes:
        for gpu in sorted(cls.gpus):
            nics = [n for n in cls.nics if n in vfs]
            nics.sort(key=lambda n: (n not in near.get(gpu, ()), load.get(n, 0), cls.nics.index(n)))
            for nic in nics:
                vf = next((v for v in vfs[nic].vfs if v.usable and v.pci_bus_id not in taken), None)
                if vf is not None:
                    pairs[gpu] = vf
                    taken.add(vf.pci_bus_id)
                    load[nic] = load.get(nic, 0) + 1
                    break
    return pairs


class NodeDevices:
    """The node's resources, their devices and VFs; built once at start-up."""

    def __init__(
        self,
        topology: Topology,
        vfs: Mapping[str, PhysicalFunction],
        prefix: str = DEFAULT_PREFIX,
        mode: ClassMode | str = ClassMode.NUMA,
        plain: str = "",
        pairs: bool = False,
    ) -> None:
        if plain and (not is_resource_name(plain) or plain.startswith(f"{prefix}/")):
            raise InvalidInput(
                f"the plain GPU resource {plain!r} is not an extended resource name outside {prefix}/",
                hint="use NVIDIA's name, nvidia.com/gpu",
            )
        missing = [g.index for g in topology.gpus if not g.uuid]
        if missing:
            raise InvalidInput(
                f"GPUs {missing} have no UUID; the device plugin names devices by GPU UUID",
                hint="discover the topology with nvml or nvidia-smi, which report UUIDs",
            )
        too_long = [g.uuid for g in topology.gpus if g.uuid and len(g.uuid) > MAX_DEVICE_ID]
        if too_long:
            raise InvalidInput(f"GPU UUIDs longer than {MAX_DEVICE_ID} characters: {too_long}")
        self.topology = topology
        self.prefix = validate_prefix(prefix)
        self.classes = node_classes(topology, prefix, mode)
        self.whole_node = f"{prefix}/{WHOLE_NODE_RESOURCE}"
        self.vfs = dict(vfs)
        self._near = {g.index: nearest_nics(topology, g.index) for g in topology.gpus}
        paired = gpu_vf_pairs(self.classes, self._near, self.vfs) if pairs else {}
        self.devices = {}
        for g in topology.gpus:
            vf = paired.get(g.index)
            device_id = f"{g.uuid}{PAIR_SEPARATOR}{vf.pci_bus_id}" if vf is not None else str(g.uuid)
            pci = vf.pci_bus_id if vf is not None else None
            device = Device(id=device_id, index=g.index, numa_node=g.numa_node, vf=pci)
            self.devices[device.id] = device
        too_long = [d.id for d in self.devices.values() if len(d.id) > MAX_DEVICE_ID]
        if too_long:
            raise InvalidInput(f"GPU/VF pair IDs longer than {MAX_DEVICE_ID} characters: {too_long}")
        self.by_index = {d.index: d for d in self.devices.values()}
        self.by_uuid = {d.gpu: d for d in self.devices.values()}
        self._resources: dict[str, tuple[int, ...]] = {c.resource: c.gpus for c in self.classes}
        by_name = {c.resource: c for c in self.classes}
        #: class-set resource -> its classes (docs/design.md#class-sets)
        self.sets: dict[str, tuple[ResourceClass, ...]] = {}
        for run in runs(by_name):
            if len(run) > 1:
                name = resource_name(run)
                self.sets[name] = tuple(by_name[c] for c in run)
                self._resources[name] = tuple(sorted(g for c in run for g in by_name[c].gpus))
        if self.classes:
            self._resources[self.whole_node] = topology.gpu_indices
        #: the plain GPU resource served in NVIDIA's plugin's place ("": none)
        self.plain = plain
        if plain:
            self._resources[plain] = topology.gpu_indices

    @property
    def resources(self) -> tuple[str, ...]:
        """Every resource to register: classes, class sets, ``gpu-all`` (none without classes),
        then the plain GPU resource where it is served."""
        return tuple(self._resources)

    def near_nics(self, index: int) -> tuple[str, ...]:
        """GPU ``index``'s nearest NICs (gpu_topology's rule)."""
        return self._near.get(index, ())

    def resource_devices(self, resource: str) -> tuple[Device, ...]:
        return tuple(self.by_index[i] for i in self._resources[resource])

    def class_of(self, index: int) -> ResourceClass | None:
        return next((c for c in self.classes if index in c.gpus), None)

    def one_class(self, free: Iterable[int], size: int, must: Iterable[int] = ()) -> tuple[int, ...] | None:
        """The free GPUs of the one class a plain-resource container of ``size`` GPUs should
        take, or None when no class holds it (the caller then chooses over the whole node).

        Best fit: of the classes with ``size`` free GPUs that hold every ``must`` GPU, the
        one with the fewest free, then class (rail) order. The container then talks over one
        class's NICs, and the classes with the most room stay whole for the class-set workers
        of multi-node jobs (docs/design.md#defaults).
        """
        free = set(free)
        must = set(must)
        fits = []
        for rank, cls in enumerate(self.classes):
            room = free.intersection(cls.gpus)
            if len(room) >= size and must <= room:
                fits.append((len(room), rank, tuple(sorted(room))))
        return min(fits)[2] if fits else None

    def resolve(self, resource: str, ids: Iterable[Any], what: str) -> list[Device]:
        """The devices ``ids`` name; hostile input is an :class:`InvalidInput`."""
        allowed = set(self._resources.get(resource, ()))
        found: list[Device] = []
        for raw in ids:
            device = self.devices.get(raw) if isinstance(raw, str) else None
            if device is None or device.index not in allowed:
                raise InvalidInput(f"{what}: {str(raw)[:80]!r} is not a device of {resource}")
            if device in found:
                raise InvalidInput(f"{what}: device {raw} is named twice")
            found.append(device)
        return found


@dataclass(frozen=True)
class Allocation:
    """GPUs given to one container under one resource, and the VFs that go with them."""

    id: str
    resource: str
    gpus: tuple[str, ...]  # UUIDs, sorted
    vfs: tuple[str, ...]  # the VF's PCI address (none without SR-IOV); records of several still load
    created: float

    @staticmethod
    def make_id(resource: str, gpus: Iterable[str]) -> str:
        text = resource + "\0" + "\0".join(sorted(gpus))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Ledger:
    """Who holds which GPU and VF (see the module docstring); JSON-serialisable."""

    node: NodeDevices
    allocations: dict[str, Allocation] = field(default_factory=dict)

    def vf(self, pci_bus_id: str) -> VirtualFunction | None:
        for pf in self.node.vfs.values():
            for vf in pf.vfs:
                if vf.pci_bus_id == pci_bus_id:
                    return vf
        return None

    def held_elsewhere(self, resource: str) -> set[str]:
        """GPU UUIDs held under resources other than ``resource``."""
        return {g for a in self.allocations.values() if a.resource != resource for g in a.gpus}

    def allocate(self, resource: str, gpus: Iterable[str], now: float, *, unusable: Collection[str] = ()) -> Allocation:
        """Record an allocation (idempotent for the same devices); raises on a conflict.
        ``unusable``: VFs (PCI addresses) another device plugin hands out now, never chosen."""
        devices = self.node.resolve(resource, gpus, "Allocate")
        if not devices:
            raise InvalidInput("Allocate: a container request names no device")
        uuids = tuple(sorted(d.gpu for d in devices))
        alloc_id = Allocation.make_id(resource, (d.id for d in devices))  # as pod-resources lists them
        if alloc_id in self.allocations:
            return self.allocations[alloc_id]
        held = {g: a for a in self.allocations.values() for g in a.gpus}
        shared = sorted(g for g in uuids if g in held)
        if shared:
            raise DeviceInUse(
                f"GPUs {shared} are already allocated under {held[shared[0]].resource}",
                hint="the kubelet offered a device this plugin reported Unhealthy",
            )
        taken = {vf for a in self.allocations.values() for vf in a.vfs}
        vf = self._paired_vf(devices, taken | set(unusable)) or self._choose_vf(devices, taken, set(unusable))
        chosen = (vf.pci_bus_id,) if vf is not None else ()
        allocation = Allocation(id=alloc_id, resource=resource, gpus=uuids, vfs=chosen, created=now)
        self.allocations[alloc_id] = allocation
        return allocation

    def release_unlisted(
        self, listed: Iterable[tuple[str, Iterable[str]]], now: float, grace: float
    ) -> list[Allocation]:
        """Free allocations that pod-resources no longer lists, once older than ``grace`` s.

        ``listed`` holds (resource, device ids) per container, as the kubelet reports them.
        The grace covers the moment between Allocate and the kubelet recording it.
        """
        present = {Allocation.make_id(resource, ids) for resource, ids in listed}
        freed = [a for key, a in self.allocations.items() if key not in present and now - a.created >= grace]
        for allocation in freed:
            del self.allocations[allocation.id]
        return freed

    def _classes_of(self, devices: Iterable[Device]) -> list[ResourceClass]:
        """The classes the devices belong to, in class (rail) order."""
        indices = {d.index for d in devices}
        return [c for c in self.node.classes if indices.intersection(c.gpus)]

    def _paired_vf(self, devices: list[Device], taken: set[str]) -> VirtualFunction | None:
        """GPU/VF pairs: the VF of the first pair in rail order (class order, then GPU), one VF
        per container as with GPUs alone; None without pairs."""
        rank = {i: r for r, c in enumerate(self.node.classes) for i in c.gpus}
        for device in sorted(devices, key=lambda d: (rank.get(d.index, len(rank)), d.index)):
            vf = self.vf(device.vf) if device.vf is not None else None
            if vf is not None and vf.usable and vf.pci_bus_id not in taken:
                return vf
        return None

    def _choose_vf(
        self, devices: list[Device], taken: set[str], unusable: Collection[str] = ()
    ) -> VirtualFunction | None:
        """The container's one VF (docs/design.md#roce-allocation); None without SR-IOV, or
        where every VF of these NICs is another plugin's (``unusable``): GPUs only then.

        Candidates are the SR-IOV NICs of the classes the GPUs touch. The first class (rail
        order) comes first, so every worker of a class set uses the same rail; inside a
        class, a NIC near an allocated GPU before one near none, then the NIC near the most
        allocated GPUs, then the one with the fewest taken VFs, then NIC order. On the
        chosen NIC, the lowest free ``virtfn``; a NIC with none free gives way to the next.
        """
        classes = self._classes_of(devices)
        candidates: list[tuple[tuple[int, int, int, int, int], PhysicalFunction]] = []
        for rank, cls in enumerate(classes):
            for position, nic in enumerate(cls.nics):
                pf = self.node.vfs.get(nic)
                if pf is None or not any(vf.usable and vf.pci_bus_id not in unusable for vf in pf.vfs):
                    continue
                near = sum(nic in self.node.near_nics(d.index) for d in devices)
                busy = sum(vf.pci_bus_id in taken for vf in pf.vfs)
                candidates.append(((rank, near == 0, -near, busy, position), pf))
        if not candidates:
            return None  # no SR-IOV on these classes' NICs: GPUs only (docs/design.md#roce-allocation)
        for _, pf in sorted(candidates, key=lambda item: item[0]):
            for vf in pf.vfs:
                if vf.usable and vf.pci_bus_id not in taken and vf.pci_bus_id not in unusable:
                    return vf
        nics = ", ".join(dict.fromkeys(n for c in classes for n in c.nics))
        raise NoFreeVf(
            f"every VF of {nics} ({', '.join(c.resource for c in classes)}) is taken",
            hint="enable more VFs (sriov_numvfs) or wait for a pod of this class to end",
        )

    # -- persistence ---------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps({"version": 1, "allocations": [asdict(a) for a in self.allocations.values()]}, sort_keys=True)

    def load_json(self, text: str) -> None:
        """Restore allocations saved by :meth:`to_json`; unknown GPUs or VFs are dropped."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("allocations"), list):
            raise InvalidInput("not a version-1 allocation record")
        for item in data["allocations"]:
            try:
                allocation = Allocation(
                    id=str(item["id"]),
                    resource=str(item["resource"]),
                    gpus=tuple(str(g) for g in item["gpus"]),
                    vfs=tuple(str(v) for v in item["vfs"]),
                    created=float(item["created"]),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidInput(f"malformed allocation record: {exc}") from exc
            if all(g in self.node.by_uuid for g in allocation.gpus) and all(self.vf(v) for v in allocation.vfs):
                self.allocations[allocation.id] = allocation


def nccl_settings(vfs: Iterable[VirtualFunction]) -> dict[str, str]:
    """NCCL's environment for a container given ``vfs`` (empty without a VF)."""
    vfs = [vf for vf in vfs if vf.rdma_device]
    if not vfs:
        return {}
    settings = {"NCCL_IB_HCA": "=" + ",".join(str(vf.rdma_device) for vf in vfs)}
    gid = next((vf.gid_index for vf in vfs if vf.gid_index is not None), None)
    if gid is not None:
        settings["NCCL_IB_GID_INDEX"] = str(gid)
    netdevs = [vf.netdev for vf in vfs if vf.netdev]
    if netdevs:
        settings["NCCL_SOCKET_IFNAME"] = "=" + ",".join(str(n) for n in netdevs)
    if len(vfs) > 1:
        # an allocation recorded with several VFs (such records still load): each rail is its
        # own subnet, so a channel must stay on one rail between the nodes (NCCL_CROSS_NIC=0,
        # NCCL's setting for rail-optimised fabrics)
        settings["NCCL_CROSS_NIC"] = "0"
    return settings


def nccl_conf(allocation: Allocation, settings: Mapping[str, str]) -> str:
    """The ``/etc/nccl.conf`` text: NCCL reads ``KEY=VALUE`` lines, ``#`` comments."""
    lines = [f"# written by dsagent's device plugin: {allocation.resource}, GPUs {','.join(allocation.gpus)}"]
    lines += [f"{key}={value}" for key, value in sorted(settings.items())]
    return "\n".join(lines) + "\n"


__all__ = [
    "DEFAULT_PREFIX",
    "Allocation",
    "Device",
    "DeviceInUse",
    "PAIR_SEPARATOR",
    "Ledger",
    "NoFreeVf",
    "NodeDevices",
    "ResourceClass",
    "gpu_of",
    "others_devices",
    "without_vfs",
    "gpu_vf_pairs",
    "nccl_conf",
    "nccl_settings",
    "node_classes",
    "validate_prefix",
]
