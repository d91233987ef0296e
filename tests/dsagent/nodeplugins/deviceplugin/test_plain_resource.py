"""The plain GPU resource (``nvidia.com/gpu``) served in NVIDIA's plugin's place, end to end
against the fake kubelet, on the recorded DGX A100 topology (4 RoCE classes of 2 GPUs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from dsagent.errors import InvalidInput
from dsagent.nodeplugins.deviceplugin.allocation import NodeDevices
from gpu_topology import Topology
from tests.dsagent.nodeplugins.deviceplugin.conftest import gpu_uuid
from tests.dsagent.nodeplugins.deviceplugin.test_deviceplugin import Node, run
from tests.sysfs_vf import vf_rdma

PLAIN = "nvidia.com/gpu"
EVERY = [gpu_uuid(i) for i in range(8)]


def test_the_plain_resource_is_registered_after_the_classes_over_every_gpu(
    short_dir: Path, dgx_a100: Topology, dgx_vfs: Any
) -> None:
    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs, plain=PLAIN) as node:
            names = [r.resource_name for r in node.kubelet.registrations]
            assert names[-1] == PLAIN and names[-2] == "dsagent.io/gpu-all" and "dsagent.io/gpu-roce1" in names
            reg = node.kubelet.registration(PLAIN)
            assert reg.options.get_preferred_allocation_available and reg.endpoint == "dsagent-gpu.sock"
            assert [d.ID for d in await node.kubelet.first_list(PLAIN)] == EVERY

    run(scenario())


def test_a_plain_container_is_placed_in_one_class_best_fit_and_shares_no_gpu_with_class_pods(
    short_dir: Path, dgx_a100: Topology, dgx_vfs: Any
) -> None:
    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs, plain=PLAIN) as node:
            kubelet = node.kubelet
            # every class has 2 free GPUs: a 2-GPU container takes class 1 whole (rail order)
            assert sorted(await kubelet.preferred(PLAIN, EVERY, [], 2)) == [gpu_uuid(0), gpu_uuid(1)]
            # a class-2 pod holds GPU 2: the plain resource reports it Unhealthy, and a
            # 1-GPU container is put in the class with the least room that holds it (GPU 3)
            await kubelet.allocate("dsagent.io/gpu-roce2", [gpu_uuid(2)])
            health = {d.ID: d.health for d in await kubelet.first_list(PLAIN)}
            assert health[gpu_uuid(2)] == "Unhealthy" and health[gpu_uuid(3)] == "Healthy"
            offered = [g for g in EVERY if g != gpu_uuid(2)]
            assert await kubelet.preferred(PLAIN, offered, [], 1) == [gpu_uuid(3)]
            # must-include GPU 4 (class 3): the class that holds it
            assert sorted(await kubelet.preferred(PLAIN, offered, [gpu_uuid(4)], 2)) == [gpu_uuid(4), gpu_uuid(5)]
            # three GPUs fit no class of two: the best set over the node
            assert len(await kubelet.preferred(PLAIN, offered, [], 3)) == 3
            # the plain container gets its GPUs and one VF of its class's NIC
            answer = await kubelet.allocate(PLAIN, [gpu_uuid(0), gpu_uuid(1)])
            assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu_uuid(0)},{gpu_uuid(1)}"
            assert answer.envs["NCCL_IB_HCA"] == f"={vf_rdma(0, 0)}"
            # and its GPUs are gone from the class resources; a class pod asking them is refused
            assert {d.health for d in await kubelet.first_list("dsagent.io/gpu-roce1")} == {"Unhealthy"}
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.allocate("dsagent.io/gpu-roce1", [gpu_uuid(0)])
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    run(scenario())


@pytest.mark.parametrize("plain", ["gpu", "nvidia.com/", "dsagent.io/gpu", "nvidia.com/gpu\n"])
def test_a_plain_resource_that_is_no_extended_name_outside_the_prefix_is_refused(
    dgx_a100: Topology, plain: str
) -> None:
    with pytest.raises(InvalidInput, match="plain GPU resource"):
        NodeDevices(dgx_a100, {}, plain=plain)


def test_one_class_is_best_fit_then_rail_order(dgx_a100: Topology) -> None:
    node = NodeDevices(dgx_a100, {}, plain=PLAIN)
    assert node.one_class(range(8), 2) == (0, 1)
    assert node.one_class([0, 1, 3, 4, 5], 1) == (3,)
    assert node.one_class([0, 1, 3, 4, 5], 2, must=[5]) == (4, 5)
    assert node.one_class([0, 2, 4, 6], 2) is None
    assert node.one_class(range(8), 1, must=[0, 7]) is None


def test_gpu_vf_pairs_one_vf_per_gpu_near_it_and_the_container_gets_its_first_pairs(
    short_dir: Path, dgx_a100: Topology, dgx_vfs: Any
) -> None:
    from dsagent.nodeplugins.deviceplugin.allocation import gpu_of
    from dsagent.nodeplugins.deviceplugin.podresources import ContainerDevices, free_gpu_indices
    from gpu_topology import nearest_nics

    node = NodeDevices(dgx_a100, dgx_vfs, pairs=True)
    pairs = {d.index: d for d in node.devices.values()}
    vfs = {d.vf for d in pairs.values()}
    assert len(pairs) == 8 and None not in vfs and len(vfs) == 8  # a VF of its own per GPU
    by_pci = {vf.pci_bus_id: vf for pf in dgx_vfs.values() for vf in pf.vfs}
    for index, device in pairs.items():
        assert device.id == f"{gpu_uuid(index)}_{device.vf}" and gpu_of(device.id) == gpu_uuid(index)
        assert by_pci[device.vf].pf in nearest_nics(dgx_a100, index)  # near its GPU
    # GPUs 0 and 1 share both of their NICs: one pair on each (the fewest pairs first)
    assert {by_pci[pairs[0].vf].pf, by_pci[pairs[1].vf].pf} == {"mlx5_0", "mlx5_1"}

    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs, pairs=True) as paired:
            kubelet = paired.kubelet
            listed = await kubelet.first_list("dsagent.io/gpu-roce1")
            assert [d.ID for d in listed] == [pairs[0].id, pairs[1].id]
            answer = await kubelet.allocate("dsagent.io/gpu-roce1", [pairs[1].id, pairs[0].id])
            assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu_uuid(0)},{gpu_uuid(1)}"
            # one VF, the first pair's (GPU 0's), as its verbs device node
            first = by_pci[pairs[0].vf]
            assert answer.envs["NCCL_IB_HCA"] == f"={first.rdma_device}"
            assert [d.host_path for d in answer.devices if "uverbs" in d.host_path] == [
                n for n in first.device_nodes if "uverbs" in n
            ]
            # held under the class: Unhealthy under gpu-all, and pod-resources' pair IDs count as used GPUs
            health = {d.ID: d.health for d in await kubelet.first_list("dsagent.io/gpu-all")}
            assert health[pairs[0].id] == health[pairs[1].id] == "Unhealthy"
            used = [ContainerDevices("ns", "w", "c", "dsagent.io/gpu-roce1", (pairs[0].id, pairs[1].id))]
            assert free_gpu_indices(dgx_a100, used, None) == [2, 3, 4, 5, 6, 7]

    run(scenario())
