"""Dataset affinity, exactly as docs/design.md#dataset-affinity defines it.

Raw score of a node for a pod:

- the node holds every requested dataset ready and current: the number of datasets;
- it holds only some of them, or none: 0;
- the pod would update a dataset that is in use on the node: 0;
- the pod's or the node's dataset information cannot be parsed: 0.

"Current" means the node's newest version has the digest the pod pins; a pod that pins
no digest accepts the node's ready copy (the agent checks consistency against the
source when the pod starts). The raw scores are normalized to 0..10 over the candidate
nodes. It is a score, never a filter.

Optional ``partial`` mode (off by default, not in the design): a node holding only some
of the datasets earns ``count x (cached bytes / requested bytes)``, with each dataset's
size taken from the inventories of the candidates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet

from scheduler_plugin.plugins import normalize_to_max
from scheduling.nodeinfo import Holding, Inventory
from scheduling.podspec import DatasetWant


def affinity(
    wants: Sequence[DatasetWant],
    inventory: Inventory | None,
    *,
    sizes: Mapping[str, int] | None = None,
) -> float:
    """The design's raw score; pass ``sizes`` (name -> bytes) to turn on partial credit.

    ``inventory`` is None when the node published none or it could not be parsed.
    """
    if not wants or inventory is None:
        return 0.0
    datasets = inventory.datasets
    held: list[DatasetWant] = []
    for want in wants:
        holding = datasets.get(want.name)
        if holding is None:
            if sizes is None:
                return 0.0  # cannot hold them all; the fast path for most nodes
            continue
        current = want.digest is None or want.digest == holding.digest
        if not current and holding.in_use:
            return 0.0  # the pod would replace a version that running tasks use
        if current and holding.ready:
            held.append(want)
    if len(held) == len(wants):
        return float(len(wants))
    if sizes is None or not held:
        return 0.0
    return len(wants) * _fraction(held, wants, sizes)


def holding_all(
    wants: Sequence[DatasetWant],
    ready: Mapping[str, AbstractSet[str]],
    ready_at: Mapping[tuple[str, str], AbstractSet[str]],
) -> set[str]:
    """The nodes whose :func:`affinity` (without partial credit) is ``len(wants)``, from an
    index instead of a call per node: those holding every wanted dataset ready and current.

    ``ready`` maps a dataset name to the nodes holding it ready; ``ready_at`` maps (name,
    digest) to the nodes whose ready copy is that version. Every other node scores 0, so
    the normalized dataset score is 10 for these nodes and 0 for the rest.
    """
    if not wants:
        return set()
    groups = sorted(
        (ready.get(w.name, ()) if w.digest is None else ready_at.get((w.name, w.digest), ()) for w in wants), key=len
    )
    return set(groups[0]).intersection(*groups[1:])


def is_current(want: DatasetWant, holding: Holding) -> bool:
    """Whether the node's newest copy is the version the pod asks for."""
    return want.digest is None or want.digest == holding.digest


def _fraction(held: Sequence[DatasetWant], wants: Sequence[DatasetWant], sizes: Mapping[str, int]) -> float:
    known = [sizes[w.name] for w in wants if w.name in sizes]
    # A dataset no candidate reports a size for weighs as much as the average one.
    fallback = sum(known) / len(known) if known else 1.0
    total = sum(float(sizes.get(w.name, fallback)) for w in wants)
    cached = sum(float(sizes.get(w.name, fallback)) for w in held)
    return min(1.0, cached / total) if total > 0 else 0.0


def requested_sizes(wants: Sequence[DatasetWant], inventories: Iterable[Inventory | None]) -> dict[str, int]:
    """Size of each requested dataset: as its Dataset resource publishes it, else the
    largest any inventory reports for that version."""
    sizes: dict[str, int] = {}
    for inventory in inventories:
        if inventory is None:
            continue
        for want in wants:
            holding = inventory.datasets.get(want.name)
            if holding is None or holding.size_bytes is None or not is_current(want, holding):
                continue
            if holding.size_bytes > sizes.get(want.name, -1):
                sizes[want.name] = holding.size_bytes
    sizes.update({w.name: w.size_bytes for w in wants if w.size_bytes is not None})
    return sizes


def normalize(raws: Sequence[float]) -> list[int]:
    """0..10 over the candidates: the best-holding nodes get 10."""
    return normalize_to_max(raws)


__all__ = ["affinity", "holding_all", "is_current", "normalize", "requested_sizes"]
