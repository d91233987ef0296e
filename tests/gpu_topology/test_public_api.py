"""The public surface the scheduler and the agent code against."""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Callable

import pytest

import gpu_topology
from gpu_topology import ClassMode, GpuSet, RoceClass, Topology, best_gpu_set, roce_classes
from gpu_topology.contract import topology_from_dict, topology_to_dict
from gpu_topology.dumps import parse_dump


def test_all_is_sorted_and_every_name_exists() -> None:
    assert gpu_topology.__all__ == sorted(gpu_topology.__all__)
    for name in gpu_topology.__all__:
        assert hasattr(gpu_topology, name), name


def test_the_public_signatures_hold() -> None:
    assert list(inspect.signature(best_gpu_set).parameters) == ["topology", "free", "count", "must_include"]
    assert list(inspect.signature(roce_classes).parameters) == ["topology", "prefix", "mode"]
    assert inspect.signature(roce_classes).parameters["prefix"].default == "gpu-roce"
    assert inspect.signature(roce_classes).parameters["mode"].default == ClassMode.NUMA == "numa"
    assert [f for f in GpuSet.__dataclass_fields__] == ["gpus", "score", "single_numa", "nic_level"]
    assert [f for f in RoceClass.__dataclass_fields__] == ["name", "nics", "numa_node", "subnets", "gpus"]


def test_topologies_are_frozen_hashable_picklable_and_deep_copyable(read_fixture: Callable[[str], str]) -> None:
    topology = parse_dump(read_fixture("dgx1-v100-4ib"))
    with pytest.raises(AttributeError):
        topology.gpus = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        topology.links["GPU0"]["GPU1"] = topology.links["GPU0"]["GPU2"]  # type: ignore[index]
    assert hash(topology) == hash(parse_dump(read_fixture("dgx1-v100-4ib")))
    assert pickle.loads(pickle.dumps(topology)) == topology
    assert copy.deepcopy(topology) == topology
    assert isinstance(topology_from_dict(topology_to_dict(topology)), Topology)
