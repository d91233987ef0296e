"""The deadline design's plan decision over the nodes as their agents publish them.

Who calls it: the extender's ``GET /v1/plan`` (advice, :mod:`scheduler_plugin.plugins.deadline`),
the admission webhook, which applies the plan to a pod that opts in
(:mod:`dsagent.webhook.deadlineplan`), and the Dataset controller's plan loop, which plans a
gated multi-worker job across nodes (:mod:`scheduling.gatedjobs`): all read the same nodes the
same way, so the plan a person is shown is the plan a pod is given. Pure: nodes and the time
in, a :class:`~scheduling.timemodel.Decision` out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduling.nodeinfo import NodeFacts, pod_bandwidth
from scheduling.timemodel import (
    DEFAULT_BANDWIDTHS,
    DEFAULT_FORMULA,
    Bandwidths,
    Decision,
    JobProfile,
    decide,
    plan_bandwidth,
)


def plan_on_nodes(
    job: JobProfile,
    nodes: Sequence[NodeFacts],
    *,
    now: float,
    max_gpus: int,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
    formula: str = DEFAULT_FORMULA,
    sizes: Iterable[int] | None = None,
    cross_node: bool = True,
    unit: int = 1,
) -> Decision:
    """Steps 3-4 over ``nodes`` (those with free GPUs): each node's share of a plan gets its
    best free GPU set, whose weakest link is its ``bw``; ``formula`` names (12)'s stand-in,
    ``sizes`` and ``cross_node`` limit the plans tried (:func:`scheduling.timemodel.decide`).
    ``unit``: the GPUs of one worker of a job whose workers each ask for that many; each
    node's free GPUs count in whole workers (rounded down to a multiple of ``unit``), so every
    share of a plan, single-node or cross-node, is whole workers."""
    step = max(1, unit)
    by_name = {n.name: n for n in nodes if len(n.free_gpus or ()) >= step}
    free = {name: len(n.free_gpus or ()) // step * step for name, n in by_name.items()}

    def bandwidth_of(allocation: tuple[tuple[str, int], ...]) -> float:
        per_node = []
        for name, count in allocation:
            node = by_name[name]
            found = pod_bandwidth(node.topology, node.free_gpus, count, 1, bandwidths)
            per_node.append(found[0] if found is not None else bandwidths.sys)
        return plan_bandwidth(per_node, bandwidths)

    return decide(
        job, free, bandwidth_of, now=now, max_gpus=max_gpus, formula=formula, sizes=sizes, cross_node=cross_node
    )


def plan_sizes(asked: int, most: int) -> list[int]:
    """The GPU counts a plan may have: powers of two up to ``most`` and the count asked for
    (as the simulator tries them; a global batch divides evenly over a power of two)."""
    sizes = {asked} if 1 <= asked <= most else set()
    n = 1
    while n <= most:
        sizes.add(n)
        n *= 2
    return sorted(sizes)


__all__ = ["plan_on_nodes", "plan_sizes"]
