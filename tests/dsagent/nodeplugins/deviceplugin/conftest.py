"""Fixtures for the kubelet edge: the DGX A100 topology with UUIDs, its VF sysfs, short socket dirs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpu_topology import Topology
from gpu_topology.discovery.nvidia_smi import parse_topo_matrix
from gpu_topology.discovery.sriov import PhysicalFunction, discover_vfs
from tests.sysfs_vf import build_dgx_a100_vfs

DGX_A100 = "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt"


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-{index:012x}"


@pytest.fixture(scope="session")
def dgx_a100(fixtures_dir: Path) -> Topology:
    """The real DGX A100 matrix, with made-up UUIDs (``nvidia-smi topo -m`` prints none)."""
    topology = parse_topo_matrix((fixtures_dir / "topology" / DGX_A100).read_text(encoding="utf-8"))
    gpus = tuple(dataclasses.replace(g, uuid=gpu_uuid(g.index)) for g in topology.gpus)
    return dataclasses.replace(topology, gpus=gpus)


@pytest.fixture
def dgx_vfs(tmp_path: Path) -> dict[str, PhysicalFunction]:
    build_dgx_a100_vfs(tmp_path / "sysroot")
    return discover_vfs(tmp_path / "sysroot")
