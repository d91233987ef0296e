"""Discovery from an NCCL topology dump (``NCCL_TOPO_DUMP_FILE`` / ``NCCL_TOPO_FILE`` XML).

The XML nests ``<cpu numaid affinity>`` > ``<pci busid class>`` (PCIe switches and
bridges) > ``<pci>`` endpoints holding ``<gpu dev>`` (with ``<nvlink target count>``
children) or ``<nic>`` (with one ``<net name>`` per port). Links are derived the way
NCCL derives its paths, in ``nvidia-smi``'s words:

* GPU-GPU over NVLink: the bonded link count when one GPU's ``nvlink`` targets the
  other; through NVSwitches (targets of class 0x068000, or in dumps without ``tclass``
  any target that is not a GPU) the smaller of the two GPUs' switch link totals (an
  H100 with 18 switch links is NV18 to its peers). The NVLink keeps the two GPUs' PCIe
  level (below) as the level beneath it, which go-gpuallocator's pair score adds.
* Otherwise by PCIe position, decided by :func:`gpu_topology.pcie.pcie_level` (the rule
  sysfs discovery shares): each ``<pci>`` bridge element enclosing a device is one PCIe
  switch (NCCL writes a switch's upstream port and skips its downstream ports), and the
  ``<cpu>`` is the root. NCCL merges a CPU's host bridges into its ``<cpu>``, so devices
  under different host bridges of one CPU come out PHB, never NODE; different CPUs are
  SYS.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpu_topology.discovery.base import Backend
from gpu_topology.errors import BackendUnavailable, ParseError
from gpu_topology.model import (
    Gpu,
    Link,
    LinkKind,
    Nic,
    Topology,
    gpu_name,
    normalize_bus_id,
)
from gpu_topology.pcie import PciePlace, pcie_level, slot_of

NVSWITCH_CLASS = "0x068000"


@dataclass
class _Device:
    name: str
    place: PciePlace
    busid: str | None
    nvlinks: dict[str, int] = field(default_factory=dict)  # target busid -> links
    switch_links: int = 0
    unclassed: dict[str, int] = field(default_factory=dict)  # targets without a tclass


def parse_nccl_xml(text: str) -> Topology:
    """Read an NCCL topology XML dump into a :class:`Topology`."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ParseError(f"NCCL topology XML is not well-formed: {exc}") from exc
    if root.tag != "system":
        raise ParseError(f"NCCL topology XML must start with <system>, not <{root.tag}>")
    cpus = root.findall("cpu")
    if not cpus:
        raise ParseError("NCCL topology XML has no <cpu> element")
    gpus: list[tuple[Gpu, _Device]] = []
    nics: list[tuple[int, Nic, _Device]] = []
    for position, cpu in enumerate(cpus):
        numa = _int(cpu.get("numaid"), "numaid")
        # One <cpu> per NUMA node: its position stands for the node when numaid is missing.
        node = numa if numa is not None else position
        cpu_place = PciePlace(numa_node=node, root=f"cpu{node}")
        affinity = _mask_to_list(cpu.get("affinity"))
        _walk(cpu, cpu_place, None, numa, affinity, gpus, nics)
    if not gpus:
        raise ParseError("NCCL topology XML lists no <gpu>")
    nics.sort(key=lambda item: item[0])
    _classify_untyped_targets([d for _, d in gpus])
    devices = [d for _, d in gpus] + [d for _, _, d in nics]
    bus_to_gpu = {d.busid: d.name for _, d in gpus if d.busid}
    links: dict[str, dict[str, Link]] = {}
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            links.setdefault(a.name, {})[b.name] = _link(a, b, bus_to_gpu)
    return Topology(
        gpus=tuple(g for g, _ in gpus),
        nics=tuple(n for _, n, _ in nics),
        links=links,
    )


def _walk(
    element: ET.Element,
    place: PciePlace,
    busid: str | None,
    numa: int | None,
    affinity: str | None,
    gpus: list[tuple[Gpu, _Device]],
    nics: list[tuple[int, Nic, _Device]],
) -> None:
    for child in element:
        if child.tag == "pci":
            bus = _bus(child.get("busid"))
            inner = place if busid is None else replace(place, switches=place.switches + (busid,))
            _walk(child, inner, bus, numa, affinity, gpus, nics)
        elif child.tag == "gpu":
            gpus.append(_gpu(child, len(gpus), _endpoint(place, busid), busid, numa, affinity))
        elif child.tag == "nic":
            for net in child.findall("net"):
                nics.append(_nic(net, len(nics), _endpoint(place, busid), busid, numa, nics))


def _endpoint(place: PciePlace, busid: str | None) -> PciePlace:
    """The place of the device on the ``<pci>`` endpoint ``busid`` (not a bridge on its path)."""
    return replace(place, slot=slot_of(busid))


def _gpu(
    element: ET.Element, position: int, place: PciePlace, busid: str | None, numa: int | None, affinity: str | None
) -> tuple[Gpu, _Device]:
    index = _int(element.get("dev"), "gpu dev")
    index = position if index is None else index
    device = _Device(name=gpu_name(index), place=place, busid=busid)
    for link in element.findall("nvlink"):
        count = _int(link.get("count"), "nvlink count") or 1
        target = _bus(link.get("target"))
        tclass = link.get("tclass", "").lower()
        if tclass == NVSWITCH_CLASS:
            device.switch_links += count
        elif target and not tclass:
            device.unclassed[target] = device.unclassed.get(target, 0) + count
        elif target:
            device.nvlinks[target] = device.nvlinks.get(target, 0) + count
    gpu = Gpu(index=index, pci_bus_id=busid, numa_node=numa, cpu_affinity=affinity)
    return gpu, device


def _nic(
    net: ET.Element,
    position: int,
    place: PciePlace,
    busid: str | None,
    numa: int | None,
    earlier: list[tuple[int, Nic, _Device]],
) -> tuple[int, Nic, _Device]:
    name = net.get("name")
    if not name:
        raise ParseError("an NCCL <net> element has no name")
    if any(n.name == name for _, n, _ in earlier):
        name = f"{name}:{net.get('port', position)}"  # a second port of one device
    order = _int(net.get("dev"), "net dev")
    nic = Nic(name=name, numa_node=numa, pci_bus_id=busid)
    return (position if order is None else order), nic, _Device(name=name, place=place, busid=busid)


def _classify_untyped_targets(gpus: list[_Device]) -> None:
    """Older dumps give no tclass: a target that is another GPU is a direct link, any
    other target (there is no CPU NVLink on x86) is taken for an NVSwitch."""
    buses = {d.busid for d in gpus if d.busid}
    for device in gpus:
        for target, count in device.unclassed.items():
            if target in buses:
                device.nvlinks[target] = device.nvlinks.get(target, 0) + count
            else:
                device.switch_links += count


def _link(a: _Device, b: _Device, bus_to_gpu: dict[str, str]) -> Link:
    both_gpus = a.name.startswith("GPU") and b.name.startswith("GPU") and a.busid in bus_to_gpu
    pcie = pcie_level(a.place, b.place)
    if both_gpus:
        direct = a.nvlinks.get(b.busid or "", 0) or b.nvlinks.get(a.busid or "", 0)
        if direct:
            return Link(LinkKind.NVLINK, direct, pcie=pcie)
        if a.switch_links and b.switch_links:
            return Link(LinkKind.NVLINK, min(a.switch_links, b.switch_links), pcie=pcie)
    return Link(pcie)


def _bus(text: str | None) -> str | None:
    return normalize_bus_id(text) if text else None


def _int(text: str | None, what: str) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text, 0)
    except ValueError:
        raise ParseError(f"NCCL topology XML: {what} is not a number: {text!r}") from None


def _mask_to_list(mask: str | None) -> str | None:
    """``0000ffff,ffffffff`` (most significant word first) -> ``0-47``."""
    if not mask:
        return None
    try:
        bits = int(mask.replace(",", ""), 16)
    except ValueError:
        raise ParseError(f"NCCL topology XML: cpu affinity is not a hex mask: {mask!r}") from None
    ranges: list[str] = []
    cpu, start = 0, None
    while bits or start is not None:
        on = bits & 1
        if on and start is None:
            start = cpu
        if not on and start is not None:
            ranges.append(str(start) if start == cpu - 1 else f"{start}-{cpu - 1}")
            start = None
        bits >>= 1
        cpu += 1
    return ",".join(ranges) or None


class NcclXmlBackend(Backend):
    """Reads an NCCL topology XML file (``path=`` or the NCCL_TOPO_FILE variable)."""

    name = "nccl-xml"
    install_hint = "run one NCCL job with NCCL_TOPO_DUMP_FILE=/path/topo.xml and pass that file"

    def __init__(self, *, path: str | os.PathLike[str] | None = None) -> None:
        chosen = path if path is not None else os.environ.get("NCCL_TOPO_FILE")
        self.path = Path(chosen) if chosen else None

    def unavailable_reason(self) -> str | None:
        if self.path is None:
            return "no NCCL topology file given and NCCL_TOPO_FILE is not set"
        if not self.path.is_file():
            return f"{self.path} is not a file"
        return None

    def discover(self) -> Topology:
        self.require()
        assert self.path is not None
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise BackendUnavailable(f"cannot read {self.path}: {exc}", hint=self.install_hint) from exc
        return parse_nccl_xml(text)
