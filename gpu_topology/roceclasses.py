"""GPU-NIC affinity and RoCE GPU resource classes (the GPU-RoCE allocation design).

Pure functions of a :class:`~gpu_topology.model.Topology`, called by the JSON contract,
by ``dsctl topo``, by the node agent (and its device plugin) and by the scheduler
extender. Design: ``docs/design.md#roce-classes``.

Rules:

* A GPU's **nearest NICs** are the usable RDMA NICs at its closest PCIe level among PIX,
  PXB, PHB and NODE; a NIC reachable only across the CPU interconnect (SYS) is never
  affine, so such a GPU has none. A NIC nearest to some GPU is **GPU-affine**.
* The GPU-affine NICs are grouped by the class **mode** (an operator's choice):

  - ``numa`` (default, the design's rule): by NUMA node. Classes exist only when the
    affine NICs sit in **different NUMA groups**: then there is one class per group,
    holding the GPUs whose nearest NICs are in it (GPUs with no affine NIC are in no
    class). When they share one NUMA group the node has one class of every GPU.
  - ``subnet``: by the NICs' IP subnets (NICs sharing a subnet are one group), one class
    per subnet, for clusters whose NIC subnets do not follow the NUMA groups. Every
    affine NIC must know its subnet.
  - ``none``: one class of every GPU with every affine NIC.

  A GPU whose nearest NICs fall into two groups ties those groups into one.
* ``numa`` and ``none`` classes are ordered by their lowest GPU index, ``subnet`` classes
  by their lowest subnet (so nodes on the same subnets agree on names whatever their
  wiring), and named ``<prefix>1``, ``<prefix>2``, ...
* No GPU-affine NIC, no class.

A NIC's NUMA node is its own when known; otherwise it is inferred from the GPUs it is
affine to (a non-SYS link never leaves a NUMA node), then from the GPUs' CPU lists, then
from the NICs it shares a PCIe/host-bridge domain with.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from dsplatform.gpus import CLASS_STEM
from dsplatform.names import is_qualified_name
from gpu_topology.errors import InvalidTopology
from gpu_topology.model import Gpu, LinkKind, Nic, Topology, gpu_name

AFFINE_LEVELS = (LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE)
DEFAULT_PREFIX = CLASS_STEM  # classes gpu-roce1, gpu-roce2, ...


class ClassMode(str, enum.Enum):
    """How GPU-affine NICs are grouped into classes (``DSAGENT_ROCE_CLASSES``)."""

    NUMA = "numa"
    SUBNET = "subnet"
    NONE = "none"

    @classmethod
    def parse(cls, value: ClassMode | str) -> ClassMode:
        """``"numa"``, ``"subnet"`` or ``"none"`` (any case) -> the mode."""
        if isinstance(value, ClassMode):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise InvalidTopology(
                f"unknown RoCE class mode {value!r}",
                hint="use numa (one class per NUMA group of the RoCE NICs), subnet or none",
            ) from None

    def __str__(self) -> str:
        return self.value


DEFAULT_MODE = ClassMode.NUMA


@dataclass(frozen=True)
class RoceClass:
    """One GPU resource class: GPUs whose RoCE NICs sit in one group (one subnet)."""

    name: str  # <prefix><n>, e.g. gpu-roce1
    nics: tuple[str, ...]  # its GPU-affine NICs, in topology order
    numa_node: int | None  # its NICs' one NUMA node, else its GPUs', else None
    subnets: tuple[str, ...]  # of its NICs, in order, without duplicates
    gpus: tuple[int, ...]


def nearest_nics(topology: Topology, gpu: int) -> tuple[str, ...]:
    """The usable NICs at GPU ``gpu``'s closest non-SYS level, in topology order."""
    topology.gpu(gpu)
    by_level: dict[LinkKind, list[str]] = {}
    for nic in topology.nics:
        link = topology.link(gpu_name(gpu), nic.name)
        if nic.usable and link is not None and link.kind in AFFINE_LEVELS:
            by_level.setdefault(link.kind, []).append(nic.name)
    for level in AFFINE_LEVELS:
        if level in by_level:
            return tuple(by_level[level])
    return ()


def nearest_nic_map(topology: Topology) -> dict[int, tuple[str, ...]]:
    """``nearest_nics`` for every GPU."""
    return {gpu.index: nearest_nics(topology, gpu.index) for gpu in topology.gpus}


def transfer_nics(topology: Topology, gpus: Iterable[int] | None = None) -> tuple[Nic, ...]:
    """The NICs a node's own transfers may spread over, nearest first: the usable NICs with a
    non-SYS link (PIX, PXB, PHB, NODE) to any of ``gpus`` (every GPU of the node when None),
    ordered by their closest link to one of those GPUs (:func:`transfer_level`): the same
    PCIe switch (PIX, then PXB: several switches, no host bridge) first, then the same host
    bridge (PHB), then the same NUMA node (NODE), topology order among equals. With no GPU
    known: every usable Ethernet (RoCE) NIC, in topology order."""
    wanted = topology.gpu_indices if gpus is None else tuple(gpus)
    for index in wanted:
        topology.gpu(index)
    if not wanted:
        return tuple(n for n in topology.nics if n.usable and (n.link_layer or "").lower() == "ethernet")
    ranked = [
        (AFFINE_LEVELS.index(level), position, nic)
        for position, nic in enumerate(topology.nics)
        if nic.usable and (level := transfer_level(topology, nic, wanted)) is not None
    ]
    return tuple(nic for _, _, nic in sorted(ranked, key=lambda r: r[:2]))


def transfer_level(topology: Topology, nic: Nic, gpus: Iterable[int] | None = None) -> LinkKind | None:
    """The closest PCIe level (PIX, PXB, PHB, NODE) between ``nic`` and any of ``gpus``
    (every GPU of the node when None); None where every path is SYS or unknown."""
    wanted = topology.gpu_indices if gpus is None else tuple(gpus)
    found = [
        link.kind
        for i in wanted
        if (link := topology.link(gpu_name(i), nic.name)) is not None and link.kind in AFFINE_LEVELS
    ]
    return min(found, key=AFFINE_LEVELS.index) if found else None


def roce_subnets(topology: Topology) -> frozenset[str]:
    """The subnets of the node's GPU-affine RoCE NICs that are up: two nodes that share one
    reach each other over RoCE (the stripe group's choice and the extender's peer credit,
    docs/design-striping.md). Empty when no such NIC has a known subnet."""
    affine = {name for nics in nearest_nic_map(topology).values() for name in nics}
    return frozenset(s for nic in topology.nics if nic.name in affine and nic.usable for s in nic.subnets)


def subnet_key(subnets: frozenset[str]) -> str | None:
    """One name for a node's set of RoCE subnets (nodes on the same rails share it); None: unknown."""
    return ",".join(sorted(subnets)) if subnets else None


def nic_numa_node(topology: Topology, nic: Nic) -> int | None:
    """The NIC's NUMA node, or the one shared by every GPU within non-SYS reach."""
    if nic.numa_node is not None:
        return nic.numa_node
    nodes = {g.numa_node for g in _gpus_near(topology, nic)}
    return nodes.pop() if len(nodes) == 1 and None not in nodes else None


def roce_classes(
    topology: Topology, prefix: str = DEFAULT_PREFIX, mode: ClassMode | str = DEFAULT_MODE
) -> tuple[RoceClass, ...]:
    """The node's RoCE GPU resource classes (see the module docstring for the rules).

    ``prefix`` names them (``<prefix>1``, ...); ``mode`` is ``numa``, ``subnet`` or
    ``none``. Raises :class:`InvalidTopology` for a bad prefix or mode, and in ``subnet``
    mode when a GPU-affine NIC's subnet is unknown.
    """
    # a class's name, <prefix><N>, is (part of) a resource name: Kubernetes' qualified-name
    # rule (dsplatform.names), with a stem of its own after any domain
    if not isinstance(prefix, str) or not prefix.rpartition("/")[2] or not is_qualified_name(f"{prefix}1"):
        raise InvalidTopology(
            f"invalid resource class prefix {prefix!r}",
            hint="use letters, digits, '.', '-', '_' and '/' such as 'example.com/gpu-roce'",
        )
    mode = ClassMode.parse(mode)
    nearest = nearest_nic_map(topology)
    affine = [n.name for n in topology.nics if any(n.name in nics for nics in nearest.values())]
    if not affine:
        return ()
    keys = {name: _group_keys(topology, topology.nic(name), mode) for name in affine}
    groups = _Groups()
    for name in affine:
        groups.join(keys[name])
    for nics in nearest.values():
        groups.join(k for n in nics for k in keys[n])
    roots = {name: groups.find(next(iter(keys[name]))) for name in affine}
    distinct = list(dict.fromkeys(roots.values()))
    if len(distinct) == 1:
        members = [(tuple(affine), topology.gpu_indices)]
    else:
        members = []
        for root in distinct:
            nics = tuple(n for n in affine if roots[n] == root)
            gpus = tuple(g for g, near in sorted(nearest.items()) if near and roots[near[0]] == root)
            members.append((nics, gpus))
    made = [_make_class(topology, nics, gpus) for nics, gpus in members]
    if mode is ClassMode.SUBNET:
        made.sort(key=lambda c: min(_network_order(s) for s in c.subnets))
    else:
        made.sort(key=lambda c: min(c.gpus) if c.gpus else -1)
    return tuple(
        RoceClass(name=f"{prefix}{i}", nics=c.nics, numa_node=c.numa_node, subnets=c.subnets, gpus=c.gpus)
        for i, c in enumerate(made, start=1)
    )


class _Groups:
    """Union-find over group keys."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def join(self, keys: Iterable[str]) -> None:
        roots = [self.find(k) for k in keys]
        for root in roots[1:]:
            self.parent[self.find(root)] = self.find(roots[0])


def _group_keys(topology: Topology, nic: Nic, mode: ClassMode) -> frozenset[str]:
    if mode is ClassMode.NONE:
        return frozenset({"node"})
    if mode is ClassMode.NUMA:
        return frozenset({_place(topology, nic)})
    if not nic.subnets:
        raise InvalidTopology(
            f"RoCE class mode subnet needs the subnet of every GPU-affine NIC; {nic.name} has none",
            hint="give the NICs their addresses before the agent starts, or use mode numa",
        )
    return frozenset(f"subnet:{s}" for s in nic.subnets)


def _network_order(subnet: str) -> tuple[int, int, str]:
    try:
        network = ipaddress.ip_network(subnet, strict=False)
    except ValueError:
        return (9, 0, subnet)
    return (network.version, int(network.network_address), subnet)


def _gpus_near(topology: Topology, nic: Nic) -> list[Gpu]:
    found: list[Gpu] = []
    for gpu in topology.gpus:
        link = topology.link(gpu.name, nic.name)
        if link is not None and link.kind in AFFINE_LEVELS:
            found.append(gpu)
    return found


def _place(topology: Topology, nic: Nic) -> str:
    """A key equal for NICs on one NUMA node, as far as the topology tells."""
    node = nic_numa_node(topology, nic)
    if node is not None:
        return f"numa:{node}"
    places = {g.locality for g in _gpus_near(topology, nic)}
    if len(places) == 1 and None not in places:
        return str(places.pop())
    return "domain:" + min(_pcie_domain(topology, nic))


def _pcie_domain(topology: Topology, nic: Nic) -> set[str]:
    """Names of the NICs reachable from ``nic`` over non-SYS NIC-NIC links."""
    seen, todo = {nic.name}, [nic.name]
    while todo:
        current = todo.pop()
        for other in topology.nics:
            link = topology.link(current, other.name)
            if other.name not in seen and link is not None and link.kind in AFFINE_LEVELS:
                seen.add(other.name)
                todo.append(other.name)
    return seen


def _make_class(topology: Topology, nics: tuple[str, ...], gpus: tuple[int, ...]) -> RoceClass:
    nic_nodes = {nic_numa_node(topology, topology.nic(n)) for n in nics}
    gpu_nodes = {topology.gpu(i).numa_node for i in gpus}
    node = None
    for nodes in (nic_nodes, gpu_nodes):
        if len(nodes) == 1 and None not in nodes:
            node = nodes.pop()
            break
    subnets: list[str] = []
    for n in nics:
        subnets.extend(s for s in topology.nic(n).subnets if s not in subnets)
    return RoceClass(name="", nics=nics, numa_node=node, subnets=tuple(subnets), gpus=gpus)
