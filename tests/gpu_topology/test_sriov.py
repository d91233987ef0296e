"""SR-IOV VF discovery from a synthetic sysfs (tests/fixtures/sysfs-vf/README.md)."""

from __future__ import annotations

from pathlib import Path

from gpu_topology.discovery.sriov import discover_vfs, gid_index
from gpu_topology.discovery.sysfs import SysfsBackend
from gpu_topology.testing import SysfsTree
from tests.sysfs_vf import ROCE_V2_INDEX, build_dgx_a100_vfs, vf_bus


def test_dgx_a100_vfs(tmp_path: Path) -> None:
    build_dgx_a100_vfs(tmp_path)
    found = discover_vfs(tmp_path)
    assert sorted(found) == [f"mlx5_{i}" for i in range(8)]  # VFs are not PFs
    pf = found["mlx5_3"]
    assert (pf.numvfs, pf.totalvfs, pf.netdev, pf.pci_bus_id) == (2, 8, "ens3", "0000:40:00.0")
    assert [(vf.index, vf.pci_bus_id, vf.rdma_device, vf.netdev, vf.gid_index) for vf in pf.vfs] == [
        (0, vf_bus(3, 0), "mlx5_16", "ens3v0", ROCE_V2_INDEX),
        (1, vf_bus(3, 1), "mlx5_17", "ens3v1", ROCE_V2_INDEX),
    ]
    assert pf.vfs[0].device_nodes == ("/dev/infiniband/uverbs16", "/dev/infiniband/rdma_cm")
    assert all(vf.usable for vf in pf.vfs)


def test_sysfs_backend_does_not_count_vfs_as_nics(tmp_path: Path) -> None:
    build_dgx_a100_vfs(tmp_path)
    topology = SysfsBackend(root=tmp_path, addresses=dict).discover()
    assert [n.name for n in topology.nics] == [f"mlx5_{i}" for i in range(8)]


def test_nic_without_sriov_and_vf_without_driver(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.rdma("mlx5_0", ["pci0000:10", "0000:10:00.0"])  # no sriov_numvfs: not listed
    pf = tree.rdma("mlx5_1", ["pci0000:20", "0000:20:00.0"])
    tree.vf(pf, 0, "0000:20:00.2", rdma=None)
    found = discover_vfs(tmp_path)
    assert list(found) == ["mlx5_1"]
    (vf,) = found["mlx5_1"].vfs
    assert (vf.rdma_device, vf.device_nodes, vf.gid_index, vf.usable) == (None, (), None, False)


def test_gid_index_choice(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    pf = tree.rdma("mlx5_0", ["pci0000:10", "0000:10:00.0"])
    port = tmp_path / "sys/class/infiniband/mlx5_2/ports/1"
    tree.vf(
        pf,
        0,
        "0000:10:00.2",
        rdma="mlx5_2",
        gids={
            0: ("fe80::1", "IB/RoCE v1"),
            1: ("fe80::1", "RoCE v2"),
            2: ("2001:db8::5", "RoCE v2"),
            4: ("::ffff:10.0.0.5", "RoCE v2"),
            5: ("::", "RoCE v2"),
            6: ("::ffff:10.0.0.5", "IB/RoCE v1"),
        },
    )
    assert gid_index(port) == 4  # IPv4-mapped RoCE v2 wins over lower-numbered ones
    (port / "gid_attrs/types/4").write_text("IB/RoCE v1\n")
    assert gid_index(port) == 1  # then the lowest RoCE v2 with a non-zero GID
    (port / "gids/1").write_text("garbage\n")
    assert gid_index(port) == 2
    assert gid_index(tmp_path / "nowhere") is None
