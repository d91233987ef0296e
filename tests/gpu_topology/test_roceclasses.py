"""Nearest NICs per GPU and RoCE affinity classes (the GPU-RoCE allocation rules)."""

from __future__ import annotations

import pytest

from gpu_topology import ClassMode, Gpu, InvalidTopology, Link, Nic, Topology, nearest_nics, roce_classes
from tests.gpu_topology.conftest import build


@pytest.mark.parametrize(
    ("to_a", "to_b", "nearest"),
    [
        ("PIX", "PXB", ("a",)),
        ("PXB", "PIX", ("b",)),
        ("PXB", "PHB", ("a",)),
        ("PHB", "NODE", ("a",)),
        ("NODE", "PHB", ("b",)),
        ("NODE", "SYS", ("a",)),
        ("SYS", "SYS", ()),
        ("PIX", "PIX", ("a", "b")),
        ("NODE", "NODE", ("a", "b")),
    ],
)
def test_a_gpus_nearest_nics_are_those_at_its_closest_non_sys_level(
    to_a: str, to_b: str, nearest: tuple[str, ...]
) -> None:
    topology = build({("GPU0", "a"): to_a, ("GPU0", "b"): to_b})
    assert nearest_nics(topology, 0) == nearest


def test_a_nic_whose_port_is_down_is_never_nearest() -> None:
    topology = Topology(
        gpus=(Gpu(0),),
        nics=(Nic("up", state="ACTIVE"), Nic("down", state="DOWN")),
        links={"GPU0": {"down": Link.parse("PIX"), "up": Link.parse("NODE")}},
    )
    assert nearest_nics(topology, 0) == ("up",)


def two_socket(nic_numa: dict[str, int | None], links: dict[tuple[str, str], str]) -> Topology:
    return build(links, numa={0: 0, 1: 0, 2: 1, 3: 1}, nics=nic_numa, gpus=4)


@pytest.mark.parametrize(
    ("nic_numa", "links", "classes"),
    [
        pytest.param(
            {"mlx5_0": 0, "mlx5_1": 1},
            {
                ("GPU0", "mlx5_0"): "PIX",
                ("GPU1", "mlx5_0"): "NODE",
                ("GPU2", "mlx5_1"): "PXB",
                ("GPU3", "mlx5_1"): "PXB",
            },
            [(("mlx5_0",), (0, 1), 0), (("mlx5_1",), (2, 3), 1)],
            id="nics-on-two-numa-nodes-split-one-class-per-numa-node",
        ),
        pytest.param(
            {"mlx5_0": 0, "mlx5_1": 0},
            {("GPU0", "mlx5_0"): "PIX", ("GPU1", "mlx5_1"): "PIX", ("GPU2", "mlx5_0"): "SYS"},
            [(("mlx5_0", "mlx5_1"), (0, 1, 2, 3), 0)],
            id="nics-on-one-numa-node-give-one-class-of-every-gpu",
        ),
        pytest.param(
            {"mlx5_0": 0},
            {("GPU0", "mlx5_0"): "PIX"},
            [(("mlx5_0",), (0, 1, 2, 3), 0)],
            id="a-single-nic-gives-one-class",
        ),
        pytest.param(
            {"mlx5_0": 0, "mlx5_1": 1},
            {("GPU0", "mlx5_0"): "SYS", ("GPU2", "mlx5_1"): "SYS"},
            [],
            id="nics-only-across-sys-give-no-class",
        ),
        pytest.param(
            {"mlx5_0": 0, "mlx5_1": 0, "mlx5_2": 1},
            {
                ("GPU0", "mlx5_0"): "PIX",
                ("GPU1", "mlx5_1"): "PIX",
                ("GPU2", "mlx5_2"): "PIX",
                ("GPU3", "mlx5_2"): "PIX",
            },
            [(("mlx5_0", "mlx5_1"), (0, 1), 0), (("mlx5_2",), (2, 3), 1)],
            id="nics-of-one-numa-node-share-a-class-even-when-near-different-gpus",
        ),
        pytest.param(
            {"mlx5_0": 0, "mlx5_1": 0, "mlx5_2": 1},
            {
                ("GPU0", "mlx5_0"): "PXB",
                ("GPU0", "mlx5_1"): "PXB",
                ("GPU1", "mlx5_1"): "PXB",
                ("GPU2", "mlx5_2"): "PIX",
            },
            [(("mlx5_0", "mlx5_1"), (0, 1), 0), (("mlx5_2",), (2,), 1)],
            id="nics-tied-by-a-shared-gpu-share-a-class-and-gpus-without-affine-nic-are-left-out",
        ),
        pytest.param(
            {"mlx5_1": 1, "mlx5_0": 0},
            {("GPU3", "mlx5_1"): "PIX", ("GPU0", "mlx5_0"): "PIX"},
            [(("mlx5_0",), (0,), 0), (("mlx5_1",), (3,), 1)],
            id="classes-are-numbered-by-their-lowest-gpu",
        ),
    ],
)
def test_roce_classes(
    nic_numa: dict[str, int | None],
    links: dict[tuple[str, str], str],
    classes: list[tuple[tuple[str, ...], tuple[int, ...], int]],
) -> None:
    found = roce_classes(two_socket(nic_numa, links))
    assert [(c.nics, c.gpus, c.numa_node) for c in found] == classes
    assert [c.name for c in found] == [f"gpu-roce{i}" for i in range(1, len(classes) + 1)]


@pytest.mark.parametrize(
    ("nic_link", "split"),
    [("PHB", False), ("NODE", False), ("SYS", True)],
)
def test_without_numa_nodes_nics_apart_across_sys_are_on_different_nodes(nic_link: str, split: bool) -> None:
    links = {("GPU0", "a"): "PIX", ("GPU1", "b"): "PIX", ("a", "b"): nic_link, ("GPU0", "GPU1"): "SYS"}
    topology = build(links)
    assert len(roce_classes(topology)) == (2 if split else 1)


def test_without_numa_nodes_gpus_cpu_lists_place_their_nics() -> None:
    topology = Topology(
        gpus=(Gpu(0, cpu_affinity="0-7"), Gpu(1, cpu_affinity="8-15")),
        nics=(Nic("a"), Nic("b")),
        links={
            "GPU0": {"a": Link.parse("PIX"), "b": Link.parse("SYS")},
            "GPU1": {"b": Link.parse("PIX"), "a": Link.parse("SYS")},
        },
    )
    assert [(c.nics, c.gpus, c.numa_node) for c in roce_classes(topology)] == [
        (("a",), (0,), None),
        (("b",), (1,), None),
    ]


def test_class_subnets_are_those_of_its_nics_in_order() -> None:
    topology = Topology(
        gpus=(Gpu(0, numa_node=0), Gpu(1, numa_node=1)),
        nics=(
            Nic("mlx5_0", numa_node=0, subnets=("10.0.0.0/24", "fd00::/64")),
            Nic("mlx5_1", numa_node=1, subnets=("10.0.1.0/24",)),
        ),
        links={
            "GPU0": {"mlx5_0": Link.parse("PIX"), "mlx5_1": Link.parse("SYS")},
            "GPU1": {"mlx5_1": Link.parse("PIX"), "mlx5_0": Link.parse("SYS")},
        },
    )
    assert [c.subnets for c in roce_classes(topology)] == [("10.0.0.0/24", "fd00::/64"), ("10.0.1.0/24",)]


@pytest.mark.parametrize("prefix", ["gpu-roce", "example.com/gpu-roce", "nvidia.com/roce_", "r"])
def test_the_class_name_prefix_is_configurable(prefix: str) -> None:
    topology = build({("GPU0", "a"): "PIX"})
    assert roce_classes(topology, prefix=prefix)[0].name == f"{prefix}1"


@pytest.mark.parametrize("prefix", ["", "gpu roce", "-gpu", "gpu/", "gpü"])
def test_an_invalid_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(InvalidTopology, match="invalid resource class prefix"):
        roce_classes(build({("GPU0", "a"): "PIX"}), prefix=prefix)


def eight_rails(subnets: dict[int, str] | None = None) -> Topology:
    """8 GPUs, one PIX NIC each (rail-optimised H100 style), GPUs 0-3 and NICs 0-3 on NUMA 0."""
    subnets = subnets or {}
    return Topology(
        gpus=tuple(Gpu(i, numa_node=i // 4) for i in range(8)),
        nics=tuple(Nic(f"mlx5_{i}", numa_node=i // 4, subnets=(subnets[i],) if i in subnets else ()) for i in range(8)),
        links={
            f"GPU{g}": {
                f"mlx5_{n}": Link.parse("PIX" if g == n else ("NODE" if g // 4 == n // 4 else "SYS")) for n in range(8)
            }
            for g in range(8)
        },
    )


def test_numa_mode_gives_one_class_per_numa_group_not_per_nic() -> None:
    found = roce_classes(eight_rails())
    assert [(c.name, c.nics, c.gpus, c.numa_node) for c in found] == [
        ("gpu-roce1", tuple(f"mlx5_{i}" for i in range(4)), (0, 1, 2, 3), 0),
        ("gpu-roce2", tuple(f"mlx5_{i}" for i in range(4, 8)), (4, 5, 6, 7), 1),
    ]
    assert roce_classes(eight_rails(), mode="numa") == found == roce_classes(eight_rails(), mode=ClassMode.NUMA)


def test_none_mode_gives_one_class_of_every_gpu() -> None:
    (only,) = roce_classes(eight_rails(), mode="none")
    assert (only.name, only.gpus, len(only.nics), only.numa_node) == ("gpu-roce1", tuple(range(8)), 8, None)


def test_subnet_mode_gives_one_class_per_subnet_ordered_by_subnet() -> None:
    # Two subnets that cut across the NUMA groups: even rails on 10.0.2.0/24, odd on 10.0.1.0/24.
    topology = eight_rails({i: ("10.0.2.0/24" if i % 2 == 0 else "10.0.1.0/24") for i in range(8)})
    found = roce_classes(topology, mode="subnet")
    assert [(c.name, c.gpus, c.subnets, c.numa_node) for c in found] == [
        ("gpu-roce1", (1, 3, 5, 7), ("10.0.1.0/24",), None),
        ("gpu-roce2", (0, 2, 4, 6), ("10.0.2.0/24",), None),
    ]
    # The NUMA rule on the same node would cut it the other way.
    assert [c.gpus for c in roce_classes(topology)] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_subnet_mode_with_one_subnet_per_rail_gives_one_class_per_rail() -> None:
    topology = eight_rails({i: f"10.0.{i}.0/24" for i in range(8)})
    assert [c.gpus for c in roce_classes(topology, mode="subnet")] == [(i,) for i in range(8)]


def test_subnet_mode_refuses_a_gpu_affine_nic_without_subnet() -> None:
    topology = eight_rails({i: "10.0.0.0/24" for i in range(7)})
    with pytest.raises(InvalidTopology, match="mlx5_7 has none") as caught:
        roce_classes(topology, mode="subnet")
    assert "numa" in (caught.value.hint or "")


@pytest.mark.parametrize("mode", ["NUMA", " subnet", "None"])
def test_modes_are_read_in_any_case(mode: str) -> None:
    assert ClassMode.parse(mode).value == mode.strip().lower()


@pytest.mark.parametrize("mode", ["", "nic", "per-nic", "1"])
def test_an_unknown_mode_is_refused(mode: str) -> None:
    with pytest.raises(InvalidTopology, match="unknown RoCE class mode"):
        roce_classes(eight_rails(), mode=mode)


def test_transfer_nics_are_those_with_a_non_sys_link_to_the_given_gpus_nearest_first() -> None:
    from gpu_topology import transfer_nics

    topology = Topology(
        gpus=(Gpu(0), Gpu(1)),
        nics=(
            Nic("pix", link_layer="Ethernet"),
            Nic("node", link_layer="Ethernet"),
            Nic("far", link_layer="Ethernet"),
            Nic("down", link_layer="Ethernet", state="DOWN"),
        ),
        links={
            "GPU0": {"pix": Link.parse("PIX"), "node": Link.parse("NODE"), "far": Link.parse("SYS")},
            "GPU1": {"pix": Link.parse("SYS"), "node": Link.parse("SYS"), "far": Link.parse("PXB")},
            "down": {"GPU0": Link.parse("PIX")},
        },
    )
    names = lambda nics: [n.name for n in nics]  # noqa: E731
    assert names(transfer_nics(topology, [0])) == ["pix", "node"], "SYS and a port that is down are not near"
    assert names(transfer_nics(topology, [1])) == ["far"]
    assert names(transfer_nics(topology)) == ["pix", "far", "node"], (
        "no GPUs named: near any of the node's, nearest first"
    )
    with pytest.raises(Exception, match="no GPU 7"):
        transfer_nics(topology, [7])


def test_transfer_nics_go_by_pcie_level_then_topology_order() -> None:
    from gpu_topology import LinkKind, transfer_level, transfer_nics

    topology = Topology(
        gpus=(Gpu(0), Gpu(1)),
        nics=tuple(Nic(name, link_layer="Ethernet") for name in ("node", "phb", "pxb", "pix", "pix2", "sys")),
        links={
            "GPU0": {"node": Link.parse("NODE"), "phb": Link.parse("PHB"), "pxb": Link.parse("SYS"),
                     "pix": Link.parse("NODE"), "pix2": Link.parse("PIX"), "sys": Link.parse("SYS")},
            "GPU1": {"node": Link.parse("SYS"), "phb": Link.parse("SYS"), "pxb": Link.parse("PXB"),
                     "pix": Link.parse("PIX"), "pix2": Link.parse("SYS"), "sys": Link.parse("SYS")},
        },
    )  # fmt: skip
    assert [n.name for n in transfer_nics(topology)] == ["pix", "pix2", "pxb", "phb", "node"]
    assert [n.name for n in transfer_nics(topology, [0])] == ["pix2", "phb", "node", "pix"]
    assert transfer_level(topology, topology.nics[3]) is LinkKind.PIX, "its closest link to any GPU"
    assert transfer_level(topology, topology.nics[3], [0]) is LinkKind.NODE
    assert transfer_level(topology, topology.nics[5]) is None


def test_with_no_gpu_known_every_usable_roce_nic_carries_transfers() -> None:
    from gpu_topology import transfer_nics

    topology = Topology(
        nics=(
            Nic("ib", link_layer="InfiniBand"),
            Nic("roce", link_layer="Ethernet"),
            Nic("roce2", link_layer="Ethernet"),
        )
    )
    assert [n.name for n in transfer_nics(topology)] == ["roce", "roce2"]


def test_roce_subnets_are_those_of_the_gpu_affine_nics_that_are_up() -> None:
    import dataclasses

    from gpu_topology import roce_subnets, subnet_key
    from scheduler_plugin.testing import two_class_topology

    topology = two_class_topology()
    assert roce_subnets(topology) == {"10.1.0.0/24", "10.2.0.0/24"}
    assert subnet_key(roce_subnets(topology)) == "10.1.0.0/24,10.2.0.0/24"
    down = dataclasses.replace(topology.nics[1], state="DOWN")
    assert roce_subnets(dataclasses.replace(topology, nics=(topology.nics[0], down))) == {"10.1.0.0/24"}
    assert subnet_key(frozenset()) is None
