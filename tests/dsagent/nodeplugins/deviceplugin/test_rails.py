"""Transfers over every near NIC, and class-set resources, over real gRPC with the kubelet fakes.

The cross-node design: a worker whose GPUs are near several RoCE NICs gets one VF of each,
and NCCL is told to stripe over all of them without crossing rails (docs/design.md#roce-allocation).
Shapes: the DGX A100 (every GPU near its class's two NICs), and a held-out 8xH100 with
one NIC per GPU in class 1 and two GPUs sharing mlx5_8 in class 2.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpu_topology import Topology, nearest_nics
from gpu_topology.discovery.sriov import discover_vfs
from gpu_topology.dumps import load_dump
from tests.dsagent.nodeplugins.deviceplugin.conftest import gpu_uuid
from tests.dsagent.nodeplugins.deviceplugin.test_deviceplugin import Node, run
from tests.sysfs_vf import build_vfs, vf_rdma, vf_uverbs

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


def test_a_class_set_worker_gets_its_share_of_each_class_and_a_vf_per_near_nic(
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
            # GPUs 0-3 are near mlx5_0..3: one VF of each, all named for NCCL, rails kept apart
            hca = f"={vf_rdma(0, 0)},{vf_rdma(1, 0)},{vf_rdma(2, 0)},{vf_rdma(3, 0)}"
            assert answer.envs["NCCL_IB_HCA"] == hca and answer.envs["NCCL_CROSS_NIC"] == "0"
            assert [d.host_path for d in answer.devices if "uverbs" in d.host_path] == [
                vf_uverbs(pf, 0) for pf in range(4)
            ]
            assert f"NCCL_IB_HCA={hca}" in conf_lines(answer) and "NCCL_CROSS_NIC=0" in conf_lines(answer)
            # held under the set: offered to nobody under the classes or another set
            for other in ("dsagent.io/gpu-roce2", "dsagent.io/gpu-roce2-3"):
                health = {d.ID: d.health for d in await kubelet.first_list(other)}
                assert health[gpu_uuid(2)] == "Unhealthy"

    run(scenario())


def test_one_vf_per_nic_near_the_gpus_on_a_held_out_one_nic_per_gpu_shape(short_dir: Path, h100: Topology) -> None:
    build_vfs(short_dir / "sys", 9)  # mlx5_0..8, as the fixture's RoCE NICs
    vfs = discover_vfs(short_dir / "sys")
    near = {g.index: nearest_nics(h100, g.index) for g in h100.gpus}
    assert near[0] == ("mlx5_0",) and near[3] == ("mlx5_3",) and near[6] == near[7] == ("mlx5_8",)

    async def scenario() -> None:
        async with Node(short_dir / "node", h100, vfs) as node:
            kubelet = node.kubelet
            four = await kubelet.allocate("dsagent.io/gpu-roce1", [gpu_uuid(i) for i in range(4)])
            assert four.envs["NCCL_IB_HCA"] == "=" + ",".join(vf_rdma(pf, 0) for pf in range(4))
            assert four.envs["NCCL_CROSS_NIC"] == "0"
            assert four.envs["NCCL_SOCKET_IFNAME"] == "=ens0v0,ens1v0,ens2v0,ens3v0"
            # two GPUs sharing one NIC: one VF, of that NIC, and nothing to stripe
            pair = await kubelet.allocate("dsagent.io/gpu-roce2", [gpu_uuid(6), gpu_uuid(7)])
            assert pair.envs["NCCL_IB_HCA"] == f"={vf_rdma(8, 0)}" and "NCCL_CROSS_NIC" not in pair.envs
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
            pair = await node.kubelet.allocate("dsagent.io/gpu-roce1", [gpu_uuid(0), gpu_uuid(1)])
            assert pair.envs["NCCL_IB_HCA"] == f"={vf_rdma(6, 0)},{vf_rdma(7, 0)}"  # mlx5_6 (GPU 1), mlx5_7 (GPU 0)
            whole = await node.kubelet.allocate("dsagent.io/gpu-roce1-2", [gpu_uuid(i) for i in range(2, 8)])
            assert whole.envs["NCCL_IB_HCA"].lstrip("=").split(",") == [vf_rdma(pf, 0) for pf in (4, 5, 0, 1, 2, 3)]
            assert whole.envs["NCCL_CROSS_NIC"] == "0"

    run(scenario())
