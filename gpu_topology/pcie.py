"""The PCIe-distance rule: how far apart two devices sit in the PCIe tree, in ``nvidia-smi``'s words.

Pure: the discovery backends that read a PCI tree (``discovery/sysfs.py`` from the kernel's
device paths, ``discovery/nccl_xml.py`` from an NCCL topology dump) each turn what they read
into one :class:`PciePlace` per device and ask :func:`pcie_level` for every pair, so the
two can only disagree on what their source cannot see (an NCCL dump cannot tell a CPU's
host bridges apart). ``nvidia-smi topo -m`` defines the levels:

* **PIX**: the path crosses at most one PCIe switch (two functions of one device too);
* **PXB**: it crosses several switches but not the host bridge;
* **PHB**: it crosses a host bridge (the devices share only their host bridge);
* **NODE**: it crosses between host bridges of one NUMA node;
* **SYS**: it crosses between NUMA nodes.

A switch counts once: its upstream port and the downstream ports below it are one element,
named by the upstream port, as NCCL's dumps write it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpu_topology.model import LinkKind


@dataclass(frozen=True)
class PciePlace:
    """Where one device sits: what :func:`pcie_level` needs to know of it.

    ``root`` names the host bridge (root complex) above the device, None when the device
    hangs from none; a source that cannot tell host bridges apart names one root per CPU.
    ``switches`` are the PCIe switches above the device, outermost first, each named by its
    upstream port. ``slot`` is the device's bus id without its function, so that two
    functions of one card are known as such.
    """

    numa_node: int | None
    root: str | None
    switches: tuple[str, ...] = ()
    slot: str | None = None


def pcie_level(a: PciePlace, b: PciePlace) -> LinkKind:
    """The PCIe level between two devices (see the module docstring)."""
    if a.root is None or b.root is None or a.root != b.root:
        if a.numa_node is not None and b.numa_node is not None and a.numa_node != b.numa_node:
            return LinkKind.SYS
        return LinkKind.NODE
    if a.slot is not None and a.slot == b.slot:
        return LinkKind.PIX
    common = 0
    for x, y in zip(a.switches, b.switches):
        if x != y:
            break
        common += 1
    if common == 0:
        return LinkKind.PHB
    # The switch where the two paths meet, and every switch below it on either side.
    crossed = 1 + (len(a.switches) - common) + (len(b.switches) - common)
    return LinkKind.PIX if crossed <= 1 else LinkKind.PXB


def slot_of(bus_id: str | None) -> str | None:
    """``0000:1b:00.1`` -> ``0000:1b:00``: the card a PCI function belongs to."""
    if not bus_id or "." not in bus_id:
        return None
    return bus_id.rsplit(".", 1)[0]


def switches_in_device_path(parts: Sequence[str]) -> tuple[str, ...]:
    """The switches above a device, from its path below ``/sys/devices``.

    ``parts`` is host bridge first, device last, e.g. ``pci0000:17 / 0000:17:01.0 (root
    port) / 0000:18:00.0 (switch upstream) / 0000:19:00.0 (downstream) / 0000:1a:00.0``.
    Going up two levels at a time from the device, skipping each downstream port, lands on
    each switch's upstream port until the host bridge is reached; this is how NCCL walks
    sysfs to write its dumps, so both sources name the same switches.
    """
    found: list[str] = []
    index = len(parts) - 3
    while index >= 1:
        found.append(parts[index])
        index -= 2
    return tuple(reversed(found))
