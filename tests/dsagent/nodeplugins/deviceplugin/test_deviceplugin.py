"""The device plugin end to end against a fake kubelet and a fake pod-resources server.

Real gRPC over unix sockets with the committed stubs; the DGX A100 fixture topology
(4 RoCE classes of 2 GPUs, two NICs each) and the synthetic VF sysfs of tests/sysfs_vf.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from dsagent.nodeplugins.deviceplugin.allocation import NodeDevices
from dsagent.nodeplugins.deviceplugin.plugin import DevicePlugin
from dsagent.nodeplugins.deviceplugin.podresources import PodResourcesClient
from dsagent.nodeplugins.proto import deviceplugin_v1beta1_pb2 as dp
from dsagent.nodeplugins.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from gpu_topology import Topology, best_gpu_set
from tests.dsagent.nodeplugins.deviceplugin.conftest import gpu_uuid
from tests.fake_kubelet import FakeKubelet, FakePodResources
from tests.sysfs_vf import ROCE_V2_INDEX, vf_rdma

ROCE1 = "dsagent.io/gpu-roce1"
ALL = "dsagent.io/gpu-all"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


class Node:
    """A fake kubelet, a fake pod-resources server and the plugin, started together."""

    def __init__(
        self, base: Path, topology: Topology, vfs: Any, state: Path | None = None, plain: str = "", pairs: bool = False
    ) -> None:
        (base / "dp").mkdir(parents=True)
        self.kubelet = FakeKubelet(base / "dp")
        self.pods = FakePodResources(base / "pr.sock")
        self.client = PodResourcesClient(base / "pr.sock")
        self.now = 1000.0
        self.plugin = DevicePlugin(
            NodeDevices(topology, vfs, plain=plain, pairs=pairs),
            state_dir=state or base / "state",
            plugin_dir=base / "dp",
            listed=self.client.listed,
            poll_interval=0.05,
            reconcile_interval=3600,
            grace=5,
            clock=lambda: self.now,
        )

    async def __aenter__(self) -> Node:
        await self.kubelet.start()
        await self.pods.start()
        await self.plugin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.plugin.stop()
        await self.pods.stop()
        await self.kubelet.stop()


def test_register_advertise_prefer_allocate_and_free(short_dir: Path, dgx_a100: Topology, dgx_vfs: Any) -> None:
    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs) as node:
            kubelet = node.kubelet
            names = [r.resource_name for r in kubelet.registrations]
            sets = ["1-2", "1-2-3", "1-2-3-4", "2-3", "2-3-4", "3-4"]  # runs of classes (docs/design.md#class-sets)
            assert names == [f"dsagent.io/gpu-roce{i}" for i in (1, 2, 3, 4)] + [
                f"dsagent.io/gpu-roce{s}" for s in sets
            ] + [ALL]
            reg = kubelet.registration(ROCE1)
            assert reg.version == "v1beta1" and reg.options.get_preferred_allocation_available
            assert (short_dir / "dp" / reg.endpoint).exists()

            # class 1 = GPUs 0, 1 on NUMA node 3 (the fixture's NPS4 layout)
            devices = await kubelet.first_list(ROCE1)
            assert [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in devices] == [
                (gpu_uuid(0), "Healthy", [3]),
                (gpu_uuid(1), "Healthy", [3]),
            ]

            # preferred allocation of 4 from the whole node = best_gpu_set, must-include honoured
            everything = [gpu_uuid(i) for i in range(8)]
            expected = best_gpu_set(dgx_a100, range(8), 4, [5])
            assert expected is not None
            got = await kubelet.preferred(ALL, everything, [gpu_uuid(5)], 4)
            assert got == [gpu_uuid(i) for i in expected.gpus] and gpu_uuid(5) in got

            # Allocate: UUIDs and ONE VF, of a NIC GPU 0 is near (mlx5_0 and mlx5_1, both PXB):
            # the lowest of the first NIC, named in nccl.conf
            first = await kubelet.allocate(ROCE1, [gpu_uuid(0)])
            assert first.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(0)
            vf_paths = [d.host_path for d in first.devices if "uverbs" in d.host_path]
            assert vf_paths == ["/dev/infiniband/uverbs10"]
            hca = first.envs["NCCL_IB_HCA"]
            assert hca == f"={vf_rdma(0, 0)}" and "NCCL_CROSS_NIC" not in first.envs
            assert first.envs["NCCL_IB_GID_INDEX"] == str(ROCE_V2_INDEX)
            (mount,) = first.mounts
            assert mount.container_path == "/etc/nccl.conf" and mount.read_only
            conf = Path(mount.host_path).read_text()
            assert f"NCCL_IB_HCA={hca}\n" in conf and f"NCCL_IB_GID_INDEX={ROCE_V2_INDEX}\n" in conf

            # a second container of the class gets a VF of the less used near NIC (mlx5_1)
            second = await kubelet.allocate(ROCE1, [gpu_uuid(1)])
            assert second.envs["NCCL_IB_HCA"] == f"={vf_rdma(1, 0)}"
            assert {d.host_path for d in second.devices} != {d.host_path for d in first.devices}

            # the pods run: pod-resources lists them; nothing is freed
            node.pods.pods = [("ns", "w0", [(ROCE1, [gpu_uuid(0)])]), ("ns", "w1", [(ROCE1, [gpu_uuid(1)])])]
            node.now += 60
            assert await node.plugin.reconcile() == []

            # GPU 0 and 1 are held under gpu-roce1: Unhealthy under gpu-all
            health = {d.ID: d.health for d in await kubelet.first_list(ALL)}
            assert health[gpu_uuid(0)] == health[gpu_uuid(1)] == "Unhealthy" and health[gpu_uuid(2)] == "Healthy"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.allocate(ALL, [gpu_uuid(0), gpu_uuid(2)])
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

            # pod w0 is gone: its VF is freed and goes to the next container
            node.pods.pods = node.pods.pods[1:]
            freed = await node.plugin.reconcile()
            assert [a.gpus for a in freed] == [(gpu_uuid(0),)]
            assert not Path(mount.host_path).exists()
            third = await kubelet.allocate(ROCE1, [gpu_uuid(0)])
            assert third.envs["NCCL_IB_HCA"] == hca

    run(scenario())


def test_whole_node_worker_gets_one_vf_of_the_first_rail(short_dir: Path, dgx_a100: Topology, dgx_vfs: Any) -> None:
    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs) as node:
            everything = [gpu_uuid(i) for i in range(8)]
            # an open ListAndWatch stream, as the kubelet keeps one, sees the change
            async with node.kubelet.channel("dsagent.io/gpu-roce4") as channel:
                stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
                assert {d.health for d in (await stream.read()).devices} == {"Healthy"}
                answer = await node.kubelet.allocate(ALL, everything)
                assert {d.health for d in (await asyncio.wait_for(stream.read(), 10)).devices} == {"Unhealthy"}
                stream.cancel()
            assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(sorted(everything))
            # one VF for the container, of class 1's first NIC (near GPUs 0 and 1)
            assert answer.envs["NCCL_IB_HCA"] == f"={vf_rdma(0, 0)}"
            assert [d.host_path for d in answer.devices if "uverbs" in d.host_path] == ["/dev/infiniband/uverbs10"]
            for i in (1, 2, 3, 4):
                health = {d.health for d in await node.kubelet.first_list(f"dsagent.io/gpu-roce{i}")}
                assert health == {"Unhealthy"}

    run(scenario())


def test_hostile_requests_get_clear_statuses(short_dir: Path, dgx_a100: Topology, dgx_vfs: Any) -> None:
    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs) as node:
            kubelet = node.kubelet
            cases = [
                kubelet.allocate(ROCE1, [gpu_uuid(2)]),  # a GPU of another class
                kubelet.allocate(ROCE1, ["GPU-nope"]),
                kubelet.allocate(ROCE1, [gpu_uuid(0), gpu_uuid(0)]),
                kubelet.allocate(ROCE1, []),
                kubelet.allocate(ROCE1, ["x" * 10000]),
                kubelet.preferred(ROCE1, [gpu_uuid(0)], [], 0),
                kubelet.preferred(ROCE1, [gpu_uuid(0)], [gpu_uuid(7)], 1),
            ]
            for case in cases:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await case
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
                assert "Traceback" not in (err.value.details() or "")

    run(scenario())


def test_reregisters_after_kubelet_restart_and_keeps_allocations(
    short_dir: Path, dgx_a100: Topology, dgx_vfs: Any
) -> None:
    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs) as node:
            before = await node.kubelet.allocate(ROCE1, [gpu_uuid(0)])
            await node.kubelet.restart()
            await asyncio.wait_for(node.kubelet.registered.wait(), 10)
            await asyncio.sleep(0.2)  # every resource registers in one round
            count = len(node.plugin.node.resources)
            assert {r.resource_name for r in node.kubelet.registrations[-count:]} == set(node.plugin.node.resources)
            assert node.plugin.registrations == 2
            again = await node.kubelet.allocate(ROCE1, [gpu_uuid(0)])  # the kubelet re-allocates after restart
            assert again.envs == before.envs
        # a new agent process restores the record: the VF stays with its allocation
        async with Node(short_dir / "again", dgx_a100, dgx_vfs, state=short_dir / "state") as node:
            other = await node.kubelet.allocate(ROCE1, [gpu_uuid(1)])
            assert other.envs["NCCL_IB_HCA"] != before.envs["NCCL_IB_HCA"]

    run(scenario())


def test_a_vfs_address_is_set_as_its_container_is_created(
    short_dir: Path, dgx_a100: Topology, dgx_vfs: Any, tmp_path: Path
) -> None:
    # the design sets a VF's address when the training container starts: Allocate, which the
    # kubelet calls as it creates the container, sets the address the operator's file gives
    # the VF chosen (read again at each call), and refuses the container when it cannot
    from dsagent.nodeplugins.deviceplugin.vfsetup import AddressAtAllocation, VfSetupFailed

    netdevs = [vf.netdev for pf in dgx_vfs.values() for vf in pf.vfs if vf.netdev]
    addresses = tmp_path / "addresses.json"
    addresses.write_text(json.dumps({"ens0v0": "10.1.0.11/24"}))
    set_now: list[tuple[str, str]] = []
    failing = {"on": False}

    def setter(netdev: str, address: str) -> None:
        if failing["on"]:
            raise VfSetupFailed(f"setting {address} on {netdev}: Operation not permitted")
        set_now.append((netdev, address))

    async def scenario() -> None:
        async with Node(short_dir, dgx_a100, dgx_vfs) as node:
            node.plugin.vf_addresses = AddressAtAllocation(addresses, netdevs, setter)
            assert set_now == []  # nothing at start
            first = await node.kubelet.allocate(ROCE1, [gpu_uuid(0)])
            assert first.envs["NCCL_IB_HCA"] == f"={vf_rdma(0, 0)}"
            assert set_now == [("ens0v0", "10.1.0.11/24")]  # the VF given, as its container is created
            # a VF the file does not name keeps what it has (an IPAM may own it)
            await node.kubelet.allocate(ROCE1, [gpu_uuid(1)])
            assert set_now == [("ens0v0", "10.1.0.11/24")]
            # the kernel refuses: the container is refused with the reason, not started without an address
            node.pods.pods = [("ns", "w1", [(ROCE1, [gpu_uuid(1)])])]
            node.now += 60
            await node.plugin.reconcile()
            failing["on"] = True
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await node.kubelet.allocate(ROCE1, [gpu_uuid(0)])
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "Operation not permitted" in (err.value.details() or "")

    run(scenario())
