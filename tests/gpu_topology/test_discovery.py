"""Backends behind one interface: nvidia-smi through real subprocesses, the registry,
automatic choice and merging, NCCL XML edge cases, and NVML's mapping."""

from __future__ import annotations

import importlib.util
import json
import stat
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_topology import BackendUnavailable, DiscoveryError, Gpu, Link, LinkKind, ParseError, Topology, discover
from gpu_topology.discovery import get_backend
from gpu_topology.discovery.merge import merge
from gpu_topology.discovery.nccl_xml import NcclXmlBackend, parse_nccl_xml
from gpu_topology.discovery.nvidia_smi import NvidiaSmiBackend
from gpu_topology.discovery.nvml import NvmlBackend
from gpu_topology.testing import SysfsTree

DELLA = "princeton-della-2xA100-pcie-2nic-epyc"
QUERY = "0, GPU-aaaa, 00000000:27:00.0\n1, GPU-bbbb, 00000000:A3:00.0\n"


def fake_nvidia_smi(folder: Path, matrix: str, *, fail: str | None = None, query: str = QUERY) -> Path:
    """A real executable that answers like nvidia-smi (or fails like it without a driver)."""
    (folder / "matrix.txt").write_text(matrix)
    (folder / "query.txt").write_text(query)
    script = folder / "nvidia-smi"
    if fail:
        body = f'echo "{fail}" >&2\nexit 9\n'
    else:
        body = f'if [ "$1" = topo ]; then cat "{folder}/matrix.txt"; else cat "{folder}/query.txt"; fi\n'
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_nvidia_smi_backend_runs_the_matrix_and_the_uuid_query(
    tmp_path: Path, read_fixture: Callable[[str], str]
) -> None:
    binary = fake_nvidia_smi(tmp_path, read_fixture(DELLA))
    topology = NvidiaSmiBackend(binary=str(binary)).discover()
    assert [(g.uuid, g.pci_bus_id, g.numa_node) for g in topology.gpus] == [
        ("GPU-aaaa", "0000:27:00.0", 0),
        ("GPU-bbbb", "0000:a3:00.0", 1),
    ]


def test_nvidia_smi_without_a_driver_is_a_discovery_error_with_its_message(tmp_path: Path) -> None:
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    binary = fake_nvidia_smi(tmp_path, "", fail=msg)
    with pytest.raises(DiscoveryError, match="exited with status 9: NVIDIA-SMI has failed") as excinfo:
        NvidiaSmiBackend(binary=str(binary)).discover()
    assert excinfo.value.exit_code == 7


def test_a_missing_nvidia_smi_says_what_to_install(tmp_path: Path) -> None:
    backend = NvidiaSmiBackend(binary="nvidia-smi-not-here")
    assert backend.unavailable_reason() == "nvidia-smi-not-here is not on PATH"
    with pytest.raises(BackendUnavailable, match="nvidia-utils") as excinfo:
        backend.discover()
    assert excinfo.value.exit_code == 10
    with pytest.raises(BackendUnavailable, match="not found.*nvidia-utils"):
        NvidiaSmiBackend(binary=str(tmp_path / "missing")).discover()


def test_a_hanging_nvidia_smi_times_out(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nexec sleep 5\n")
    script.chmod(0o755)
    with pytest.raises(DiscoveryError, match="did not answer within 0.2 s"):
        NvidiaSmiBackend(binary=str(script), timeout=0.2).discover()


def test_a_non_executable_nvidia_smi_says_what_to_install(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    with pytest.raises(BackendUnavailable, match="is not executable"):
        NvidiaSmiBackend(binary=str(script)).discover()


def test_a_backend_whose_module_cannot_import_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_topology import discovery

    monkeypatch.setitem(discovery.BACKENDS, "dcgm", ("gpu_topology_no_such_module:Backend", "pip install dcgm"))
    with pytest.raises(BackendUnavailable, match="dcgm discovery cannot be imported.*pip install dcgm"):
        get_backend("dcgm")


def test_the_registry_builds_backends_by_name_and_refuses_unknown_ones(tmp_path: Path) -> None:
    assert isinstance(get_backend("sysfs", root=tmp_path), object)
    assert get_backend("nccl-xml", path=tmp_path / "x.xml").name == "nccl-xml"
    with pytest.raises(
        BackendUnavailable, match="unknown discovery backend 'dcgm'.*one of nvml, nvidia-smi, sysfs, nccl-xml"
    ):
        get_backend("dcgm")


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="nvidia-ml-py is installed here")
def test_nvml_without_nvidia_ml_py_says_what_to_install() -> None:
    backend = NvmlBackend()
    assert backend.unavailable_reason() == "nvidia-ml-py is not installed"
    with pytest.raises(BackendUnavailable, match=r"dsplatform\[nvml\]"):
        backend.discover()


def unavailable_nvml() -> SimpleNamespace:
    class NVMLError(Exception):
        pass

    def init() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    return SimpleNamespace(NVMLError=NVMLError, nvmlInit=init)


def test_automatic_discovery_on_a_machine_without_gpus_lists_every_reason(tmp_path: Path) -> None:
    SysfsTree(tmp_path)
    options = {
        "nvml": {"nvml": unavailable_nvml()},
        "nvidia-smi": {"binary": "absent-smi"},
        "sysfs": {"root": tmp_path},
    }
    with pytest.raises(BackendUnavailable) as excinfo:
        discover(options=options)
    text = str(excinfo.value)
    assert "nvml: NVML cannot start: NVML Shared Library Not Found" in text
    assert "nvidia-smi: absent-smi is not on PATH" in text
    assert "sysfs lists no NVIDIA display/3D controller" in text


def test_automatic_discovery_merges_nic_details_from_sysfs_into_nvidia_smi(
    tmp_path: Path, read_fixture: Callable[[str], str]
) -> None:
    binary = fake_nvidia_smi(tmp_path, read_fixture(DELLA))
    tree = SysfsTree(tmp_path / "root")
    tree.gpu(["pci0000:20", "0000:20:01.0", "0000:27:00.0"], numa_node=0, cpulist="0-63")
    tree.gpu(["pci0000:a0", "0000:a0:01.0", "0000:a3:00.0"], numa_node=1, cpulist="64-127")
    tree.rdma(
        "mlx5_0", ["pci0000:20", "0000:20:03.0", "0000:2a:00.0"], numa_node=0, netdev="ib0", link_layer="InfiniBand"
    )
    tree.rdma(
        "mlx5_1", ["pci0000:a0", "0000:a0:03.0", "0000:a6:00.0"], numa_node=1, netdev="ib1", link_layer="InfiniBand"
    )
    options = {
        "nvml": {"nvml": unavailable_nvml()},
        "nvidia-smi": {"binary": str(binary)},
        "sysfs": {"root": tree.root, "addresses": lambda: {"ib0": ["10.0.0.1/16"], "ib1": ["10.1.0.1/16"]}},
    }
    topology = discover(options=options)
    assert [n.netdev for n in topology.nics] == ["ib0", "ib1"]
    assert [c.subnets for c in _classes(topology)] == [("10.0.0.0/16",), ("10.1.0.0/16",)]
    # nvidia-smi's links win over sysfs's where both speak (sysfs would say NODE here too).
    assert str(topology.link("GPU0", "mlx5_0")) == "NODE"


def _classes(topology: Any) -> Any:
    from gpu_topology import roce_classes

    return roce_classes(topology)


def test_named_backends_must_all_be_able_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_TOPO_FILE", raising=False)
    with pytest.raises(BackendUnavailable, match="nccl-xml discovery cannot run: no NCCL topology file"):
        discover(["nccl-xml"])


def test_named_backends_merge_in_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, read_fixture: Callable[[str], str]
) -> None:
    path = tmp_path / "topo.xml"
    path.write_text(read_fixture("ibm-cloud-gx3d"))
    monkeypatch.setenv("NCCL_TOPO_FILE", str(path))
    tree = SysfsTree(tmp_path / "root")
    tree.rdma("mlx5_7", ["pci0000:a0", "0000:a1:00.0", "0000:a3:00.0"], numa_node=0, netdev="eth7")
    topology = discover(["nccl-xml", "sysfs"], options={"sysfs": {"root": tree.root, "addresses": dict}})
    assert topology.nic("mlx5_7").netdev == "eth7"
    assert len(topology.gpus) == 8


def test_merge_fills_gaps_and_keeps_the_first_sources_values(
    read_fixture: Callable[[str], str], tmp_path: Path
) -> None:
    from gpu_topology.dumps import parse_dump

    smi = parse_dump(read_fixture(DELLA))
    tree = SysfsTree(tmp_path)
    tree.gpu(["pci0000:20", "0000:20:01.0", "0000:27:00.0"], numa_node=0, cpulist="0-63")
    tree.rdma("mlx5_0", ["pci0000:20", "0000:20:03.0", "0000:2a:00.0"], numa_node=0, netdev="ib0")
    tree.rdma("mlx5_9", ["pci0000:20", "0000:20:04.0", "0000:2b:00.0"], numa_node=0, netdev="ib9")
    from gpu_topology.discovery.sysfs import SysfsBackend

    merged = merge(smi, SysfsBackend(root=tmp_path, addresses=dict).discover())
    # nvidia-smi's text has no bus ids, so GPUs match by index and sysfs fills them in.
    assert (merged.gpu(0).pci_bus_id, merged.gpu(1).pci_bus_id) == ("0000:27:00.0", None)
    assert merged.nic("mlx5_0").netdev == "ib0"
    assert [n.name for n in merged.nics] == ["mlx5_0", "mlx5_1", "mlx5_9"]
    assert str(merged.link("GPU0", "mlx5_9")) == "PHB"  # only sysfs knew this pair
    assert str(merged.link("GPU0", "GPU1")) == "SYS"  # nvidia-smi's value kept


def xml(body: str) -> str:
    return f'<system version="1"><cpu numaid="0" affinity="0000000f">{body}</cpu></system>'


def pci(busid: str, inner: str, cls: str = "0x060400") -> str:
    return f'<pci busid="{busid}" class="{cls}">{inner}</pci>'


def gpu(dev: int, links: str = "") -> str:
    return f'<gpu dev="{dev}" sm="80" rank="{dev}" gdr="1">{links}</gpu>'


def test_nccl_direct_nvlinks_nested_switches_and_cpu_masks() -> None:
    text = xml(
        pci(
            "0000:10:00.0",
            pci("0000:11:00.0", gpu(0, '<nvlink target="0000:12:00.0" count="2" tclass="0x030200"/>'), "0x030200")
            + pci(
                "0000:13:00.0",
                pci("0000:12:00.0", gpu(1, '<nvlink target="0000:11:00.0" count="2" tclass="0x030200"/>'), "0x030200")
                + pci("0000:14:00.0", '<nic><net name="mlx5_0" dev="0"/></nic>', "0x020000"),
            ),
        )
        + pci("0000:20:00.0", gpu(2), "0x030200")
    )
    topology = parse_nccl_xml(text)
    assert str(topology.link("GPU0", "GPU1")) == "NV2"
    # The PCIe path beneath the NVLink is kept: GPU0 and GPU1 meet under 0000:10:00.0.
    assert topology.link("GPU0", "GPU1").pcie is LinkKind.PXB  # type: ignore[union-attr]
    assert str(topology.link("GPU1", "mlx5_0")) == "PIX"
    assert str(topology.link("GPU0", "mlx5_0")) == "PXB"
    assert str(topology.link("GPU0", "GPU2")) == "PHB"
    assert topology.gpu(0).cpu_affinity == "0-3"


def test_nccl_dumps_without_tclass_tell_gpu_peers_from_switches() -> None:
    text = xml(
        pci(
            "0000:11:00.0",
            gpu(0, '<nvlink target="0000:12:00.0" count="1"/><nvlink target="0000:f0:00.0" count="6"/>'),
            "0x030200",
        )
        + pci(
            "0000:12:00.0",
            gpu(1, '<nvlink target="0000:11:00.0" count="1"/><nvlink target="0000:f0:00.0" count="6"/>'),
            "0x030200",
        )
        + pci("0000:13:00.0", gpu(2, '<nvlink target="0000:f0:00.0" count="4"/>'), "0x030200")
    )
    topology = parse_nccl_xml(text)
    assert str(topology.link("GPU0", "GPU1")) == "NV1"  # the direct link is named, not the switch
    assert str(topology.link("GPU0", "GPU2")) == "NV4"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("<system", "not well-formed"),
        ("<topology/>", "must start with <system>"),
        ('<system version="1"/>', "no <cpu>"),
        (xml(""), "lists no <gpu>"),
        (xml(gpu(0).replace('dev="0"', 'dev="zero"')), "gpu dev is not a number"),
        ('<system><cpu numaid="0" affinity="xyz">' + gpu(0) + "</cpu></system>", "not a hex mask"),
        (xml(gpu(0) + '<nic><net dev="0"/></nic>'), "has no name"),
    ],
)
def test_bad_nccl_xml_is_a_parse_error(text: str, match: str) -> None:
    with pytest.raises(ParseError, match=match):
        parse_nccl_xml(text)


def test_the_nccl_backend_reads_its_file_or_says_it_has_none(
    tmp_path: Path, read_fixture: Callable[[str], str]
) -> None:
    path = tmp_path / "topo.xml"
    path.write_text(read_fixture("ibm-cloud-gx3d"))
    assert len(NcclXmlBackend(path=path).discover().gpus) == 8
    assert NcclXmlBackend(path=tmp_path / "none.xml").unavailable_reason() == f"{tmp_path / 'none.xml'} is not a file"


class FakeNvml:
    """Just enough of pynvml's surface: two GPUs NVLinked twice, one to an NVSwitch each."""

    NVML_FEATURE_ENABLED = 1

    class NVMLError(Exception):
        pass

    def __init__(self, remotes: dict[int, list[str]], ancestor: int = 40) -> None:
        self.remotes = remotes
        self.ancestor = ancestor
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.remotes)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle}".encode()

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{0x10 + handle:02X}:00.0".encode())

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return -1 if handle == 2 else 0

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        return [0xFF | (1 << 63), 0x1][:words] if words > 1 else [0xFF]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= len(self.remotes[handle]):
            raise self.NVMLError("Not Supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.remotes[handle][link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.ancestor


def test_nvml_maps_nvlinks_switches_and_common_ancestors() -> None:
    fake = FakeNvml(
        {
            0: ["00000000:11:00.0", "00000000:11:00.0", "00000000:F0:00.0"],
            1: ["00000000:10:00.0", "00000000:10:00.0", "00000000:F0:00.0", "00000000:F1:00.0"],
            2: [],
        },
        ancestor=30,
    )
    topology = NvmlBackend(nvml=fake).discover()
    assert str(topology.link("GPU0", "GPU1")) == "NV2"
    assert topology.link("GPU0", "GPU1") == Link(LinkKind.NVLINK, 2, pcie=LinkKind.PHB)
    assert str(topology.link("GPU0", "GPU2")) == "PHB"
    assert [(g.uuid, g.pci_bus_id, g.numa_node) for g in topology.gpus] == [
        ("GPU-0", "0000:10:00.0", 0),
        ("GPU-1", "0000:11:00.0", 0),
        ("GPU-2", "0000:12:00.0", None),
    ]
    assert topology.gpu(0).cpu_affinity in ("0-7", "0-7,63-64")
    assert fake.shutdowns == 1


@pytest.mark.parametrize(
    ("ancestor", "level"), [(0, "BOARD"), (10, "PIX"), (20, "PXB"), (30, "PHB"), (40, "NODE"), (50, "SYS")]
)
def test_nvml_common_ancestors_map_to_nvidia_smi_levels(ancestor: int, level: str) -> None:
    topology = NvmlBackend(nvml=FakeNvml({0: [], 1: []}, ancestor=ancestor)).discover()
    assert str(topology.link("GPU0", "GPU1")) == level


def test_nvml_gpus_on_nvswitches_get_the_smaller_switch_link_count() -> None:
    switch = "00000000:F0:00.0"
    topology = NvmlBackend(nvml=FakeNvml({0: [switch] * 18, 1: [switch] * 12})).discover()
    assert str(topology.link("GPU0", "GPU1")) == "NV12"


def test_nvml_query_failures_are_discovery_errors_and_still_shut_down() -> None:
    fake = FakeNvml({0: []})

    def broken() -> int:
        raise fake.NVMLError("GPU is lost")

    fake.nvmlDeviceGetCount = broken  # type: ignore[method-assign]
    with pytest.raises(DiscoveryError, match="NVML query failed: GPU is lost"):
        NvmlBackend(nvml=fake).discover()
    assert fake.shutdowns == 1


@pytest.mark.parametrize(
    ("words", "cpus"),
    [([0], None), ([0xFF], "0-7"), ([0b1011], "0-1,3"), ([1 << 63, 1], "63-64"), ([0, 0xF0], "68-71")],
)
def test_nvml_affinity_words_become_cpu_lists(words: list[int], cpus: str | None) -> None:
    from gpu_topology.discovery.nvml import _cpu_list

    assert _cpu_list(words) == cpus


@pytest.mark.parametrize(
    ("mask", "cpus"),
    [
        ("0000000f", "0-3"),
        ("00000000,00000000,0000ffff,ffffffff,ffffffff", "0-79"),
        ("ffffffff,ffffffff,ffff0000,00000000,00000000", "80-159"),
        ("00000005", "0,2"),
        ("00000000", None),
    ],
)
def test_nccl_cpu_masks_become_cpu_lists(mask: str, cpus: str | None) -> None:
    from gpu_topology.discovery.nccl_xml import _mask_to_list

    assert _mask_to_list(mask) == cpus


def test_automatic_discovery_lets_nvml_fill_what_an_old_drivers_matrix_lacks(
    tmp_path: Path, read_fixture: Callable[[str], str]
) -> None:
    query = "".join(f"{i}, GPU-{i}, 00000000:{0x10 + i:02X}:00.0\n" for i in range(8))
    binary = fake_nvidia_smi(tmp_path, read_fixture("dgx1-v100-4ib"), query=query)
    nvml = FakeNvml({i: [] for i in range(8)}, ancestor=40)
    options = {"nvidia-smi": {"binary": str(binary)}, "nvml": {"nvml": nvml}, "sysfs": {"root": tmp_path / "none"}}
    topology = discover(options=options)
    # The DGX-1 matrix has no NUMA column; NVML knows (GPU2's node is unknown to it too).
    assert [g.numa_node for g in topology.gpus] == [0, 0, None, 0, 0, 0, 0, 0]
    assert str(topology.link("GPU0", "GPU1")) == "NV1"  # the driver's matrix wins over NVML's NODE
    assert [n.name for n in topology.nics] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]


def test_merge_takes_a_measured_pcie_level_beneath_an_nvlink_the_first_source_lacks() -> None:
    first = Topology(gpus=(Gpu(0), Gpu(1)), links={"GPU0": {"GPU1": Link.parse("NV4")}})
    second = Topology(gpus=(Gpu(0), Gpu(1)), links={"GPU0": {"GPU1": Link(LinkKind.NVLINK, 4, pcie=LinkKind.PIX)}})
    merged = merge(first, second)
    assert merged.link("GPU1", "GPU0") == Link(LinkKind.NVLINK, 4, pcie=LinkKind.PIX)
    other = Topology(gpus=(Gpu(0), Gpu(1)), links={"GPU0": {"GPU1": Link(LinkKind.NVLINK, 2, pcie=LinkKind.PIX)}})
    assert merge(first, other).link("GPU0", "GPU1") == Link.parse("NV4")  # a different NVLink: the first wins


LENT_H100 = "lent-h100-vm-1gpu-nonic-driver580-gpu-numa-id"


class ReplayedNvml:
    """pynvml answering what a real H100 VM's NVML answered (tests/fixtures/nvml/*.json):
    a recorded "error: ..." value is raised as that NVMLError, as the real call raised it."""

    NVML_FEATURE_ENABLED = 1

    class NVMLError(Exception):
        pass

    def __init__(self, recorded: dict[str, Any]) -> None:
        self.gpus = recorded["gpus"]

    def _answer(self, handle: int, key: str) -> Any:
        value = self.gpus[handle][key]
        if isinstance(value, str) and value.startswith("error: "):
            raise self.NVMLError(value.removeprefix("error: "))
        return value

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return str(self._answer(handle, "uuid"))

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._answer(handle, "pci_bus_id"))

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return int(self._answer(handle, "numa_node"))

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        recorded = list(self._answer(handle, "cpu_affinity"))
        return (recorded + [0] * words)[:words]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        for answer in self.gpus[handle]["nvlink"]:
            if answer["link"] == link:
                if "error" in answer:
                    raise self.NVMLError(answer["error"])
                return int(answer["state"])
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        raise self.NVMLError("Not Supported")


def test_nvml_on_a_real_h100_vm_without_numa_or_nvlink_answers(fixtures_dir: Path) -> None:
    recorded = json.loads((fixtures_dir / "nvml" / "lent-h100-vm-1gpu-driver580.json").read_text())
    topology = NvmlBackend(nvml=ReplayedNvml(recorded)).discover()
    # NumaNodeId is NotSupported there: unknown, not node 0 and not an error; link 0 NotSupported
    # ends the NVLink walk; 0xFFFF in the first affinity word is CPUs 0-15.
    assert [(g.uuid, g.pci_bus_id, g.numa_node, g.cpu_affinity) for g in topology.gpus] == [
        ("GPU-3c693de9-02a4-966a-3c0c-bbfc6a0981e2", "0000:00:06.0", None, "0-15")
    ]
    assert topology.links == {}


def test_nvidia_smi_backend_on_a_real_h100_vms_outputs(
    tmp_path: Path, fixtures_dir: Path, read_fixture: Callable[[str], str]
) -> None:
    query = (fixtures_dir / "nvml" / "lent-h100-vm-1gpu-driver580-query-gpu.txt").read_text()
    topology = NvidiaSmiBackend(binary=str(fake_nvidia_smi(tmp_path, read_fixture(LENT_H100), query=query))).discover()
    # nvidia-smi reads the NUMA node from its NUMA Affinity column (0) where NVML has none.
    assert [(g.uuid, g.pci_bus_id, g.numa_node) for g in topology.gpus] == [
        ("GPU-3c693de9-02a4-966a-3c0c-bbfc6a0981e2", "0000:00:06.0", 0)
    ]
    assert topology.nics == ()
