"""GPU-NIC affinity and RoCE affinity classes (the GPU-RoCE allocation design).

Pure functions of a :class:`~gpu_topology.model.Topology`, called by the JSON contract,
by ``dsctl topo`` and by the scheduler extender's RoCE plugin.

Rules:

* A GPU's **nearest NICs** are the usable RDMA NICs at its closest PCIe level among PIX,
  PXB, PHB and NODE; a NIC reachable only across the CPU interconnect (SYS) is never
  affine, so such a GPU has none.
* NICs that share a nearest GPU form one **group** (a GPU with two equally near NICs
  ties them together, as on a DGX A100 where each GPU pair has two NICs at PXB).
* When the affine NICs sit on **different NUMA nodes**, every group becomes its own
  class (one class per NIC when each GPU has one nearest NIC); GPUs with no affine NIC
  belong to no class. Otherwise the node has **one class** holding every GPU.
* Classes are ordered by their lowest GPU index and named ``<prefix>1``, ``<prefix>2``...

A NIC's NUMA node is its own when known; otherwise it is inferred from the GPUs it is
affine to (a non-SYS link never leaves a NUMA node), then from the NICs it shares a
PCIe/host-bridge domain with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpu_topology.errors import InvalidTopology
from gpu_topology.model import Gpu, LinkKind, Nic, Topology, gpu_name

AFFINE_LEVELS = (LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE)
DEFAULT_PREFIX = "gpu-roce"
_PREFIX = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9_-])?$")


@dataclass(frozen=True)
class RoceClass:
    """One GPU resource class: GPUs that share affine RDMA NICs (and so subnets)."""

    name: str  # <prefix><n>, numbered by lowest GPU
    nics: tuple[str, ...]  # in topology order
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


def nic_numa_node(topology: Topology, nic: Nic) -> int | None:
    """The NIC's NUMA node, or the one shared by every GPU within non-SYS reach."""
    if nic.numa_node is not None:
        return nic.numa_node
    nodes = {g.numa_node for g in _gpus_near(topology, nic)}
    return nodes.pop() if len(nodes) == 1 and None not in nodes else None


def roce_classes(topology: Topology, prefix: str = DEFAULT_PREFIX) -> tuple[RoceClass, ...]:
    """The node's RoCE affinity classes (see the module docstring for the rules)."""
    if not _PREFIX.match(prefix):
        raise InvalidTopology(
            f"invalid resource class prefix {prefix!r}",
            hint="use letters, digits, '.', '-', '_' and '/' such as 'example.com/gpu-roce'",
        )
    nearest = nearest_nic_map(topology)
    groups = _nic_groups(nearest)
    if not groups:
        return ()
    affine = [name for nics, _ in groups for name in nics]
    if len({_place(topology, topology.nic(n)) for n in affine}) > 1:
        members = [(nics, gpus) for nics, gpus in groups]
    else:
        ordered = tuple(n.name for n in topology.nics if n.name in set(affine))
        members = [(ordered, topology.gpu_indices)]
    members.sort(key=lambda m: min(m[1]) if m[1] else -1)
    return tuple(
        _make_class(topology, f"{prefix}{i}", nics, gpus)
        for i, (nics, gpus) in enumerate(members, start=1)
    )


def _nic_groups(nearest: dict[int, tuple[str, ...]]) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """Connected groups of NICs sharing a nearest GPU, each with its GPUs."""
    groups: list[tuple[set[str], set[int]]] = []
    for gpu, nics in sorted(nearest.items()):
        if not nics:
            continue
        touching = [g for g in groups if g[0] & set(nics)]
        merged = (set(nics), {gpu})
        for group in touching:
            merged[0].update(group[0])
            merged[1].update(group[1])
            groups.remove(group)
        groups.append(merged)
    order = {name: i for i, name in enumerate(n for nics in nearest.values() for n in nics)}
    return [
        (tuple(sorted(nics, key=lambda n: (order[n], n))), tuple(sorted(gpus)))
        for nics, gpus in groups
    ]


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


def _make_class(topology: Topology, name: str, nics: tuple[str, ...], gpus: tuple[int, ...]) -> RoceClass:
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
    return RoceClass(name=name, nics=nics, numa_node=node, subnets=tuple(subnets), gpus=gpus)
