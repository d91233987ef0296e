"""What one namespace may make the cluster hold: the controller's tenancy bounds, pure.

Who calls it: the Dataset controller (:mod:`dsagent.controller.reconcile`), once per pass:
it builds a :class:`Ledger` with the chart's limits (:class:`Limits`,
``DSAGENT_CONTROLLER_*``) and each node's cache capacity; preparation
(:mod:`dsagent.controller.nextjob`), warm-up and replicas (:mod:`dsagent.controller.warmup`)
ask an :class:`Admitter` before each pin (warm-up and replicas in their rank order, stopping
once it is :meth:`~Admitter.closed`). No I/O and no clock: the same inputs give the same decisions, so a
new leader decides as the old one did (docs/operator-guide/tenancy.md).

Decisions:

- a Dataset's warm-up uses at most ``warm_nodes`` nodes and its copies at most
  ``replicas``, whatever its spec says (:func:`capped`);
- a pin of ``size`` bytes on a node is admitted while the namespace's pins on that node stay
  within ``node_share`` of its cache (:func:`dsplatform.tenancy.over_share`, the agents' own
  rule), its pins in the whole cluster within ``cluster_bytes``, and its open tasks within
  ``open_tasks``; otherwise the node is skipped (the next one in the caller's order may
  still fit) and the first reason is kept for the Dataset's ``Refused`` condition;
- a namespace's pins are charged in the order the controller meets them (Datasets in the
  API server's order, each one's nodes in its own order: the nodes it holds first), so what
  was admitted stays admitted from pass to pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dsplatform.tenancy import over_share
from dsplatform.units import format_size


@dataclass(frozen=True)
class Limits:
    warm_nodes: int = 8
    replicas: int = 16
    node_share: float = 0.5
    cluster_bytes: int | None = None
    open_tasks: int = 64


@dataclass(frozen=True)
class Refusal:
    """Why a spec field was held back: the condition's reason and a message with the numbers."""

    reason: str
    message: str


def capped(wanted: int, limit: int, reason: str, what: str) -> tuple[int, Refusal | None]:
    """``wanted`` held to ``limit``, and the refusal when it had to be."""
    if wanted <= limit:
        return wanted, None
    return limit, Refusal(reason, f"{what} asks for {wanted}; at most {limit} are used (this cluster's limit)")


class Ledger:
    """One pass's pins per namespace: bytes per node, bytes in all, open tasks."""

    def __init__(self, limits: Limits, capacities: Mapping[str, int | None]) -> None:
        self.limits = limits
        self.capacities = capacities
        self._node_bytes: dict[tuple[str, str], int] = {}
        self._bytes: dict[str, int] = {}
        self._tasks: dict[str, int] = {}

    def charge(self, namespace: str, node: str, size: int) -> None:
        """Count a pin without asking (a preparation the plan already made)."""
        self._node_bytes[(namespace, node)] = self._node_bytes.get((namespace, node), 0) + size
        self._bytes[namespace] = self._bytes.get(namespace, 0) + size
        self._tasks[namespace] = self._tasks.get(namespace, 0) + 1

    def refusal(self, namespace: str, node: str, size: int) -> Refusal | None:
        """Why a pin of ``size`` bytes on ``node`` is not admitted, or None."""
        why = self.blocked(namespace, size)
        if why is not None:
            return why
        limits = self.limits
        pinned = self._node_bytes.get((namespace, node), 0)
        if over_share(pinned, size, self.capacities.get(node), limits.node_share):
            capacity = self.capacities.get(node) or 0
            return Refusal(
                "NamespaceShare",
                f"namespace {namespace} would pin {format_size(pinned + size)} of node {node}'s"
                f" {format_size(capacity)} cache; at most {limits.node_share:.0%} is allowed",
            )
        return None

    def blocked(self, namespace: str, size: int) -> Refusal | None:
        """Why no pin of ``size`` bytes is admitted on any node now (the namespace's open tasks
        or its bytes in the cluster), or None: the bounds :meth:`refusal` checks first."""
        limits = self.limits
        tasks = self._tasks.get(namespace, 0)
        if tasks + 1 > limits.open_tasks:
            return Refusal(
                "NamespaceTasks",
                f"namespace {namespace} holds {tasks} warm-up and replica tasks;"
                f" at most {limits.open_tasks} are allowed",
            )
        total = self._bytes.get(namespace, 0)
        if limits.cluster_bytes is not None and total + size > limits.cluster_bytes:
            return Refusal(
                "NamespaceBytes",
                f"namespace {namespace} pins {format_size(total)} in the cluster; {format_size(size)} more would pass"
                f" its {format_size(limits.cluster_bytes)}",
            )
        return None

    def admitter(self, namespace: str, size: int) -> Admitter:
        """An :data:`Admitter` for one Dataset's pins; its first refusal is kept on it."""
        return Admitter(self, namespace, size)


class Admitter:
    """``admitter(node)``: True (and charged) when the pin is admitted; ``refused``: the first
    reason a node was skipped."""

    def __init__(self, ledger: Ledger, namespace: str, size: int) -> None:
        self.ledger, self.namespace, self.size = ledger, namespace, size
        self.refused: Refusal | None = None

    def __call__(self, node: str) -> bool:
        why = self.ledger.refusal(self.namespace, node, self.size)
        if why is None:
            self.ledger.charge(self.namespace, node, self.size)
            return True
        self.refused = self.refused or why
        return False

    def closed(self) -> bool:
        """Whether every node would be refused now (:meth:`Ledger.blocked`): a walk of the
        nodes in rank order may stop at its first refusal then, with the same picks and the
        same first reason, instead of asking each of thousands of nodes in turn."""
        return self.ledger.blocked(self.namespace, self.size) is not None


#: A node filter that charges what it admits.
Admit = Callable[[str], bool]

__all__ = ["Admit", "Admitter", "Ledger", "Limits", "Refusal", "capped"]
