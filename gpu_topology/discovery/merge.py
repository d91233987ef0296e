"""Merging what two backends saw of one machine into one topology.

Called by :func:`gpu_topology.discovery.discover`. The first topology wins every value
both know; the second fills what the first lacks. GPUs are matched by PCI bus id when
both sides know it, else by index; NICs by name. Links the first lacks are taken from
the second (so sysfs's PCIe levels complete an NVML view, never override it), and an
NVLink the first saw without the PCIe level beneath it takes the second's measured level.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TypeVar

from gpu_topology.model import Gpu, Link, Nic, Topology, gpu_name

_T = TypeVar("_T", Gpu, Nic)


def merge(first: Topology, second: Topology) -> Topology:
    """``first`` completed by ``second`` (see the module docstring)."""
    gpu_map = _match_gpus(first, second)
    gpus = [_fill(g, second.gpu(gpu_map[g.index])) if g.index in gpu_map else g for g in first.gpus]
    if not first.gpus:
        gpus = list(second.gpus)
        gpu_map = {g.index: g.index for g in second.gpus}
    second_nics = {n.name: n for n in second.nics}
    nics = [_fill(n, second_nics[n.name]) if n.name in second_nics else n for n in first.nics]
    nics += [n for n in second.nics if n.name not in {x.name for x in first.nics}]
    rename = {gpu_name(theirs): gpu_name(ours) for ours, theirs in gpu_map.items()}
    rename.update({n.name: n.name for n in second.nics})
    links: dict[str, dict[str, Link]] = {a: dict(row) for a, row in first.links.items()}
    for a, row in second.links.items():
        for b, link in row.items():
            if a in rename and b in rename:
                for x, y in ((rename[a], rename[b]), (rename[b], rename[a])):
                    ours = links.setdefault(x, {}).setdefault(y, link)
                    if ours.kind is link.kind and ours.nvlinks == link.nvlinks and ours.pcie is None:
                        links[x][y] = link  # the same NVLink with its PCIe level measured
    return Topology(gpus=tuple(gpus), nics=tuple(nics), links=links)


def _match_gpus(first: Topology, second: Topology) -> dict[int, int]:
    """first index -> second index."""
    by_bus = {g.pci_bus_id: g.index for g in second.gpus if g.pci_bus_id}
    indices = set(second.gpu_indices)
    found: dict[int, int] = {}
    for gpu in first.gpus:
        if gpu.pci_bus_id and by_bus:
            if gpu.pci_bus_id in by_bus:
                found[gpu.index] = by_bus[gpu.pci_bus_id]
        elif gpu.index in indices:
            found[gpu.index] = gpu.index
    return found


def _fill(ours: _T, theirs: _T) -> _T:
    """``ours`` with every empty field (None or ()) taken from ``theirs``."""
    changes = {}
    for f in fields(ours):
        if f.name in ("index", "name"):
            continue
        if getattr(ours, f.name) in (None, ()) and getattr(theirs, f.name) not in (None, ()):
            changes[f.name] = getattr(theirs, f.name)
    return replace(ours, **changes)
