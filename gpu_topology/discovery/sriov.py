"""SR-IOV virtual functions of the node's RDMA NICs, read from sysfs with an injectable root.

Who calls it: the node agent's device plugin (``dsagent.nodeplugins``), which hands one VF of
a RoCE class's NIC to each container and may create the VFs (docs/design.md#roce-allocation).
What it owns: the reading of the kernel's SR-IOV and RDMA layout, and the one write the
kernel offers for it, :func:`set_numvfs` (``sriov_numvfs``); nothing else (no allocation, no
I/O outside ``root``). Like :mod:`gpu_topology.discovery.sysfs`, ``root`` is ``/`` on a node
and a temporary tree in tests (:class:`gpu_topology.testing.SysfsTree` builds one).

The layout read, for each physical function (PF) ``sys/class/infiniband/<pf>/device``:

* ``sriov_numvfs`` / ``sriov_totalvfs``: VFs enabled / possible (absent: no SR-IOV);
* ``virtfn<N>`` -> the VF's PCI function; under it ``infiniband/<rdma dev>``, its
  ``infiniband_verbs/uverbs<M>`` (the character device ``/dev/infiniband/uverbs<M>``)
  and ``net/<netdev>``;
* ``sys/class/infiniband/<vf dev>/ports/1/gid_attrs/types/<i>`` (``RoCE v2``,
  ``IB/RoCE v1``) and ``ports/1/gids/<i>``: the GID index NCCL should use is the lowest
  RoCE v2 entry holding an IPv4-mapped GID (``::ffff:a.b.c.d``), else the lowest RoCE v2
  entry with a non-zero GID, else None (NCCL then picks its own). Unpopulated entries
  raise EINVAL on a real kernel and read as absent here.

``dev/infiniband/rdma_cm`` (one node for the whole host) is listed with each VF's device
nodes when it exists under ``root``. A VF whose RDMA driver is not bound has no RDMA
device and no verbs node: it is listed with ``rdma_device=None`` and is never usable.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpu_topology.errors import DiscoveryError

ROCE_V2 = "roce v2"
_VIRTFN = re.compile(r"^virtfn(\d+)$")


@dataclass(frozen=True)
class VirtualFunction:
    """One SR-IOV VF of an RDMA NIC, with what a container needs to use it."""

    pf: str  # the PF's RDMA device, e.g. mlx5_0
    index: int  # N of virtfn<N>
    pci_bus_id: str  # e.g. 0000:0c:00.2
    rdma_device: str | None  # e.g. mlx5_10; None while no RDMA driver is bound
    netdev: str | None
    device_nodes: tuple[str, ...]  # host paths: /dev/infiniband/uverbs<M> [, /dev/infiniband/rdma_cm]
    gid_index: int | None

    @property
    def usable(self) -> bool:
        return self.rdma_device is not None and any("uverbs" in node for node in self.device_nodes)


@dataclass(frozen=True)
class PhysicalFunction:
    """One RDMA NIC with SR-IOV, and its enabled VFs in ``virtfn`` order."""

    rdma_device: str
    pci_bus_id: str | None
    netdev: str | None
    numvfs: int
    totalvfs: int | None
    vfs: tuple[VirtualFunction, ...]


def discover_vfs(root: str | os.PathLike[str] = "/") -> dict[str, PhysicalFunction]:
    """PF RDMA device name -> its VFs, for every RDMA NIC under ``root`` with SR-IOV.

    A NIC that is itself a VF (it has ``physfn``) is not a PF. Raises
    :class:`~gpu_topology.errors.DiscoveryError` when sysfs cannot be read.
    """
    base = Path(root)
    ib_class = base / "sys/class/infiniband"
    found: dict[str, PhysicalFunction] = {}
    try:
        names = sorted(p.name for p in ib_class.iterdir()) if ib_class.is_dir() else []
        rdma_cm = base / "dev/infiniband/rdma_cm"
        shared = ("/dev/infiniband/rdma_cm",) if rdma_cm.exists() else ()
        for name in names:
            device = ib_class / name / "device"
            if (device / "physfn").exists() or _read(device / "sriov_numvfs") is None:
                continue
            vfs = []
            for link in sorted(device.iterdir(), key=_virtfn_order):
                match = _VIRTFN.match(link.name)
                if match:
                    vfs.append(_vf(base, name, int(match.group(1)), link, shared))
            found[name] = PhysicalFunction(
                rdma_device=name,
                pci_bus_id=device.resolve().name if device.exists() else None,
                netdev=_first(device / "net"),
                numvfs=_int(_read(device / "sriov_numvfs")) or 0,
                totalvfs=_int(_read(device / "sriov_totalvfs")),
                vfs=tuple(vfs),
            )
    except OSError as exc:
        raise DiscoveryError(f"reading SR-IOV state under {base} failed: {exc}") from exc
    return found


def set_numvfs(root: str | os.PathLike[str], pf: str, count: int) -> bool:
    """Enable ``count`` VFs on RDMA NIC ``pf`` by writing its ``sriov_numvfs``; True when written.

    Nothing is written when ``count`` VFs are already enabled (the kernel would destroy
    and recreate them, and with them every VF a running container holds). A different
    non-zero count is reached through 0, as the kernel requires (it refuses a change
    between two non-zero counts with EBUSY). Raises :class:`DiscoveryError` for a NIC
    without SR-IOV, a count above ``sriov_totalvfs`` or a refused write.
    """
    device = Path(root) / "sys/class/infiniband" / pf / "device"
    numvfs = device / "sriov_numvfs"
    current = _int(_read(numvfs))
    if current is None or (device / "physfn").exists():
        raise DiscoveryError(f"{pf} has no SR-IOV (no readable {numvfs})")
    total = _int(_read(device / "sriov_totalvfs"))
    if count < 0 or (total is not None and count > total):
        raise DiscoveryError(f"{pf}: {count} VFs asked, the NIC offers 0..{total}")
    if current == count:
        return False
    try:
        if current and count:
            numvfs.write_text("0", encoding="ascii")
        numvfs.write_text(str(count), encoding="ascii")
    except OSError as exc:
        raise DiscoveryError(f"enabling {count} VFs on {pf} failed: {exc}") from exc
    return True


def gid_index(port: Path) -> int | None:
    """The GID index NCCL should use on ``ports/<n>`` (see the module docstring)."""
    types = port / "gid_attrs" / "types"
    if not types.is_dir():
        return None
    candidates: list[tuple[int, int]] = []  # (0 for IPv4-mapped, 1 otherwise), index
    for entry in types.iterdir():
        if not entry.name.isdigit():
            continue
        kind = _read(entry)
        if kind is None or kind.strip().lower() != ROCE_V2:
            continue
        gid = _read(port / "gids" / entry.name)
        address = _gid_address(gid)
        if address is None or address.is_unspecified:
            continue
        mapped = address.ipv4_mapped is not None
        candidates.append((0 if mapped else 1, int(entry.name)))
    return min(candidates)[1] if candidates else None


def _vf(base: Path, pf: str, index: int, link: Path, shared: tuple[str, ...]) -> VirtualFunction:
    vf_dir = link.resolve()
    rdma = _first(link / "infiniband")
    verbs = _first(link / "infiniband_verbs")
    nodes = ((f"/dev/infiniband/{verbs}",) if verbs else ()) + shared
    gid = gid_index(base / "sys/class/infiniband" / rdma / "ports" / "1") if rdma else None
    return VirtualFunction(
        pf=pf,
        index=index,
        pci_bus_id=vf_dir.name,
        rdma_device=rdma,
        netdev=_first(link / "net"),
        device_nodes=nodes if verbs else (),
        gid_index=gid,
    )


def _gid_address(text: str | None) -> ipaddress.IPv6Address | None:
    if not text:
        return None
    try:
        return ipaddress.IPv6Address(text.strip())
    except ValueError:
        return None


def _virtfn_order(path: Path) -> tuple[int, str]:
    match = _VIRTFN.match(path.name)
    return (int(match.group(1)) if match else -1, path.name)


def _first(directory: Path) -> str | None:
    if not directory.is_dir():
        return None
    names = sorted(p.name for p in directory.iterdir())
    return names[0] if names else None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError:  # EINVAL from an unpopulated GID entry on a real kernel
        return None
    return text or None


__all__ = ["PhysicalFunction", "VirtualFunction", "discover_vfs", "gid_index", "set_numvfs"]
