"""The Node annotations an agent publishes, read by the extender, the webhook and the controller.

Who calls it: the agent's publisher (writes them), ``scheduling.nodeinfo`` (the
extender), the webhook's GPU class vote and the Dataset controller (read them). One name per
annotation, so a writer and its readers cannot drift apart (docs/design.md#annotations).
"""

from __future__ import annotations

#: The datasets a node holds (JSON, the inventory schema).
INVENTORY = "dsagent.io/inventory"
#: The node's GPU topology and RoCE classes (JSON, the gpu_topology contract).
TOPOLOGY = "dsagent.io/topology"
#: The node's free GPU indices (``"0,1,4,5"``).
FREE_GPUS = "dsagent.io/free-gpus"

__all__ = ["FREE_GPUS", "INVENTORY", "TOPOLOGY"]
