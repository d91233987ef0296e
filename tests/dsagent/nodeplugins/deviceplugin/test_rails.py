"""The container's one VF on several NIC shapes, and class-set resources, over real gRPC with the kubelet fakes.

The RoCE design: a container gets one VF, of a NIC affine to its GPUs; a class-set worker's
VF is on its set's first rail, so every worker of the set shares one subnet
(docs/design.md#roce-allocation).
Shapes: the DGX A100 (every GPU near its class's two NICs), and a held-out 8xH100 with
one NIC per GPU in class 1 and two GPUs sharing mlx5_8 in class 2.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpu_topology import Topology, nearest_nics
from gpu_topology.discovery.sriov import discover_vfs
from gpu_topology.dumps import load_dump
from tests.dsagent.nodeplugins.deviceplugin.conftest import gpu_uuid
from tests.dsagent.nodeplugins.deviceplugin.test_deviceplugin import Node, run
from tests.sysfs_vf import build_vfs, vf_bus, vf_rdma, vf_uverbs

MYSTOUS = "mystous-8xH100-11nic-ansi-escapes-captured-nvidia-smi-topo-m.txt"


@pytest.fixture(scope="module")
def h100(fixtures_dir: Path) -> Topology:
    topology = load_dump(fixtures_dir / "topology" / MYSTOUS)
    return dataclasses.replace(
        topology, gpus=tuple(dataclasses.replace(g, uuid=gpu_uuid(g.index)) for g in topology.gpus)
    )


def conf_lines(answer: Any) -> list[str]:
    [mount] = answer.mounts
    return Path(mount.host_path).read_text(encoding="utf-8").splitlines()


def test_a_class_set_worker_gets_its_share_of_each_class_and_one_vf_of_the_first_rail(
    short_dir: Path, dgx_a100: Topology, dgx_vfs: Any
) -> None:
    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs) as node:
            kubelet = node.kubelet
            resource = "dsagent.io/gpu-roce1-2"  # classes 1 (GPUs 0, 1) and 2 (GPUs 2, 3)
            devices = [d.ID for d in await kubelet.first_list(resource)]
            assert devices == [gpu_uuid(i) for i in range(4)]
            preferred = await kubelet.preferred(resource, devices, [], 2)
            assert sorted(preferred) == [gpu_uuid(0), gpu_uuid(2)]  # rail-aligned: one GPU per class
            answer = await kubelet.allocate(resource, devices)
            # GPUs 0-3 are near mlx5_0..3: one VF, of class 1's first NIC (the set's first rail)
            hca = f"={vf_rdma(0, 0)}"
            assert answer.envs["NCCL_IB_HCA"] == hca and "NCCL_CROSS_NIC" not in answer.envs
            assert [d.host_path for d in answer.devices if "uverbs" in d.host_path] == [vf_uverbs(0, 0)]
            assert f"NCCL_IB_HCA={hca}" in conf_lines(answer)
            # held under the set: offered to nobody under the classes or another set
            for other in ("dsagent.io/gpu-roce2", "dsagent.io/gpu-roce2-3"):
                health = {d.ID: d.health for d in await kubelet.first_list(other)}
                assert health[gpu_uuid(2)] == "Unhealthy"

    run(scenario())


def test_one_vf_of_a_nic_near_the_gpus_on_a_held_out_one_nic_per_gpu_shape(short_dir: Path, h100: Topology) -> None:
    build_vfs(short_dir / "sys", 9)  # mlx5_0..8, as the fixture's RoCE NICs
    vfs = discover_vfs(short_dir / "sys")
    near = {g.index: nearest_nics(h100, g.index) for g in h100.gpus}
    assert near[0] == ("mlx5_0",) and near[3] == ("mlx5_3",) and near[6] == near[7] == ("mlx5_8",)

    async def scenario() -> None:
        async with Node(short_dir / "node", h100, vfs) as node:
            kubelet = node.kubelet
            four = await kubelet.allocate("dsagent.io/gpu-roce1", [gpu_uuid(i) for i in range(4)])
            assert four.envs["NCCL_IB_HCA"] == f"={vf_rdma(0, 0)}" and "NCCL_CROSS_NIC" not in four.envs
            assert four.envs["NCCL_SOCKET_IFNAME"] == "=ens0v0"
            # two GPUs sharing one NIC: the VF of that NIC
            pair = await kubelet.allocate("dsagent.io/gpu-roce2", [gpu_uuid(6), gpu_uuid(7)])
            assert pair.envs["NCCL_IB_HCA"] == f"={vf_rdma(8, 0)}"
            # GPU 4 alone: only its own NIC (mlx5_6), not every NIC of its class
            single = await kubelet.allocate("dsagent.io/gpu-roce2", [gpu_uuid(4)])
            assert single.envs["NCCL_IB_HCA"] == f"={vf_rdma(6, 0)}"

    run(scenario())


IBM = "ibm-cloud-gx3d-8xH100-vsi-nccl-topo.xml"


def test_the_8_nic_nccl_dump_gets_the_vf_of_each_gpus_own_nic(short_dir: Path, fixtures_dir: Path) -> None:
    # IBM's 8xH100 NCCL topology: GPU i sits under mlx5_{7-i}; class 1 = GPUs 0-3 (mlx5_4..7)
    topology = load_dump(fixtures_dir / "topology" / IBM)
    topology = dataclasses.replace(
        topology, gpus=tuple(dataclasses.replace(g, uuid=gpu_uuid(g.index)) for g in topology.gpus)
    )
    build_vfs(short_dir / "sys", 8)
    vfs = discover_vfs(short_dir / "sys")

    async def scenario() -> None:
        async with Node(short_dir / "node", topology, vfs) as node:
            # GPUs 0 and 1 sit under mlx5_7 and mlx5_6: one VF, of the first of them in class order
            pair = await node.kubelet.allocate("dsagent.io/gpu-roce1", [gpu_uuid(0), gpu_uuid(1)])
            assert pair.envs["NCCL_IB_HCA"] == f"={vf_rdma(6, 0)}"
            # a set worker on GPUs 2-7: class 1's GPUs 2 and 3 are near mlx5_5 and mlx5_4
            whole = await node.kubelet.allocate("dsagent.io/gpu-roce1-2", [gpu_uuid(i) for i in range(2, 8)])
            assert whole.envs["NCCL_IB_HCA"] == f"={vf_rdma(4, 0)}" and "NCCL_CROSS_NIC" not in whole.envs

    run(scenario())


def test_a_nic_without_a_free_vf_gives_way_and_a_class_without_any_refuses(short_dir: Path, h100: Topology) -> None:
    """Class 2 of the 8xH100: GPUs 4, 5 under mlx5_6, mlx5_7; GPUs 6, 7 share mlx5_8."""
    from dsagent.nodeplugins.deviceplugin.allocation import Ledger, NodeDevices, NoFreeVf

    build_vfs(short_dir / "sys", 9)
    device = short_dir / "sys/sys/class/infiniband/mlx5_8/device"
    shutil.rmtree((device / "virtfn1").resolve() / "infiniband_verbs")  # its driver unbound: unusable
    ledger = Ledger(NodeDevices(h100, discover_vfs(short_dir / "sys")))
    roce2 = "dsagent.io/gpu-roce2"
    assert ledger.allocate(roce2, [gpu_uuid(6)], 0).vfs == (vf_bus(8, 0),)
    # mlx5_8 has no free VF left: GPU 7's VF comes from the least used other NIC of its class
    assert ledger.allocate(roce2, [gpu_uuid(7)], 0).vfs == (vf_bus(6, 0),)
    assert ledger.allocate(roce2, [gpu_uuid(4)], 0).vfs == (vf_bus(6, 1),)  # its own NIC, the next VF
    assert ledger.allocate(roce2, [gpu_uuid(5)], 0).vfs == (vf_bus(7, 0),)
    # every container holds one VF; none is held twice
    held = [vf for a in ledger.allocations.values() for vf in a.vfs]
    assert len(held) == len(set(held)) == 4
    # a record of several VFs per container (as older agents wrote) still loads
    again = Ledger(ledger.node)
    record = json.loads(ledger.to_json())
    record["allocations"][0]["vfs"].append(vf_bus(7, 1))
    again.load_json(json.dumps(record))
    assert len(again.allocations) == 4
    # no usable VF on a class's NICs: GPUs only; every usable VF taken: refused in one line
    build_vfs(short_dir / "sys2", 9)
    for pf, vf in [(pf, vf) for pf in (0, 1, 2, 3, 6, 7) for vf in (0, 1)] + [(8, 1)]:
        shutil.rmtree(
            (short_dir / f"sys2/sys/class/infiniband/mlx5_{pf}/device/virtfn{vf}").resolve() / "infiniband_verbs"
        )
    scarce = Ledger(NodeDevices(h100, discover_vfs(short_dir / "sys2")))
    assert scarce.allocate("dsagent.io/gpu-roce1", [gpu_uuid(0)], 0).vfs == ()
    assert scarce.allocate(roce2, [gpu_uuid(6)], 0).vfs == (vf_bus(8, 0),)
    with pytest.raises(NoFreeVf, match="is taken"):
        scarce.allocate(roce2, [gpu_uuid(7)], 0)
    assert len(scarce.allocations) == 2  # the refused container holds nothing
