"""Which hardware-bound mechanisms run on a node under ``auto``, and how the node says so: pure
functions of its topology (docs/design.md#defaults).

Who calls it: :func:`dsagent.nodeagent.nodeparts.decide_device_plugin` at start-up, when
``DSAGENT_DEVICE_PLUGIN=auto`` (the chart's default), with the topology it discovered; it
writes what :func:`node_patch` and :func:`status_patch` say on the agent's Node and records
an Event with :data:`Decision.reason` and :data:`Decision.message`.

The rule: the RoCE-class path (the GPU-RoCE classes as resources, one VF per container,
served by this agent's device plugin) runs on a node whose RoCE NICs near its GPUs sit in
**two or more NUMA groups**, where the design's classes differ (gpu-roce-allocation: a
class per NUMA group of the node's RoCE NICs). A node with one group, or no RDMA NIC near a
GPU, has a single class at best: there NVIDIA's device plugin serves the GPUs as
``nvidia.com/gpu``. The two never serve one node: on a node where this plugin runs the
agent labels it ``dsagent.io/device-plugin=true`` and ``nvidia.com/gpu.deploy.device-plugin=false``
(the label the NVIDIA GPU Operator reads to keep its device plugin off a node); a plain
NVIDIA DaemonSet needs a node affinity on the first label (docs/user-guide/gpu-allocation.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsplatform.published import DEVICE_PLUGIN_LABEL
from gpu_topology import Topology, roce_classes

#: the Node condition the agent keeps on its Node: which device plugin serves the GPUs
CONDITION = "DsplatformRoceClasses"
#: the Node condition of the fetch links: which NICs a version's fetches spread over
LINKS_CONDITION = "DsplatformFetchLinks"
#: the agent's label: this node's GPUs are served by the agent's device plugin
PLUGIN_LABEL = DEVICE_PLUGIN_LABEL
#: the NVIDIA GPU Operator's label that keeps its device plugin off a node
NVIDIA_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"


@dataclass(frozen=True)
class Decision:
    """Whether the RoCE-class path runs on this node, and why (a Node condition's reason and message)."""

    on: bool
    reason: str
    message: str
    classes: tuple[str, ...] = ()


def roce_path(topology: Topology, *, mode: str = "numa", prefix: str = "gpu-roce") -> Decision:
    """The RoCE-class path on this node: on where its GPU-affine RoCE NICs sit in two or more
    NUMA groups, that is where the node has two or more classes (a class per NUMA group; where
    a NIC's NUMA node is not known, per PCIe domain: :func:`gpu_topology.roce_classes`), off
    otherwise."""
    classes = roce_classes(topology, prefix=prefix, mode=mode)
    if not classes:
        return Decision(False, "NoRoceNics", "no RDMA NIC near a GPU: NVIDIA's device plugin serves the GPUs")
    names = tuple(c.name for c in classes)
    if len(classes) < 2:
        return Decision(
            False,
            "OneNumaGroup",
            "the RoCE NICs near the GPUs sit in one NUMA group (one class): NVIDIA's device plugin serves the GPUs",
            names,
        )
    nics = sum(len(c.nics) for c in classes)
    return Decision(
        True,
        "RoceNicsInNumaGroups",
        f"{nics} RoCE NICs in {len(classes)} NUMA groups (classes {', '.join(names)}): "
        "this agent's device plugin serves the GPUs as class resources, one VF per container",
        names,
    )


def node_patch(decision: Decision, labels: dict[str, str], plugin_label: str = PLUGIN_LABEL) -> dict[str, Any]:
    """The merge patch of the Node's labels for ``decision`` (``labels``: the Node's now):
    ours (``plugin_label``, the chart's ``agent.devicePlugin.nodeLabel``) set to
    ``true``/``false``, NVIDIA's set to ``false`` where ours runs, and taken back where ours
    does not and it was ours that set it (ours was ``true``)."""
    want: dict[str, str | None] = {plugin_label: "true" if decision.on else "false"}
    if decision.on:
        want[NVIDIA_PLUGIN_LABEL] = "false"
    elif labels.get(plugin_label) == "true" and labels.get(NVIDIA_PLUGIN_LABEL) == "false":
        want[NVIDIA_PLUGIN_LABEL] = None  # set by this agent before: NVIDIA's plugin may come back
    changed = {k: v for k, v in want.items() if labels.get(k) != v}
    return {"metadata": {"labels": changed}} if changed else {}


def release_patch(labels: dict[str, str], plugin_label: str = PLUGIN_LABEL) -> dict[str, Any]:
    """The merge patch handing a node back to NVIDIA's device plugin for good (the release is
    uninstalled): our label removed, and NVIDIA's where ours set it (ours ``true``, NVIDIA's
    ``false``), so the GPU Operator puts its plugin back; {} for a node ours never served."""
    if labels.get(plugin_label) is None:
        return {}
    want: dict[str, str | None] = {plugin_label: None}
    if labels.get(plugin_label) == "true" and labels.get(NVIDIA_PLUGIN_LABEL) == "false":
        want[NVIDIA_PLUGIN_LABEL] = None
    return {"metadata": {"labels": want}}


RELEASED = Decision(False, "Uninstalled", "dsplatform was uninstalled: NVIDIA's device plugin serves the GPUs")


def status_patch(decision: Decision, now: str, condition: str = CONDITION) -> dict[str, Any]:
    """The strategic merge patch of the Node's status with ``condition`` for ``decision``
    (conditions merge by type, so the kubelet's own are left as they are)."""
    return {
        "status": {
            "conditions": [
                {
                    "type": condition,
                    "status": "True" if decision.on else "False",
                    "reason": decision.reason,
                    "message": decision.message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        }
    }


__all__ = [
    "CONDITION",
    "LINKS_CONDITION",
    "Decision",
    "NVIDIA_PLUGIN_LABEL",
    "PLUGIN_LABEL",
    "RELEASED",
    "node_patch",
    "release_patch",
    "roce_path",
    "status_patch",
]
