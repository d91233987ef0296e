"""The topology model: GPUs, RDMA NICs and the links between them.

Owns the frozen value types every other module of the package works on. Discovery
backends build a :class:`Topology`; scoring, RoCE classes and the JSON contract only read
one. Link types use the vocabulary of ``nvidia-smi topo -m`` (``NV#``, ``PIX``, ``PXB``,
``PHB``, ``NODE``, ``SYS``) plus ``BOARD`` for two GPUs on one board, which only NVML
reports.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpu_topology.errors import InvalidTopology, ParseError, UnknownDevice


class LinkKind(enum.Enum):
    """How two devices are connected, best first."""

    SELF = "X"
    NVLINK = "NV"
    BOARD = "BOARD"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"


# Older drivers printed SOC for what is now SYS.
_ALIASES = {"SOC": LinkKind.SYS}
_NVLINK = re.compile(r"^NV(\d+)$")

# PCIe closeness, used to pick a GPU's nearest NIC and to break GPU-set ties:
# lower is closer. SYS crosses the CPU interconnect and never counts as affine.
PCIE_ORDER: tuple[LinkKind, ...] = (
    LinkKind.PIX,
    LinkKind.PXB,
    LinkKind.PHB,
    LinkKind.NODE,
    LinkKind.SYS,
)


# The levels two devices' PCIe path can have, closest first (BOARD: two GPUs on one board).
PCIE_LEVELS: tuple[LinkKind, ...] = (LinkKind.BOARD,) + PCIE_ORDER


@dataclass(frozen=True)
class Link:
    """One link: its kind and, for NVLink, the number of bonded links and, when a backend
    measured it (NVML, NCCL XML), the PCIe level between the two GPUs beneath the NVLink
    (``nvidia-smi topo -m`` hides it; :func:`gpu_topology.scoring.pcie_level` infers it)."""

    kind: LinkKind
    nvlinks: int = 0
    pcie: LinkKind | None = None

    def __post_init__(self) -> None:
        if (self.kind is LinkKind.NVLINK) != (self.nvlinks > 0):
            raise InvalidTopology(f"an NVLink needs a positive link count, got {self!r}")
        if self.pcie is not None and (self.kind is not LinkKind.NVLINK or self.pcie not in PCIE_LEVELS):
            raise InvalidTopology(f"only an NVLink carries a PCIe level beneath it, got {self!r}")

    @classmethod
    def parse(cls, text: str) -> Link:
        """Read one cell of ``nvidia-smi topo -m`` (``NV12``, ``PIX``, ``SOC`` ...)."""
        token = text.strip().upper()
        match = _NVLINK.match(token)
        if match:
            return cls(LinkKind.NVLINK, int(match.group(1)))
        if token in _ALIASES:
            return cls(_ALIASES[token])
        try:
            return cls(LinkKind(token))
        except ValueError:
            raise ParseError(
                f"unknown link type {text!r}",
                hint="expected X, NV<n>, PIX, PXB, PHB, NODE, SYS or BOARD",
            ) from None

    @property
    def is_nvlink(self) -> bool:
        return self.kind is LinkKind.NVLINK

    def __str__(self) -> str:
        if self.kind is LinkKind.NVLINK:
            return f"NV{self.nvlinks}"
        return str(self.kind.value)


_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_bus_id(text: str) -> str:
    """A PCI address as sysfs spells it (``0000:07:00.0``), whatever the tool printed.

    ``nvidia-smi`` prints an 8-digit domain (``00000000:07:00.0``) in upper case.
    """
    match = _BUS_ID.match(text.strip())
    if not match:
        raise ParseError(f"not a PCI bus id: {text!r}", hint="expected e.g. 0000:07:00.0")
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def gpu_name(index: int) -> str:
    """The device name ``nvidia-smi`` prints for GPU ``index``."""
    return f"GPU{index}"


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver numbers it."""

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    # Every NUMA node the driver lists for the GPU when it lists several (POWER9 lists
    # CPU and GPU-memory nodes); numa_node is set only when the answer is one node.
    numa_affinity: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return gpu_name(self.index)

    @property
    def locality(self) -> str | None:
        """What places the GPU on a NUMA node: its node or, failing that, its CPU list."""
        if self.numa_node is not None:
            return f"numa:{self.numa_node}"
        if self.cpu_affinity:
            return f"cpus:{self.cpu_affinity}"
        return None


@dataclass(frozen=True)
class Nic:
    """One RDMA device (``mlx5_0``) and what is known of its port and addresses."""

    name: str
    netdev: str | None = None
    numa_node: int | None = None
    link_layer: str | None = None  # "InfiniBand" or "Ethernet"
    state: str | None = None  # port state, e.g. "ACTIVE", "DOWN"
    addresses: tuple[str, ...] = ()  # "10.1.0.5/24"
    subnets: tuple[str, ...] = ()  # "10.1.0.0/24"
    pci_bus_id: str | None = None

    @property
    def usable(self) -> bool:
        """False only when the port is known not to be up."""
        return self.state is None or self.state.upper() == "ACTIVE"


def subnets_of(addresses: Iterable[str]) -> tuple[str, ...]:
    """The networks of ``addresses`` (CIDR strings), without link-local ones, in order."""
    found: list[str] = []
    for text in addresses:
        try:
            iface = ipaddress.ip_interface(text)
        except ValueError as exc:
            raise ParseError(f"not an address with prefix length: {text!r}") from exc
        if iface.is_link_local:
            continue
        network = str(iface.network)
        if network not in found:
            found.append(network)
    return tuple(found)


_K = TypeVar("_K")
_V = TypeVar("_V")


class FrozenMap(Mapping[_K, _V], Generic[_K, _V]):
    """A read-only mapping that, unlike ``MappingProxyType``, pickles and deep-copies."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[_K, _V]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: _K) -> _V:
        return self._data[key]

    def __iter__(self) -> Iterator[_K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)


LinkTable = Mapping[str, Mapping[str, Link]]


@dataclass(frozen=True)
class Topology:
    """GPUs, NICs and the link between every pair of devices that has one.

    ``links`` is keyed by device name (``GPU0``, ``mlx5_0``) both ways; the constructor
    fills in the reverse direction and rejects contradictions and unknown names.
    """

    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    links: LinkTable = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(sorted(self.gpus, key=lambda g: g.index)))
        object.__setattr__(self, "nics", tuple(self.nics))
        names = [g.name for g in self.gpus] + [n.name for n in self.nics]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidTopology(f"duplicate devices: {', '.join(duplicates)}")
        object.__setattr__(self, "links", _symmetric(self.links, set(names)))

    # -- lookups ---------------------------------------------------------------------
    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gpus) + tuple(n.name for n in self.nics)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise UnknownDevice(f"no GPU {index} in this topology", gpus=self.gpu_indices)

    def nic(self, name: str) -> Nic:
        for nic in self.nics:
            if nic.name == name:
                return nic
        raise UnknownDevice(f"no NIC {name!r} in this topology")

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    def link(self, a: str, b: str) -> Link | None:
        """The link between two devices by name, or None when unknown."""
        return self.links.get(a, {}).get(b)


def _symmetric(links: LinkTable, known: set[str]) -> LinkTable:
    table: dict[str, dict[str, Link]] = {}
    for a, row in links.items():
        for b, link in row.items():
            for name in (a, b):
                if name not in known:
                    raise UnknownDevice(f"link names unknown device {name!r}")
            if a == b:
                continue
            for x, y in ((a, b), (b, a)):
                previous = table.setdefault(x, {}).get(y)
                if previous is not None and previous != link:
                    raise InvalidTopology(f"contradictory links between {a} and {b}: {previous} and {link}")
                table[x][y] = link
    return FrozenMap({k: FrozenMap(v) for k, v in table.items()})
