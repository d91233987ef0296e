"""One pure module per score: :mod:`.dataset`, :mod:`.roce`, :mod:`.numa`.

Each module has a raw score function of plain inputs and a way to bring the raw scores
of all candidate nodes to kube-scheduler's 0..10; :mod:`scheduler_plugin.framework`
fetches the inputs and combines the results.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX = 10


def normalize_to_max(raws: Sequence[float]) -> list[int]:
    """Scale raw scores so the best candidate gets 10 (rounded down); all-zero stays 0.

    The same rule as scheduler-plugins' ``NormalizeScore``: ``score * 10 / highest``.
    """
    highest = max(raws, default=0.0)
    if highest <= 0:
        return [0] * len(raws)
    return [MAX if raw >= highest else max(0, int(MAX * raw / highest)) for raw in raws]


__all__ = ["MAX", "normalize_to_max"]
