"""The extender reads exactly what the agent and gpu_topology publish.

The extender never imports the agent (an import contract); these tests hold the two
sides together through the published JSON: the agent's own schema and compaction, and
gpu_topology's JSON from a real machine's ``nvidia-smi topo -m``.
"""

from __future__ import annotations

import json

from dsagent.cache import inventory as agent_inventory
from gpu_topology.contract import topology_to_dict
from gpu_topology.discovery.nvidia_smi import parse_topo_matrix, with_inferred_nic_numa
from scheduler_plugin.plugins.numa import placement
from scheduler_plugin.testing import holding, inventory_json, node
from scheduling.nodeinfo import (
    INVENTORY_BUDGET,
    TOPOLOGY_BUDGET,
    NodeReader,
    parse_inventory,
)


def test_the_test_inventories_match_the_agents_schema() -> None:
    agent_inventory.validate(
        json.loads(inventory_json(datasets={"imagenet": holding(), "coco": holding("b" * 32, state="fetching")}))
    )
    assert INVENTORY_BUDGET == agent_inventory.ANNOTATION_BUDGET


def test_a_compacted_oversize_inventory_is_still_read() -> None:
    datasets = {f"ds-{i:04d}": holding(f"{i:032x}", state="ready" if i % 2 else "fetching") for i in range(600)}
    text = agent_inventory.compact(json.loads(inventory_json(datasets=datasets)))
    assert len(text.encode()) <= INVENTORY_BUDGET
    inventory, error = parse_inventory(text)
    assert error is None and inventory is not None and inventory.truncated
    # The agent drops non-ready entries first, so every ready dataset still scores.
    assert sum(h.ready for h in inventory.datasets.values()) == 300 < len(inventory.datasets) < 600


def test_a_real_dgx_topology_fits_its_budget_and_scores(read_fixture_text: str) -> None:
    topology = with_inferred_nic_numa(parse_topo_matrix(read_fixture_text))
    text = json.dumps(topology_to_dict(topology), separators=(",", ":"))
    assert len(text.encode()) <= TOPOLOGY_BUDGET
    facts = NodeReader().read(node("dgx", topology=text, free_gpus=[0, 1, 2, 5]))
    assert facts.topology is not None and facts.topology_error is None
    assert facts.free_gpus == {0, 1, 2, 5}
    assert placement(facts.topology, facts.free_gpus, 2) == 10  # GPUs 0,1 share NUMA node 3 and NICs at PXB


def test_what_the_cluster_agent_publishes_is_read_back() -> None:
    from dsagent.nodeagent.publisher import desired_annotations
    from scheduler_plugin.testing import topology_json

    inventory = json.loads(inventory_json("gpu-1", datasets={"imagenet": holding()}))
    annotations = desired_annotations(inventory, topology_json(), [0, 1, 4])
    obj = node("gpu-1")
    obj["metadata"]["annotations"].update(annotations)
    facts = NodeReader().read(obj)
    assert facts.inventory is not None and facts.inventory.datasets["imagenet"].ready
    assert facts.free_gpus == {0, 1, 4} and facts.free_by_class == {"gpu-roce1": 2, "gpu-roce2": 1}
    # Without a free list (GPU pods running), the extender counts allocatable minus requests.
    quiet = node("gpu-1", gpus=8)
    quiet["metadata"]["annotations"].update(desired_annotations(inventory, topology_json(), None))
    assert NodeReader().read(quiet, used_gpus=6).free_count == 2
