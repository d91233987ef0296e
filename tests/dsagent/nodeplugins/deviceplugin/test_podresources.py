"""The pod-resources client over real gRPC, and the rule that turns its answer into free GPUs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dsagent.nodeplugins.deviceplugin.podresources import (
    ContainerDevices,
    PodResourcesClient,
    PodResourcesUnavailable,
    free_gpu_indices,
)
from gpu_topology import Topology
from tests.dsagent.nodeplugins.deviceplugin.conftest import gpu_uuid
from tests.fake_kubelet import FakePodResources

PREFIXES = ("nvidia.com/", "dsagent.io/gpu-")


def held(resource: str, *ids: str) -> ContainerDevices:
    return ContainerDevices("ns", "pod", "main", resource, ids)


def test_free_gpus_rule(dgx_a100: Topology) -> None:
    everything = {"nvidia.com/gpu": [gpu_uuid(i) for i in range(8)]}
    used = [
        held("nvidia.com/gpu", gpu_uuid(1), gpu_uuid(6)),
        held("dsagent.io/gpu-roce2", gpu_uuid(2)),
        held("example.com/nic", "eth-vf-3"),
    ]  # not a GPU resource: ignored
    assert free_gpu_indices(dgx_a100, used, everything, PREFIXES) == [0, 3, 4, 5, 7]
    # only what some plugin advertises can be free; no allocatable answer: every GPU counts
    assert free_gpu_indices(dgx_a100, [], {"nvidia.com/gpu": [gpu_uuid(0)]}, PREFIXES) == [0]
    assert free_gpu_indices(dgx_a100, [], {}, PREFIXES) == []
    assert free_gpu_indices(dgx_a100, [], None, PREFIXES) == list(range(8))
    # a GPU resource holding an id we cannot place (a MIG slice): do not guess
    assert free_gpu_indices(dgx_a100, [held("nvidia.com/mig-1g.5gb", "MIG-abc")], None, PREFIXES) is None


def test_free_gpus_need_uuids(fixtures_dir: Path) -> None:
    from gpu_topology.dumps import load_dump

    topology = load_dump(fixtures_dir / "topology" / "dgx1-v100-4ib-nvidia-smi-topo-m.txt")
    assert free_gpu_indices(topology, [], None) is None


def test_client_against_a_fake_kubelet(short_dir: Path, dgx_a100: Topology) -> None:
    async def scenario() -> None:
        fake = FakePodResources(short_dir / "pr.sock")
        await fake.start()
        try:
            client = PodResourcesClient(short_dir / "pr.sock")
            fake.pods = [("team", "w0", [("dsagent.io/gpu-roce1", [gpu_uuid(0), gpu_uuid(1)])])]
            fake.allocatable = {
                "dsagent.io/gpu-roce1": [gpu_uuid(0), gpu_uuid(1)],
                "dsagent.io/gpu-roce2": [gpu_uuid(2), gpu_uuid(3)],
            }
            assert await client.containers() == [
                ContainerDevices("team", "w0", "main", "dsagent.io/gpu-roce1", (gpu_uuid(0), gpu_uuid(1)))
            ]
            assert await client.listed() == [("dsagent.io/gpu-roce1", [gpu_uuid(0), gpu_uuid(1)])]
            assert await client.free_gpus(dgx_a100, PREFIXES) == [2, 3]
            fake.allocatable = None  # a kubelet older than 1.21
            assert await client.allocatable() is None
            assert await client.free_gpus(dgx_a100, PREFIXES) == [2, 3, 4, 5, 6, 7]
        finally:
            await fake.stop()
        with pytest.raises(PodResourcesUnavailable):
            await PodResourcesClient(short_dir / "missing.sock").containers()
        (short_dir / "dead.sock").touch()  # a file, not a listening socket
        with pytest.raises(PodResourcesUnavailable, match="List failed"):
            await PodResourcesClient(short_dir / "dead.sock", timeout=2).containers()

    asyncio.run(asyncio.wait_for(scenario(), 60))
