"""Builders for synthetic sysfs trees, shared by this package's tests and by users.

``SysfsTree(tmp_path)`` lays out the files :class:`~gpu_topology.discovery.sysfs.SysfsBackend`
reads, the way the kernel does: device directories nested under
``sys/devices/pci<domain>:<bus>/...`` by their PCIe path, with ``sys/bus/pci/devices``,
``sys/class/infiniband`` and ``sys/class/net`` entries as symlinks into them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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

    @staticmethod
    def _link(link: Path, target: Path) -> None:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(target, link.parent))
