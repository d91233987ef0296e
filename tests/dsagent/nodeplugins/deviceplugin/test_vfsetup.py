"""VF creation against a fixture sysfs tree, and a VF's address over netlink in a network namespace.

The counts follow the RoCE design's claim 3 (a NIC gets as many VFs as it has affine GPUs)
on two real topologies; the address is set with pyroute2 on a dummy link inside a network
namespace the test creates (skipped where the test may not create one).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsagent.errors import InvalidInput
from dsagent.nodeplugins.deviceplugin.vfsetup import (
    VfSetupFailed,
    auto_counts,
    create_vfs,
    set_address,
    set_up_vfs,
    vf_counts,
)
from gpu_topology import Topology
from gpu_topology.discovery.sriov import discover_vfs
from gpu_topology.dumps import load_dump
from tests.sysfs_vf import build_vfs

MYSTOUS = "mystous-8xH100-11nic-ansi-escapes-captured-nvidia-smi-topo-m.txt"


def test_each_nic_gets_as_many_vfs_as_it_has_affine_gpus(dgx_a100: Topology, fixtures_dir: Path) -> None:
    # DGX A100: every GPU pair sits under two NICs, each near both GPUs
    assert vf_counts(dgx_a100) == {f"mlx5_{i}": 2 for i in range(8)}
    # 8xH100 with one NIC per GPU, except GPUs 6 and 7 sharing mlx5_8; mlx5_4 and 5 are near none
    h100 = load_dump(fixtures_dir / "topology" / MYSTOUS)
    counts = vf_counts(h100, [f"mlx5_{i}" for i in range(9)])
    assert counts == {
        **{f"mlx5_{i}": 1 for i in (0, 1, 2, 3, 6, 7)},
        "mlx5_4": 0,
        "mlx5_5": 0,
        "mlx5_8": 2,
    }


def test_create_vfs_writes_sriov_numvfs_and_leaves_a_nic_at_its_count_alone(tmp_path: Path) -> None:
    build_vfs(tmp_path, 3)  # mlx5_0..2, two VFs each, sriov_totalvfs 8
    numvfs = {pf: tmp_path / f"sys/class/infiniband/{pf}/device/sriov_numvfs" for pf in ("mlx5_0", "mlx5_1")}
    assert create_vfs(tmp_path, {"mlx5_0": 2, "mlx5_1": 4}) == ["mlx5_1"]
    assert numvfs["mlx5_0"].read_text().strip() == "2" and numvfs["mlx5_1"].read_text().strip() == "4"
    assert discover_vfs(tmp_path)["mlx5_1"].numvfs == 4
    assert create_vfs(tmp_path, {"mlx5_1": 4}) == []  # already there: no write, no VF recreated
    with pytest.raises(VfSetupFailed, match="0..8"):
        create_vfs(tmp_path, {"mlx5_2": 9})
    with pytest.raises(VfSetupFailed, match="no SR-IOV"):
        create_vfs(tmp_path, {"mlx5_9": 1})
    with pytest.raises(VfSetupFailed, match="no SR-IOV"):  # a VF is not a PF
        create_vfs(tmp_path, {"mlx5_10": 1})


def test_auto_creates_vfs_only_on_nics_with_sr_iov_and_none_yet(tmp_path: Path, dgx_a100: Topology) -> None:
    from tests.sysfs_vf import build_dgx_a100_vfs

    build_dgx_a100_vfs(tmp_path)  # mlx5_0..7, two VFs each, sriov_totalvfs 8
    device = tmp_path / "sys/class/infiniband"
    (device / "mlx5_4/device/sriov_numvfs").write_text("0\n")  # SR-IOV on, no VF yet: auto makes them
    (device / "mlx5_5/device/sriov_numvfs").write_text("0\n")
    (device / "mlx5_5/device/sriov_totalvfs").write_text("1\n")  # offers one: at most that
    (device / "mlx5_6/device/sriov_numvfs").write_text("0\n")
    (device / "mlx5_6/device/sriov_totalvfs").write_text("0\n")  # SR-IOV off in firmware: left alone
    pfs = discover_vfs(tmp_path)
    assert auto_counts(dgx_a100, pfs) == {"mlx5_4": 2, "mlx5_5": 1}  # the others have VFs already
    after = set_up_vfs(dgx_a100, pfs, tmp_path, "auto", None)
    assert (after["mlx5_4"].numvfs, after["mlx5_5"].numvfs, after["mlx5_6"].numvfs) == (2, 1, 0)
    assert after["mlx5_0"].numvfs == 2  # an operator's VFs untouched
    # a refusal under auto (the NIC offers fewer than asked by the time it is written):
    # logged, the NIC goes without VFs, the start goes on; under on it stops the start
    (device / "mlx5_6/device/sriov_totalvfs").write_text("8\n")
    seen = discover_vfs(tmp_path)
    (device / "mlx5_6/device/sriov_totalvfs").write_text("1\n")
    assert set_up_vfs(dgx_a100, seen, tmp_path, "auto", None)["mlx5_6"].numvfs == 0
    with pytest.raises(VfSetupFailed, match="0..1"):
        set_up_vfs(dgx_a100, seen, tmp_path, "on", None)


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh network namespace with a link ``vf0`` standing for a VF's netdev (dummy, else veth)."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2's ip command is not installed")
    name = f"dsvf-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace (needs CAP_SYS_ADMIN): {made.stderr.strip()}")
    try:
        dummy = ["ip", "-n", name, "link", "add", "vf0", "type", "dummy"]
        made = subprocess.run(dummy, capture_output=True, check=False, text=True)
        if made.returncode != 0:  # no dummy module in this kernel: one end of a veth pair
            veth = ["ip", "-n", name, "link", "add", "vf0", "type", "veth", "peer", "name", "vf0peer"]
            subprocess.run(veth, check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def link(name: str) -> dict[str, object]:
    out = subprocess.run(["ip", "-n", name, "-j", "addr", "show", "vf0"], check=True, capture_output=True, text=True)
    [entry] = json.loads(out.stdout)
    return dict(entry)


def ipv4(entry: dict[str, object]) -> list[str]:
    infos = entry.get("addr_info")
    assert isinstance(infos, list)
    return [f"{a['local']}/{a['prefixlen']}" for a in infos if a.get("family") == "inet"]


def test_set_address_gives_the_vf_one_address_and_brings_it_up(netns: str) -> None:
    pytest.importorskip("pyroute2")
    before = link(netns)
    assert "UP" not in before["flags"] and ipv4(before) == []  # type: ignore[operator]
    set_address("vf0", "10.1.0.11/24", netns=f"/var/run/netns/{netns}")
    after = link(netns)
    assert ipv4(after) == ["10.1.0.11/24"] and "UP" in after["flags"]  # type: ignore[operator]
    set_address("vf0", "10.1.0.11/24", netns=f"/var/run/netns/{netns}")  # idempotent
    assert ipv4(link(netns)) == ["10.1.0.11/24"]
    set_address("vf0", "10.2.0.12/16", netns=f"/var/run/netns/{netns}")  # a new address replaces the old one
    assert ipv4(link(netns)) == ["10.2.0.12/16"]


def test_set_address_refuses_bad_input_in_one_line(netns: str) -> None:
    pytest.importorskip("pyroute2")
    for bad in ("10.1.0.11", "10.1.0.300/24", "fe80::1/64", "x" * 1000):
        with pytest.raises(InvalidInput):
            set_address("vf0", bad, netns=f"/var/run/netns/{netns}")
    with pytest.raises(InvalidInput, match="no network device"):
        set_address("vf9", "10.1.0.11/24", netns=f"/var/run/netns/{netns}")
    assert ipv4(link(netns)) == []
