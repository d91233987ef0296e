"""One pure module per score: :mod:`.dataset`, :mod:`.deadline`, :mod:`.numa`, :mod:`.stripe`, :mod:`.subnet`.

Each module has a raw score function of plain inputs and a way to bring the raw scores
of all candidate nodes to kube-scheduler's 0..10; :mod:`scheduler_plugin.framework`
fetches the inputs and combines the results.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress

MAX = 10


def normalize_to_max(raws: Sequence[float]) -> list[int]:
    """Scale raw scores so the best candidate gets 10 (rounded down); all-zero stays 0.

    The same rule as scheduler-plugins' ``NormalizeScore``: ``score * 10 / highest``.
    """
    highest = max(raws, default=0.0)
    out = [0] * len(raws)
    if highest <= 0:
        return out
    # Most candidates score 0 (a node holds few of the datasets asked for): only the
    # others are visited, found by compress() in C.
    for index in compress(range(len(raws)), raws):
        raw = raws[index]
        out[index] = MAX if raw >= highest else max(0, int(MAX * raw / highest))
    return out


__all__ = ["MAX", "normalize_to_max"]
