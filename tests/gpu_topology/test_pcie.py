"""One PCIe-distance rule for every discovery path that reads a PCI tree.

The NCCL dump reader and sysfs discovery turn what they read into ``PciePlace``s and share
``gpu_topology.pcie.pcie_level``. The cross-path tests read one machine through both: the
real NCCL dump in ``tests/fixtures/topology/ibm-cloud-gx3d-*`` and the sysfs tree the
kernel shows for the same PCI tree (laid out below by :func:`sysfs_for_dump`, which undoes
the one step NCCL takes when it writes a dump: it keeps a switch's upstream port and drops
the downstream port under which each device sits).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from itertools import combinations
from pathlib import Path

import pytest

from gpu_topology import LinkKind, Topology
from gpu_topology.discovery.nccl_xml import parse_nccl_xml
from gpu_topology.discovery.sysfs import SysfsBackend
from gpu_topology.pcie import PciePlace, pcie_level, switches_in_device_path
from gpu_topology.testing import SysfsTree

IBM_XML = "ibm-cloud-gx3d-8xH100-vsi-nccl-topo"

# -- the rule -----------------------------------------------------------------------------


def place(
    switches: str = "", *, numa: int | None = 0, root: str | None = "pci0000:17", slot: str | None = None
) -> PciePlace:
    return PciePlace(numa_node=numa, root=root, switches=tuple(switches.split()), slot=slot)


@pytest.mark.parametrize(
    ("a", "b", "level"),
    [
        (place("sw1"), place("sw1"), "PIX"),  # under one switch
        (place("sw1 sw2"), place("sw1 sw2"), "PIX"),  # under one nested switch
        (place("sw1 sw2"), place("sw1"), "PXB"),  # through the nested switch too
        (place("sw1 sw2"), place("sw1 sw3"), "PXB"),
        (place("sw1"), place("sw4"), "PHB"),  # only the host bridge in common
        (place(), place(), "PHB"),  # on two root ports of one host bridge
        (place(slot="0000:3b:00"), place(slot="0000:3b:00"), "PIX"),  # two functions of one card
        (place("sw1"), place("sw1", root="pci0000:3a"), "NODE"),  # other host bridge, one NUMA node
        (place(root=None), place(), "NODE"),  # outside any host bridge: the NUMA node decides
        (place(), place(root="pci0000:ae", numa=1), "SYS"),
        (place(numa=None), place(root="pci0000:ae", numa=1), "NODE"),  # unknown node: not known to be SYS
    ],
)
def test_the_pcie_level_of_two_places(a: PciePlace, b: PciePlace, level: str) -> None:
    assert pcie_level(a, b).value == level
    assert pcie_level(b, a).value == level


@pytest.mark.parametrize(
    ("path", "switches"),
    [
        ("pci0000:00 0000:00:02.0", ()),  # an endpoint integrated in the root complex
        ("pci0000:17 0000:17:01.0 0000:18:00.0", ()),  # on a root port
        ("pci0000:17 0000:17:01.0 0000:18:00.0 0000:19:00.0 0000:1a:00.0", ("0000:18:00.0",)),
        (
            "pci0000:17 0000:17:01.0 0000:18:00.0 0000:19:02.0 0000:1c:00.0 0000:1d:00.0 0000:1e:00.0",
            ("0000:18:00.0", "0000:1c:00.0"),
        ),
    ],
)
def test_a_switch_is_named_by_its_upstream_port(path: str, switches: tuple[str, ...]) -> None:
    assert switches_in_device_path(path.split()) == switches


# -- one machine through both paths -------------------------------------------------------


def sysfs_for_dump(text: str, root: Path, *, host_bridge_per: str) -> SysfsTree:
    """The sysfs tree of the machine an NCCL dump describes, laid out as the kernel does.

    Each ``<pci>`` element that holds others is a switch: its upstream port, then one
    downstream port per child on the bus after it (``0000:a2:00.0``, ``0000:a2:01.0`` for the
    switch ``0000:a1:00.0``), as PCI enumeration numbers them; each outermost switch or
    device hangs from a root port. The dump does not say how a CPU's root ports are spread
    over host bridges: ``host_bridge_per="cpu"`` puts them on one, ``"slot"`` gives each its
    own (the bus before the outermost element's, as on machines with one root bus per stack).
    """
    tree = SysfsTree(root)
    for position, cpu in enumerate(ET.fromstring(text).findall("cpu")):
        numa = int(cpu.get("numaid", position))
        outermost = cpu.findall("pci")
        first_bus = _bus_number(outermost[0].get("busid", ""))
        for port, element in enumerate(outermost, start=1):
            host_bus = (first_bus if host_bridge_per == "cpu" else _bus_number(element.get("busid", ""))) - 1
            path = [f"pci0000:{host_bus:02x}", f"0000:{host_bus:02x}:{port:02x}.0"]
            _lay_out(tree, element, path, numa)
    return tree


def _lay_out(tree: SysfsTree, element: ET.Element, path: list[str], numa: int) -> None:
    busid = element.get("busid", "")
    children = element.findall("pci")
    if children:
        tree.pci([*path, busid], numa_node=numa)
        below = f"0000:{_bus_number(busid) + 1:02x}"
        for index, child in enumerate(children):
            downstream = [*path, busid, f"{below}:{index:02x}.0"]
            tree.pci(downstream, numa_node=numa)
            _lay_out(tree, child, downstream, numa)
    elif element.find("gpu") is not None:
        tree.gpu([*path, busid], numa_node=numa)
    else:  # a NIC: one PCI function per port, as a dual-port card shows them
        for function, net in enumerate(element.iter("net")):
            tree.rdma(net.get("name", ""), [*path, busid[:-1] + str(function)], numa_node=numa)


def _bus_number(busid: str) -> int:
    return int(busid.split(":")[1], 16)


def pcie_levels(topology: Topology) -> dict[tuple[str, str], LinkKind]:
    """Every pair's PCIe level; beneath an NVLink, the level the NVLink keeps."""
    found: dict[tuple[str, str], LinkKind] = {}
    for a, b in combinations(topology.device_names, 2):
        link = topology.link(a, b)
        assert link is not None, (a, b)
        found[(a, b)] = link.pcie if link.pcie is not None else link.kind
    return found


@pytest.fixture
def ibm_dump(read_fixture: Callable[[str], str]) -> str:
    return read_fixture(IBM_XML)


def test_the_nccl_dump_and_the_sysfs_tree_of_one_machine_give_the_same_links(ibm_dump: str, tmp_path: Path) -> None:
    nccl = parse_nccl_xml(ibm_dump)
    tree = sysfs_for_dump(ibm_dump, tmp_path, host_bridge_per="cpu")
    sysfs = SysfsBackend(root=tree.root, addresses=dict).discover()

    assert [(g.index, g.pci_bus_id, g.numa_node) for g in sysfs.gpus] == [
        (g.index, g.pci_bus_id, g.numa_node) for g in nccl.gpus
    ]
    assert sorted(sysfs.device_names) == sorted(nccl.device_names)
    from_nccl, from_sysfs = pcie_levels(nccl), pcie_levels(sysfs)
    assert {pair: from_sysfs[pair] for pair in from_nccl} == from_nccl
    # Each GPU shares a bridge with one NIC (reversed numbering), the rest of its socket is
    # across the host bridge, the other socket across the CPU interconnect.
    assert from_nccl[("GPU0", "mlx5_7")] is LinkKind.PIX
    assert from_nccl[("GPU7", "mlx5_0")] is LinkKind.PIX
    assert from_nccl[("GPU0", "GPU1")] is LinkKind.PHB
    assert from_nccl[("GPU0", "GPU4")] is LinkKind.SYS
    assert set(from_nccl.values()) == {LinkKind.PIX, LinkKind.PHB, LinkKind.SYS}


def test_host_bridges_the_dump_cannot_see_turn_phb_into_node_and_nothing_else(ibm_dump: str, tmp_path: Path) -> None:
    from_nccl = pcie_levels(parse_nccl_xml(ibm_dump))
    tree = sysfs_for_dump(ibm_dump, tmp_path, host_bridge_per="slot")
    from_sysfs = pcie_levels(SysfsBackend(root=tree.root, addresses=dict).discover())

    differ = {pair for pair in from_nccl if from_nccl[pair] is not from_sysfs[pair]}
    assert differ == {pair for pair, level in from_nccl.items() if level is LinkKind.PHB}
    assert {from_sysfs[pair] for pair in differ} == {LinkKind.NODE}


NESTED_DUMP = """<system version="1">
  <cpu numaid="0" affinity="0000ffff">
    <pci busid="0000:18:00.0" class="0x060400">
      <pci busid="0000:1a:00.0" class="0x030200"><gpu dev="0"/></pci>
      <pci busid="0000:1c:00.0" class="0x060400">
        <pci busid="0000:1e:00.0" class="0x030200"><gpu dev="1"/></pci>
        <pci busid="0000:1f:00.0" class="0x020000"><nic><net name="mlx5_0" dev="0"/></nic></pci>
      </pci>
    </pci>
    <pci busid="0000:3b:00.0" class="0x020000">
      <nic><net name="mlx5_1" dev="1"/><net name="mlx5_2" dev="2"/></nic>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="ffff0000">
    <pci busid="0000:af:00.0" class="0x030200"><gpu dev="2"/></pci>
  </cpu>
</system>
"""


def test_nested_switches_and_a_dual_port_card_agree_through_both_paths(tmp_path: Path) -> None:
    nccl = parse_nccl_xml(NESTED_DUMP)
    tree = sysfs_for_dump(NESTED_DUMP, tmp_path, host_bridge_per="cpu")
    from_nccl = pcie_levels(nccl)
    assert pcie_levels(SysfsBackend(root=tree.root, addresses=dict).discover()) == from_nccl
    assert from_nccl[("GPU1", "mlx5_0")] is LinkKind.PIX  # one switch, the nested one
    assert from_nccl[("GPU0", "GPU1")] is LinkKind.PXB  # both switches
    assert from_nccl[("GPU0", "mlx5_0")] is LinkKind.PXB
    assert from_nccl[("GPU0", "mlx5_1")] is LinkKind.PHB  # a card on its own root port
    assert from_nccl[("mlx5_1", "mlx5_2")] is LinkKind.PIX  # the two ports of that card
    assert from_nccl[("GPU0", "GPU2")] is LinkKind.SYS
