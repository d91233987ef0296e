"""gpu_topology: GPUs, NICs, NUMA nodes and their links; GPU-set scoring; RoCE classes.

A library: it imports nothing from Kubernetes, the web stack or the rest of dsplatform
but the shared vocabulary (``dsplatform``: its errors derive from the platform's one error
base; an import-linter contract checks it). The node agent publishes ``topology_to_dict(topology)``
as the Node annotation ``dsagent.io/topology``; the scheduler extender reads it back
with ``topology_from_dict`` and calls :func:`best_gpu_set` and :func:`roce_classes`.

    model        Gpu, Nic, Link, Topology            the frozen values
    scoring      pair_score, set_score, best_gpu_set  go-gpuallocator scores
    roceclasses  nearest_nics, roce_classes, ...      GPU-NIC affinity, RoCE classes, transfer NICs
    classvote    choose_class, ...                    the cluster-wide RoCE class vote
    classsets    choose_class_set, gpus_in_set, ...   one class set per multi-worker job
    contract     to/from the version-1 JSON           schema: topology.schema.json
    discovery    discover() and its backends          nvml, nvidia-smi, sysfs, nccl-xml
    errors       TopologyError and its tree
"""

from gpu_topology.contract import from_json, to_json, topology_from_dict, topology_to_dict
from gpu_topology.discovery import discover
from gpu_topology.errors import (
    BackendUnavailable,
    DiscoveryError,
    InvalidTopology,
    ParseError,
    TopologyError,
    UnknownDevice,
)
from gpu_topology.model import Gpu, Link, LinkKind, Nic, Topology
from gpu_topology.roceclasses import (
    ClassMode,
    RoceClass,
    nearest_nic_map,
    nearest_nics,
    roce_classes,
    roce_subnets,
    subnet_key,
    transfer_level,
    transfer_nics,
)
from gpu_topology.scoring import GpuSet, best_gpu_set, pair_score, set_score

__all__ = [
    "BackendUnavailable",
    "ClassMode",
    "DiscoveryError",
    "Gpu",
    "GpuSet",
    "InvalidTopology",
    "Link",
    "LinkKind",
    "Nic",
    "ParseError",
    "RoceClass",
    "Topology",
    "TopologyError",
    "UnknownDevice",
    "best_gpu_set",
    "discover",
    "from_json",
    "nearest_nic_map",
    "nearest_nics",
    "pair_score",
    "roce_classes",
    "roce_subnets",
    "set_score",
    "subnet_key",
    "to_json",
    "topology_from_dict",
    "topology_to_dict",
    "transfer_level",
    "transfer_nics",
]
