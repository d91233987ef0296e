"""Builders for synthetic sysfs trees, shared by this package's tests and by users.

``SysfsTree(tmp_path)`` lays out the files :class:`~gpu_topology.discovery.sysfs.SysfsBackend`
reads, the way the kernel does: device directories nested under
``sys/devices/pci<domain>:<bus>/...`` by their PCIe path, with ``sys/bus/pci/devices``,
``sys/class/infiniband`` and ``sys/class/net`` entries as symlinks into them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

GPU_CLASS = "0x030200"
NIC_CLASS = "0x020700"  # InfiniBand controller; RoCE NICs show 0x020000
BRIDGE_CLASS = "0x060400"


class SysfsTree:
    """A synthetic sysfs under ``root`` (pass ``root`` to ``SysfsBackend``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        (self.root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
        (self.root / "sys/class/infiniband").mkdir(parents=True, exist_ok=True)
        (self.root / "sys/class/net").mkdir(parents=True, exist_ok=True)

    def pci(
        self,
        path: Sequence[str],
        *,
        vendor: str = "0x15b3",
        cls: str = BRIDGE_CLASS,
        numa_node: int = -1,
        cpulist: str | None = None,
    ) -> Path:
        """A PCI function at ``path`` (host bridge first, e.g. ``["pci0000:17", "0000:17:00.0"]``)."""
        directory = self.root / "sys/devices" / Path(*path)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "vendor").write_text(vendor + "\n")
        (directory / "class").write_text(cls + "\n")
        (directory / "numa_node").write_text(f"{numa_node}\n")
        if cpulist is not None:
            (directory / "local_cpulist").write_text(cpulist + "\n")
        self._link(self.root / "sys/bus/pci/devices" / path[-1], directory)
        return directory

    def gpu(self, path: Sequence[str], *, numa_node: int = -1, cpulist: str | None = None) -> Path:
        """An NVIDIA GPU at ``path``."""
        return self.pci(path, vendor="0x10de", cls=GPU_CLASS, numa_node=numa_node, cpulist=cpulist)

    def rdma(
        self,
        name: str,
        path: Sequence[str],
        *,
        numa_node: int = -1,
        netdev: str | None = None,
        link_layer: str = "Ethernet",
        state: str = "4: ACTIVE",
        ports: int = 1,
    ) -> Path:
        """An RDMA device ``name`` (``mlx5_0``) on the PCI function at ``path``."""
        device = self.pci(path, cls=NIC_CLASS if link_layer == "InfiniBand" else "0x020000", numa_node=numa_node)
        ib = self.root / "sys/class/infiniband" / name
        ib.mkdir(parents=True, exist_ok=True)
        self._link(ib / "device", device)
        for port in range(1, ports + 1):
            port_dir = ib / "ports" / str(port)
            port_dir.mkdir(parents=True, exist_ok=True)
            (port_dir / "link_layer").write_text(link_layer + "\n")
            (port_dir / "state").write_text(state + "\n")
        if netdev:
            net = device / "net" / netdev
            net.mkdir(parents=True, exist_ok=True)
            (net / "operstate").write_text("up\n" if "ACTIVE" in state else "down\n")
            self._link(self.root / "sys/class/net" / netdev, net)
        return device

    def vf(
        self,
        pf_device: Path,
        index: int,
        bus_id: str,
        *,
        rdma: str | None,
        uverbs: str | None = None,
        netdev: str | None = None,
        gids: Mapping[int, tuple[str, str]] | None = None,
        totalvfs: int = 8,
    ) -> Path:
        """SR-IOV VF ``index`` of the PF at ``pf_device`` (a path :meth:`rdma` returned).

        Lays out what the kernel shows: ``virtfn<index>`` on the PF and ``physfn`` back,
        ``sriov_numvfs`` counting the PF's ``virtfn`` links, the VF's own RDMA device
        (``infiniband/<rdma>``, also under ``sys/class/infiniband``) with ``ports/1`` GIDs
        (``{index: (gid, type)}``, e.g. ``{3: ("::ffff:10.1.0.5", "RoCE v2")}``), its
        ``infiniband_verbs/<uverbs>`` and ``net/<netdev>``.
        """
        path = list(pf_device.relative_to(self.root / "sys/devices").parts[:-1]) + [bus_id]
        device = self.pci(path, cls="0x020000")
        self._link(pf_device / f"virtfn{index}", device)
        self._link(device / "physfn", pf_device)
        count = sum(1 for p in pf_device.iterdir() if p.name.startswith("virtfn"))
        (pf_device / "sriov_numvfs").write_text(f"{count}\n")
        (pf_device / "sriov_totalvfs").write_text(f"{totalvfs}\n")
        if rdma is not None:
            ib = device / "infiniband" / rdma
            port = ib / "ports" / "1"
            port.mkdir(parents=True, exist_ok=True)
            (port / "link_layer").write_text("Ethernet\n")
            (port / "state").write_text("4: ACTIVE\n")
            for gid_index, (gid, kind) in (gids or {}).items():
                (port / "gids").mkdir(exist_ok=True)
                (port / "gid_attrs" / "types").mkdir(parents=True, exist_ok=True)
                (port / "gids" / str(gid_index)).write_text(gid + "\n")
                (port / "gid_attrs" / "types" / str(gid_index)).write_text(kind + "\n")
            self._link(ib / "device", device)
            self._link(self.root / "sys/class/infiniband" / rdma, ib)
        if uverbs is not None:
            (device / "infiniband_verbs" / uverbs).mkdir(parents=True, exist_ok=True)
            dev = self.root / "dev/infiniband"
            dev.mkdir(parents=True, exist_ok=True)
            (dev / uverbs).touch()
            (dev / "rdma_cm").touch()
        if netdev is not None:
            net = device / "net" / netdev
            net.mkdir(parents=True, exist_ok=True)
            (net / "operstate").write_text("up\n")
            self._link(self.root / "sys/class/net" / netdev, net)
        return device

    @staticmethod
    def _link(link: Path, target: Path) -> None:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(target, link.parent))
