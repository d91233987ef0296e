"""A synthetic sysfs with SR-IOV VFs for the fixture topologies (tests/fixtures/sysfs-vf/README.md).

``build_vfs(root, pfs)`` lays out, with :class:`gpu_topology.testing.SysfsTree`, RDMA NICs
``mlx5_0``..``mlx5_<pfs-1>`` each with two VFs, as the kernel shows them;
``build_dgx_a100_vfs(root)`` is the eight compute NICs of ``tests/fixtures/topology/dgx-a100-class-*``
(two per NUMA node), ``build_vfs(root, 4)`` the four IB NICs of the DGX-1 fixture. Synthetic:
modelled on the kernel's layout, not copied from a machine.
"""

from __future__ import annotations

from pathlib import Path

from gpu_topology.testing import SysfsTree

VFS_PER_PF = 2
ROCE_V2_INDEX = 3


def pf_bus(pf: int) -> str:
    return f"0000:{0x10 + 0x10 * pf:02x}:00.0"


def vf_bus(pf: int, vf: int) -> str:
    return f"0000:{0x10 + 0x10 * pf:02x}:00.{vf + 2}"


def vf_rdma(pf: int, vf: int) -> str:
    return f"mlx5_{10 + VFS_PER_PF * pf + vf}"


def vf_uverbs(pf: int, vf: int) -> str:
    return f"/dev/infiniband/uverbs{10 + VFS_PER_PF * pf + vf}"


def build_dgx_a100_vfs(root: Path) -> SysfsTree:
    """PFs mlx5_0..7, VFs mlx5_10..25 (uverbs10..25, netdevs ens<pf>v<vf>), RoCE v2 GID at 3."""
    return build_vfs(root, 8)


def build_vfs(root: Path, pfs: int) -> SysfsTree:
    """PFs mlx5_0..<pfs-1>, two VFs each: mlx5_<10+2pf+vf>, uverbs<10+2pf+vf>, ens<pf>v<vf>."""
    tree = SysfsTree(root)
    for pf in range(pfs):
        host = f"pci0000:{0x10 + 0x10 * pf:02x}"
        device = tree.rdma(f"mlx5_{pf}", [host, pf_bus(pf)], netdev=f"ens{pf}", link_layer="Ethernet")
        (device / "infiniband_verbs" / f"uverbs{pf}").mkdir(parents=True, exist_ok=True)
        subnet = f"10.{pf // 2 + 1}.{pf % 2}"
        for vf in range(VFS_PER_PF):
            tree.vf(
                device,
                vf,
                vf_bus(pf, vf),
                rdma=vf_rdma(pf, vf),
                uverbs=f"uverbs{10 + VFS_PER_PF * pf + vf}",
                netdev=f"ens{pf}v{vf}",
                totalvfs=8,
                gids={
                    0: ("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
                    1: ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"),
                    2: (f"0000:0000:0000:0000:0000:ffff:{subnet.replace('.', ':')}:0", "IB/RoCE v1"),
                    ROCE_V2_INDEX: (_mapped(f"{subnet}.{10 + vf}"), "RoCE v2"),
                },
            )
    return tree


def _mapped(ipv4: str) -> str:
    a, b, c, d = (int(x) for x in ipv4.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a << 8 | b:04x}:{c << 8 | d:04x}"
