"""Whether a node is leaving the cluster: one rule for the Dataset controller and the node agent
(docs/design-striping.md#churn).

Who calls it: the controller (:func:`dsagent.controller.striping.stripe_status`, through
:func:`draining`), which moves a leaving member's stripe share to new owners; and the node
agent's cluster mode (:meth:`dsagent.nodeagent.clusterhooks.ClusterHooks.node_leaving`), which
on SIGTERM hands its shares off only when its own node is leaving: an agent restarted on a
node that stays (a rolling update) keeps its shares on disk for the agent that replaces it.

A node is leaving when it is cordoned (``spec.unschedulable``), or tainted ``NoSchedule`` or
``NoExecute`` with a key of :data:`DRAIN_TAINTS`: what ``kubectl cordon``/``drain``, the
cluster autoscaler's and Karpenter's scale-down set before they evict pods. Nodes are their
API objects as JSON (camelCase keys); nothing here calls the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"  # what kubectl cordon/drain implies
DRAIN_TAINTS = frozenset({UNSCHEDULABLE_TAINT, "ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted",
                          "karpenter.sh/disruption"})  # fmt: skip


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def node_leaving(node: Mapping[str, Any]) -> bool:
    """Whether ``node`` (its JSON) is cordoned or tainted for a drain (see the module docstring)."""
    spec = _mapping(node.get("spec"))
    raw = spec.get("taints")
    taints: list[Any] = raw if isinstance(raw, list) else []
    return spec.get("unschedulable") is True or any(
        isinstance(t, Mapping) and t.get("key") in DRAIN_TAINTS and t.get("effect") in ("NoSchedule", "NoExecute")
        for t in taints
    )


def draining(nodes: Iterable[Mapping[str, Any]]) -> set[str]:
    """The names of the ``nodes`` that are leaving (:func:`node_leaving`)."""
    return {str(_mapping(node.get("metadata")).get("name")) for node in nodes if node_leaving(node)}


__all__ = ["DRAIN_TAINTS", "UNSCHEDULABLE_TAINT", "draining", "node_leaving"]
