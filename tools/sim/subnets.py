"""Whether a job that spans RoCE subnets could have stayed in one: the simple definition.

Who calls it: :mod:`tools.sim.engine` when a multi-worker job starts across subnets
(``jobs_across_subnets_avoidable`` in the ``--json`` output). Decision (a first, simple
definition; job-level class-set placement may refine it): a job was *avoidable* when,
with the free GPUs of the moment it started (its own GPUs given back), some set of RoCE
class names S had at least ``workers`` nodes on each of which ``gpus_per_worker`` free GPUs
use exactly the classes of S (at least one free GPU in each class of S, enough free inside
S, and no more classes than GPUs). Class *k* of every node is cabled to subnet *k*, so such
a placement keeps every worker in the same subnets whatever the node types.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.sim.engine import Node, Worker


def single_class_set_existed(nodes: Sequence[Node], workers: Sequence[Worker], gpus_per_worker: int) -> bool:
    taken: dict[int, set[int]] = {}
    for w in workers:
        taken.setdefault(w.node.index, set()).update(w.gpus)
    names = sorted({c.name for n in nodes for c in n.type.classes})
    for size in range(1, min(len(names), gpus_per_worker) + 1):
        for chosen in combinations(names, size):
            able = 0
            for n in nodes:
                free = n.free | taken.get(n.index, set())
                per_class = [sum(1 for g in free if n.type.class_of.get(g) == c) for c in chosen]
                if min(per_class) >= 1 and sum(per_class) >= gpus_per_worker:
                    able += 1
                    if able >= len(workers):
                        return True
    return False


__all__ = ["single_class_set_existed"]
