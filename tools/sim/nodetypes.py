"""The node types a simulated cluster is built from: short names for the topology fixtures.

Who calls it: :mod:`tools.sim.workload_file` (the ``nodes`` key of a workload file),
``run.py --list-node-types`` and :mod:`tools.sim.engine` (through ``ClusterParams``). It
owns the names; the GPUs and the RoCE class layout of each come from the real
``nvidia-smi topo -m`` dumps in ``tests/fixtures/topology/`` through the product's
``gpu_topology.roce_classes``, so a node type here is exactly what the extender would see
on such a node. Decision: only dumps that name their NICs are listed (a node with no RoCE
NIC has no class layout to choose by), and two machines per GPU generation at most.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_topology import roce_classes
from gpu_topology.dumps import load_dump

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "tests" / "fixtures" / "topology"

NODE_TYPES: dict[str, str] = {
    "dgx-a100": "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt",
    "v100-2nic": "oneflow-hugectr-8xV100-2nic-mangled-whitespace-nvidia-smi-topo-m.txt",
    "dgx1-v100": "dgx1-v100-4ib-nvidia-smi-topo-m.txt",
    "h100-11nic": "mystous-8xH100-11nic-ansi-escapes-captured-nvidia-smi-topo-m.txt",
    "a100-pcie-2gpu": "princeton-della-2xA100-pcie-2nic-epyc-nvidia-smi-topo-m.txt",
}


def fixture(name: str) -> str:
    """The topology dump file of a node type name (KeyError for an unknown one)."""
    return NODE_TYPES[name]


def describe() -> list[dict[str, Any]]:
    """Every node type as ``--list-node-types`` prints it: name, GPUs, RoCE class layout."""
    out = []
    for name, file in NODE_TYPES.items():
        topo = load_dump(TOPOLOGIES / file)
        out.append(
            {
                "name": name,
                "gpus": len(topo.gpus),
                "roce_classes": [{"name": c.name, "gpus": sorted(c.gpus)} for c in roce_classes(topo)],
                "topology_file": f"tests/fixtures/topology/{file}",
            }
        )
    return out


__all__ = ["NODE_TYPES", "TOPOLOGIES", "describe", "fixture"]
