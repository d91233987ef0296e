"""Every real topology in tests/fixtures/topology parses to what the file says.

The expectations below were written by reading each file (and its .src note), not by
running the parser: GPU count, NIC names in order after the legend, NUMA node and CPU
affinity per GPU, nearest NICs per GPU, RoCE classes, and a few telling links.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpu_topology import InvalidTopology, Topology, nearest_nic_map, roce_classes, transfer_nics
from gpu_topology.dumps import parse_dump

DGX_A100 = "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend"
DGX1 = "dgx1-v100-4ib"
IBM_XML = "ibm-cloud-gx3d-8xH100-vsi-nccl-topo"
ML_ENG = "ml-engineering-8xH100-no-nic-spaces"
MYSTOUS = "mystous-8xH100-11nic-ansi-escapes-captured"
CGROUP = "mystous-8xH100-11nic-cgroup-empty-cpu-affinity-derived"
ONEFLOW = "oneflow-hugectr-8xV100-2nic-mangled-whitespace"
DELLA = "princeton-della-2xA100-pcie-2nic-epyc"
TRAVERSE = "princeton-traverse-power9-1gpu-slurm-numa-list"
LENT_H100 = "lent-h100-vm-1gpu-nonic-driver580-gpu-numa-id"

Class = tuple[tuple[str, ...], tuple[int, ...], "int | None"]


@dataclass(frozen=True)
class Expected:
    nics: tuple[str, ...]
    numa: tuple[int | None, ...]
    cpus: tuple[str | None, ...]
    nearest: tuple[tuple[str, ...], ...]
    classes: tuple[Class, ...]
    links: dict[tuple[str, str], str] = field(default_factory=dict)
    nic_numa: dict[str, int | None] = field(default_factory=dict)


def mlx(*numbers: int) -> tuple[str, ...]:
    return tuple(f"mlx5_{n}" for n in numbers)


EXPECTED: dict[str, Expected] = {
    DGX_A100: Expected(
        nics=mlx(*range(10)),
        numa=(3, 3, 1, 1, 7, 7, 5, 5),
        cpus=("48-63,176-191",) * 2 + ("16-31,144-159",) * 2 + ("112-127,240-255",) * 2 + ("80-95,208-223",) * 2,
        nearest=(mlx(0, 1),) * 2 + (mlx(2, 3),) * 2 + (mlx(4, 5),) * 2 + (mlx(6, 7),) * 2,
        # NPS4: eight NUMA nodes; the GPU pairs' NICs sit on four of them (3, 1, 7, 5), so
        # four classes of two GPUs. The storage pair mlx5_8/9 is near no GPU.
        classes=(
            (mlx(0, 1), (0, 1), 3),
            (mlx(2, 3), (2, 3), 1),
            (mlx(4, 5), (4, 5), 7),
            (mlx(6, 7), (6, 7), 5),
        ),
        links={
            ("GPU0", "GPU7"): "NV12",
            ("GPU0", "mlx5_0"): "PXB",
            ("GPU0", "mlx5_2"): "SYS",
            ("mlx5_8", "mlx5_9"): "PIX",
            ("GPU7", "mlx5_9"): "SYS",
        },
        # NICs get the NUMA node of the GPUs within non-SYS reach; the storage pair has none.
        nic_numa={"mlx5_0": 3, "mlx5_3": 1, "mlx5_5": 7, "mlx5_6": 5, "mlx5_8": None},
    ),
    DGX1: Expected(
        nics=mlx(0, 2, 1, 3),  # unsorted columns kept as printed
        numa=(None,) * 8,  # no NUMA column in this driver's output
        cpus=("0-19,40-59",) * 4 + ("20-39,60-79",) * 4,
        nearest=(mlx(0),) * 2 + (mlx(1),) * 2 + (mlx(2),) * 2 + (mlx(3),) * 2,
        # No NUMA column: the GPUs' CPU lists place mlx5_0/1 on one socket and mlx5_2/3 on
        # the other (SYS apart), so one class per socket's NIC pair.
        classes=(
            (mlx(0, 1), (0, 1, 2, 3), None),
            (mlx(2, 3), (4, 5, 6, 7), None),
        ),
        links={
            ("GPU0", "GPU1"): "NV1",
            ("GPU0", "GPU3"): "NV2",
            ("GPU0", "GPU5"): "SYS",
            ("GPU7", "GPU4"): "NV2",
            ("GPU2", "mlx5_0"): "PHB",
            ("GPU2", "mlx5_1"): "PIX",
            ("mlx5_0", "mlx5_1"): "PHB",
            ("mlx5_2", "mlx5_3"): "PHB",
            ("mlx5_0", "mlx5_2"): "SYS",
        },
    ),
    ML_ENG: Expected(
        nics=(),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpus=("0-51,104-155",) * 4 + ("52-103,156-207",) * 4,
        nearest=((),) * 8,
        classes=(),
        links={("GPU0", "GPU7"): "NV18", ("GPU3", "GPU4"): "NV18"},
    ),
    MYSTOUS: Expected(
        nics=mlx(0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11),  # legend: NIC9 -> mlx5_10, NIC10 -> mlx5_11
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpus=("0-55,112-167",) * 4 + ("56-111,168-223",) * 4,
        nearest=(mlx(0), mlx(1), mlx(2), mlx(3), mlx(6), mlx(7), mlx(8), mlx(8)),
        # One class per NUMA group of the GPU-affine NICs; mlx5_4/5 and mlx5_10/11 are
        # near no GPU and in no class.
        classes=((mlx(0, 1, 2, 3), (0, 1, 2, 3), 0), (mlx(6, 7, 8), (4, 5, 6, 7), 1)),
        links={
            ("GPU0", "mlx5_0"): "PIX",
            ("GPU0", "mlx5_1"): "PXB",
            ("GPU7", "mlx5_8"): "PXB",
            ("GPU7", "mlx5_10"): "NODE",
            ("mlx5_10", "mlx5_11"): "PIX",
            ("mlx5_4", "mlx5_5"): "PIX",
            ("GPU1", "GPU6"): "NV18",
        },
        nic_numa={"mlx5_4": 0, "mlx5_5": 0, "mlx5_10": 1, "mlx5_11": 1},
    ),
    # Driver 580 adds a "GPU NUMA ID" column (N/A here) after NUMA Affinity: the NUMA node
    # is still read from NUMA Affinity. No NIC, so no class.
    LENT_H100: Expected(nics=(), numa=(0,), cpus=("0-15",), nearest=((),), classes=()),
    # Derived from MYSTOUS with every CPU Affinity cell emptied (see its .src): the NUMA
    # column must stay in place.
    CGROUP: Expected(
        nics=mlx(0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpus=(None,) * 8,
        nearest=(mlx(0), mlx(1), mlx(2), mlx(3), mlx(6), mlx(7), mlx(8), mlx(8)),
        classes=((mlx(0, 1, 2, 3), (0, 1, 2, 3), 0), (mlx(6, 7, 8), (4, 5, 6, 7), 1)),
        links={("GPU0", "mlx5_0"): "PIX", ("GPU7", "mlx5_8"): "PXB", ("GPU1", "GPU6"): "NV18"},
        nic_numa={"mlx5_4": 0, "mlx5_5": 0, "mlx5_10": 1, "mlx5_11": 1},
    ),
    ONEFLOW: Expected(
        nics=mlx(0, 1),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpus=("0-23,48-71",) * 4 + ("24-47,72-95",) * 4,
        nearest=(mlx(0),) * 4 + (mlx(1),) * 4,
        classes=((mlx(0), (0, 1, 2, 3), 0), (mlx(1), (4, 5, 6, 7), 1)),
        links={
            ("GPU0", "GPU1"): "NV1",
            ("GPU0", "GPU2"): "NV2",
            ("GPU0", "GPU7"): "NV2",
            ("GPU1", "GPU6"): "NV2",
            ("GPU2", "GPU5"): "NV1",
            ("GPU3", "GPU4"): "NV1",
            ("GPU0", "GPU4"): "SYS",
            ("GPU0", "mlx5_0"): "NODE",
            ("GPU3", "mlx5_0"): "PIX",
            ("GPU5", "mlx5_1"): "NODE",
            ("mlx5_0", "mlx5_1"): "SYS",
        },
        nic_numa={"mlx5_0": 0, "mlx5_1": 1},
    ),
    DELLA: Expected(
        nics=mlx(0, 1),
        numa=(0, 1),
        cpus=("0-63", "64-127"),
        nearest=(mlx(0), mlx(1)),
        classes=((mlx(0), (0,), 0), (mlx(1), (1,), 1)),
        links={("GPU0", "GPU1"): "SYS", ("GPU0", "mlx5_0"): "NODE", ("GPU1", "mlx5_0"): "SYS"},
    ),
    TRAVERSE: Expected(
        nics=mlx(0, 1, 2, 3),
        numa=(None,),  # "0,8,252-255" names several nodes
        cpus=("0-3",),
        nearest=((),),  # every GPU-NIC cell is SYS
        classes=(),
        links={("GPU0", "mlx5_0"): "SYS", ("mlx5_0", "mlx5_1"): "PIX", ("mlx5_2", "mlx5_3"): "PIX"},
    ),
    IBM_XML: Expected(
        nics=mlx(*range(8)),  # ordered by NCCL's net dev index
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpus=("0-79",) * 4 + ("80-159",) * 4,
        nearest=tuple(mlx(7 - i) for i in range(8)),  # reversed: GPU0 <-> mlx5_7
        classes=((mlx(4, 5, 6, 7), (0, 1, 2, 3), 0), (mlx(0, 1, 2, 3), (4, 5, 6, 7), 1)),
        links={
            ("GPU0", "GPU1"): "NV18",  # 5+5+4+4 NVSwitch links each
            ("GPU0", "GPU7"): "NV18",
            ("GPU0", "mlx5_7"): "PIX",
            ("GPU0", "mlx5_6"): "PHB",
            ("GPU0", "mlx5_0"): "SYS",
            ("mlx5_7", "mlx5_4"): "PHB",
        },
        nic_numa={"mlx5_7": 0, "mlx5_0": 1},
    ),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def parsed(request: pytest.FixtureRequest, read_fixture: Callable[[str], str]) -> tuple[str, Topology]:
    name: str = request.param
    return name, parse_dump(read_fixture(name))


def test_every_fixture_in_the_fixtures_folder_has_expectations(topology_fixtures: Path) -> None:
    stems = {p.name.split("-nvidia-smi")[0].removesuffix(".xml") for p in topology_fixtures.glob("*.txt")}
    stems |= {p.stem for p in topology_fixtures.glob("*.xml")}
    assert stems == set(EXPECTED)


def test_gpus_and_their_numa_nodes_and_cpus(parsed: tuple[str, Topology]) -> None:
    name, topology = parsed
    expected = EXPECTED[name]
    assert topology.gpu_indices == tuple(range(len(expected.numa)))
    assert tuple(g.numa_node for g in topology.gpus) == expected.numa
    assert tuple(g.cpu_affinity for g in topology.gpus) == expected.cpus


def test_nic_names_in_order_after_the_legend(parsed: tuple[str, Topology]) -> None:
    name, topology = parsed
    assert tuple(n.name for n in topology.nics) == EXPECTED[name].nics


def test_nearest_nics_per_gpu(parsed: tuple[str, Topology]) -> None:
    name, topology = parsed
    assert nearest_nic_map(topology) == dict(enumerate(EXPECTED[name].nearest))


def test_roce_classes(parsed: tuple[str, Topology]) -> None:
    name, topology = parsed
    classes = roce_classes(topology)
    assert [(c.nics, c.gpus, c.numa_node) for c in classes] == list(EXPECTED[name].classes)
    assert [c.name for c in classes] == [f"gpu-roce{i}" for i in range(1, len(classes) + 1)]


def test_none_mode_gives_one_class_of_every_gpu_wherever_a_nic_is_affine(parsed: tuple[str, Topology]) -> None:
    name, topology = parsed
    classes = roce_classes(topology, mode="none")
    if not EXPECTED[name].classes:
        assert classes == ()
        return
    (only,) = classes
    assert only.gpus == topology.gpu_indices
    assert set(only.nics) == {n for c in EXPECTED[name].classes for n in c[0]}


def test_no_fixture_knows_its_subnets_so_subnet_mode_refuses_them(parsed: tuple[str, Topology]) -> None:
    name, topology = parsed
    if not EXPECTED[name].classes:
        assert roce_classes(topology, mode="subnet") == ()
        return
    with pytest.raises(InvalidTopology, match="needs the subnet"):
        roce_classes(topology, mode="subnet")


def test_links_read_the_same_both_ways(parsed: tuple[str, Topology]) -> None:
    name, topology = parsed
    for (a, b), text in EXPECTED[name].links.items():
        assert str(topology.link(a, b)) == text, (a, b)
        assert str(topology.link(b, a)) == text, (b, a)


def test_every_device_pair_has_a_link(parsed: tuple[str, Topology]) -> None:
    _, topology = parsed
    names = topology.device_names
    missing = [(a, b) for a in names for b in names if a != b and topology.link(a, b) is None]
    assert missing == []


def test_nic_numa_nodes_inferred_from_their_gpus(parsed: tuple[str, Topology]) -> None:
    name, topology = parsed
    for nic, node in EXPECTED[name].nic_numa.items():
        assert topology.nic(nic).numa_node == node, nic


def test_the_numa_list_and_range_is_kept_whole(read_fixture: Callable[[str], str]) -> None:
    gpu = parse_dump(read_fixture(TRAVERSE)).gpu(0)
    assert gpu.numa_node is None
    assert gpu.numa_affinity == (0, 8, 252, 253, 254, 255)


def test_the_nccl_dump_keeps_pci_bus_ids(read_fixture: Callable[[str], str]) -> None:
    topology = parse_dump(read_fixture(IBM_XML))
    assert topology.gpu(0).pci_bus_id == "0000:a4:00.0"
    assert topology.gpu(7).pci_bus_id == "0000:ea:00.0"
    assert topology.nic("mlx5_7").pci_bus_id == "0000:a3:00.0"


def _transfer_order(read_fixture: Callable[[str], str], name: str, gpus: list[int] | None = None) -> tuple[str, ...]:
    return tuple(n.name for n in transfer_nics(parse_dump(read_fixture(name)), gpus))


def test_transfer_nics_put_the_nics_sharing_a_pcie_switch_with_a_gpu_first(
    read_fixture: Callable[[str], str],
) -> None:
    """The node's own fetches (docs/design.md#links) take the NICs nearest a GPU first:
    read from the dumps, PIX before PXB before PHB before NODE, never SYS."""
    # seven NICs share a PCIe switch (PIX) with a GPU; mlx5_4/5/10/11 (the legend has no
    # mlx5_9) reach one through their NUMA node's host bridges only (NODE)
    assert _transfer_order(read_fixture, MYSTOUS) == mlx(0, 1, 2, 3, 6, 7, 8, 4, 5, 10, 11)
    # GPU2's own switch holds mlx5_1 (PIX); mlx5_0 sits behind its host bridge (PHB);
    # mlx5_2 and mlx5_3 are on the other socket (SYS)
    assert _transfer_order(read_fixture, DGX1, [2]) == mlx(1, 0)
    assert _transfer_order(read_fixture, DGX1, [2, 4]) == mlx(2, 1, 0, 3)  # PIX in the dump's column order
    # every compute NIC shares several switches with two GPUs (PXB); the storage pair is SYS
    assert _transfer_order(read_fixture, DGX_A100) == mlx(*range(8))
    # NODE only: each NIC hangs off one GPU's NUMA node, not its switch; SYS to the other
    assert _transfer_order(read_fixture, DELLA) == mlx(0, 1)
    assert _transfer_order(read_fixture, DELLA, [1]) == mlx(1)
