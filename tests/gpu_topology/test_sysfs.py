"""sysfs discovery over synthetic trees laid out the way the kernel lays them out."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpu_topology import BackendUnavailable, ParseError
from gpu_topology.contract import topology_to_dict
from gpu_topology.discovery.sysfs import SysfsBackend, parse_ip_json
from gpu_topology.testing import SysfsTree

# One host bridge per socket quarter, a PCIe switch (upstream 18:00.0, downstream ports
# 19:00.0 / 19:01.0 / 19:02.0) with a second-level switch below one port.
SWITCH = ["pci0000:17", "0000:17:01.0", "0000:18:00.0"]
NESTED = SWITCH + ["0000:19:02.0", "0000:1c:00.0"]


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path)
    t.gpu(SWITCH + ["0000:19:00.0", "0000:1a:00.0"], numa_node=0, cpulist="0-15,64-79")  # GPU0
    t.rdma("mlx5_0", SWITCH + ["0000:19:01.0", "0000:1b:00.0"], numa_node=0, netdev="ens1f0")
    t.gpu(NESTED + ["0000:1d:00.0", "0000:1e:00.0"], numa_node=0, cpulist="0-15,64-79")  # GPU1
    t.gpu(["pci0000:3a", "0000:3a:01.0", "0000:3b:00.0"], numa_node=0, cpulist="0-15,64-79")  # GPU2
    t.rdma("mlx5_1", ["pci0000:3a", "0000:3a:02.0", "0000:3c:00.0"], numa_node=0, netdev="ens2")
    t.gpu(["pci0000:ae", "0000:ae:01.0", "0000:af:00.0"], numa_node=1, cpulist="16-31,80-95")  # GPU3
    t.rdma(
        "mlx5_2",
        ["pci0000:ae", "0000:ae:02.0", "0000:b0:00.0"],
        numa_node=1,
        netdev="ib0",
        link_layer="InfiniBand",
        state="1: DOWN",
    )
    # Not GPUs: an NVSwitch (bridge class) and an Intel NIC without RDMA.
    t.pci(["pci0000:d7", "0000:d7:00.0"], vendor="0x10de", cls="0x068000", numa_node=1)
    t.pci(["pci0000:d7", "0000:d7:01.0"], vendor="0x8086", cls="0x020000", numa_node=1)
    return t


ADDRESSES = {"ens1f0": ["10.10.0.7/24", "fe80::1e34:daff:fe5a:1/64"], "ens2": ["10.20.0.7/24"], "ib0": []}


def test_gpus_are_nvidia_display_controllers_numbered_in_bus_order(tree: SysfsTree) -> None:
    topology = SysfsBackend(root=tree.root, addresses=lambda: ADDRESSES).discover()
    assert [(g.index, g.pci_bus_id, g.numa_node, g.cpu_affinity) for g in topology.gpus] == [
        (0, "0000:1a:00.0", 0, "0-15,64-79"),
        (1, "0000:1e:00.0", 0, "0-15,64-79"),
        (2, "0000:3b:00.0", 0, "0-15,64-79"),
        (3, "0000:af:00.0", 1, "16-31,80-95"),
    ]


def test_rdma_nics_with_port_state_link_layer_netdev_and_subnets(tree: SysfsTree) -> None:
    topology = SysfsBackend(root=tree.root, addresses=lambda: ADDRESSES).discover()
    nics = {n.name: n for n in topology.nics}
    assert list(nics) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    first = nics["mlx5_0"]
    assert (first.netdev, first.numa_node, first.link_layer, first.state, first.pci_bus_id) == (
        "ens1f0",
        0,
        "Ethernet",
        "ACTIVE",
        "0000:1b:00.0",
    )
    assert first.addresses == ("10.10.0.7/24", "fe80::1e34:daff:fe5a:1/64")
    assert first.subnets == ("10.10.0.0/24",)  # link-local is no subnet to route in
    assert (nics["mlx5_2"].link_layer, nics["mlx5_2"].state, nics["mlx5_2"].addresses) == ("InfiniBand", "DOWN", ())


@pytest.mark.parametrize(
    ("a", "b", "level"),
    [
        ("GPU0", "mlx5_0", "PIX"),  # one switch
        ("GPU1", "mlx5_0", "PXB"),  # through the nested switch too
        ("GPU0", "GPU1", "PXB"),
        ("GPU2", "mlx5_1", "PHB"),  # only the host bridge in common
        ("GPU0", "GPU2", "NODE"),  # other host bridge, same NUMA node
        ("GPU0", "mlx5_1", "NODE"),
        ("GPU0", "GPU3", "SYS"),  # other NUMA node
        ("GPU3", "mlx5_2", "PHB"),
        ("mlx5_0", "mlx5_2", "SYS"),
    ],
)
def test_pcie_levels_follow_the_device_tree(tree: SysfsTree, a: str, b: str, level: str) -> None:
    topology = SysfsBackend(root=tree.root, addresses=lambda: ADDRESSES).discover()
    assert str(topology.link(a, b)) == level


def test_classes_from_sysfs_skip_the_nic_that_is_down(tree: SysfsTree) -> None:
    topology = SysfsBackend(root=tree.root, addresses=lambda: ADDRESSES).discover()
    document = topology_to_dict(topology)
    assert document["nearestNics"] == {"0": ["mlx5_0"], "1": ["mlx5_0"], "2": ["mlx5_1"], "3": []}
    # mlx5_0 and mlx5_1 are both on NUMA node 0: one class holding every GPU.
    assert document["classes"] == [
        {
            "name": "gpu-roce1",
            "nics": ["mlx5_0", "mlx5_1"],
            "numaNode": 0,
            "subnets": ["10.10.0.0/24", "10.20.0.0/24"],
            "gpus": [0, 1, 2, 3],
        }
    ]


def test_an_unknown_numa_node_is_none_and_a_missing_port_leaves_fields_unknown(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.gpu(["pci0000:00", "0000:00:02.0"])  # numa_node -1, no local_cpulist
    tree.rdma("mlx5_0", ["pci0000:00", "0000:00:03.0"], ports=0)
    topology = SysfsBackend(root=tmp_path, addresses=dict).discover()
    assert (topology.gpu(0).numa_node, topology.gpu(0).cpu_affinity) == (None, None)
    nic = topology.nic("mlx5_0")
    assert (nic.numa_node, nic.link_layer, nic.state, nic.netdev) == (None, None, None, None)
    assert str(topology.link("GPU0", "mlx5_0")) == "PHB"


def test_natural_order_puts_mlx5_10_after_mlx5_2(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    for n in (10, 2, 1):
        tree.rdma(f"mlx5_{n}", ["pci0000:00", f"0000:00:{n:02x}.0"])
    assert [n.name for n in SysfsBackend(root=tmp_path, addresses=dict).discover().nics] == [
        "mlx5_1",
        "mlx5_2",
        "mlx5_10",
    ]


def test_a_root_without_sysfs_says_why_and_what_to_do(tmp_path: Path) -> None:
    backend = SysfsBackend(root=tmp_path)
    assert backend.unavailable_reason() == f"{tmp_path / 'sys/bus/pci/devices'} does not exist"
    with pytest.raises(BackendUnavailable, match="mount the host's /sys"):
        backend.discover()


def test_addresses_come_from_ip_json_through_the_runner(tree: SysfsTree) -> None:
    output = """[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},
    {"ifindex":5,"ifname":"ens1f0","addr_info":[{"family":"inet","local":"10.10.0.7","prefixlen":24},
    {"family":"inet6","local":"fd00:10::7","prefixlen":64}]}]"""
    calls: list[list[str]] = []

    def runner(argv: object, timeout: float, hint: str) -> str:
        calls.append(list(argv))  # type: ignore[call-overload]
        return output

    topology = SysfsBackend(root=tree.root, runner=runner).discover()
    assert calls == [["ip", "-j", "address", "show"]]
    assert topology.nic("mlx5_0").subnets == ("10.10.0.0/24", "fd00:10::/64")


def test_without_ip_the_addresses_stay_unknown(tree: SysfsTree) -> None:
    def runner(argv: object, timeout: float, hint: str) -> str:
        raise BackendUnavailable("ip not found", hint=hint)

    topology = SysfsBackend(root=tree.root, runner=runner).discover()
    assert topology.nic("mlx5_0").addresses == ()


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 is not installed here")
def test_the_real_ip_command_lists_the_loopback_address(tmp_path: Path) -> None:
    backend = SysfsBackend(root=tmp_path)
    addresses = backend.addresses()
    assert "127.0.0.1/8" in addresses.get("lo", [])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("[]", {}),
        ('[{"ifname":"eth0","addr_info":[]}]', {}),
        (
            '[{"ifname":"eth0","addr_info":[{"family":"inet","local":"192.0.2.1","prefixlen":25}]}]',
            {"eth0": ["192.0.2.1/25"]},
        ),
        ('[{"ifname":"eth0","addr_info":[{"family":"link","local":"aa"}]}]', {}),
        ('[{"addr_info":[]}]', {}),
    ],
)
def test_parse_ip_json(text: str, expected: dict[str, list[str]]) -> None:
    assert parse_ip_json(text) == expected


def test_ip_output_that_is_not_json_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse_ip_json("1: lo: <LOOPBACK,UP>")


def test_software_rdma_without_a_pci_device_is_never_a_nearest_nic(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.gpu(["pci0000:00", "0000:00:02.0"], numa_node=0)
    (tmp_path / "sys/class/infiniband/rxe0/ports/1").mkdir(parents=True)
    (tmp_path / "sys/class/infiniband/rxe0/ports/1/link_layer").write_text("Ethernet\n")
    (tmp_path / "sys/class/infiniband/rxe0/ports/1/state").write_text("4: ACTIVE\n")
    topology = SysfsBackend(root=tmp_path, addresses=dict).discover()
    assert [n.name for n in topology.nics] == ["rxe0"]
    assert topology.link("GPU0", "rxe0") is None
    assert topology_to_dict(topology)["nearestNics"] == {"0": []}
