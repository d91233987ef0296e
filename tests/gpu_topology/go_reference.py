"""An independent re-derivation of go-gpuallocator's best-effort policy, for the tests.

Written from the policy's description (NVIDIA/go-gpuallocator, gpuallocator/
besteffort_policy.go), not from gpu_topology.scoring: partitions of the available GPUs
into sets of ``size`` (padded with PAD to a multiple of ``size``; a set holds no padding
or all of it), visited with each set led by the first device not yet placed and its
other members in lexicographic order; for ``size`` 1 every device alone is a candidate
"partition". The first partition with the highest score among those holding an
unpadded set with every required GPU wins; from it, the first highest-scoring set
holding the required GPUs. Deliberately naive: no pruning, no caching.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

PAD = "pad"
Device = int | str
Partition = list[list[Device]]


def index_combinations(n: int, k: int, start: int = 0) -> Iterator[list[int]]:
    """k-subsets of range(start, n) as sorted index lists, lexicographically."""
    if k == 0:
        yield []
        return
    for i in range(start, n - k + 1):
        for tail in index_combinations(n, k - 1, i + 1):
            yield [i] + tail


def partitions(devices: Sequence[int], size: int) -> Iterator[Partition]:
    if size <= 0 or size > len(devices):
        return
    if size == 1:
        for d in devices:
            yield [[d]]
        return
    padded: list[Device] = list(devices)
    while len(padded) % size:
        padded.append(PAD)
    padding = padded.count(PAD)

    def walk(rest: list[Device], done: Partition) -> Iterator[Partition]:
        if len(rest) == size:
            yield done + [rest]
            return
        for picks in index_combinations(len(rest), size - 1, 1):
            group = [rest[0]] + [rest[i] for i in picks]
            if group.count(PAD) not in (0, padding):
                continue
            left = [d for d in rest if d not in group]
            yield from walk(left, done + [group])

    yield from walk(padded, [])


def set_score(group: Sequence[Device], pair: Callable[[int, int], int]) -> int:
    real = [d for d in group if d != PAD]
    return sum(pair(int(a), int(b)) for i, a in enumerate(real) for b in real[i + 1 :])


def allocate(
    available: Sequence[int], required: Sequence[int], size: int, pair: Callable[[int, int], int]
) -> tuple[list[Device], Partition | None]:
    """(go-gpuallocator's pick, the partition it came from); ([], None) when none."""
    available = sorted(available)
    if size <= 0 or len(available) < size or len(required) > size:
        return [], None
    best: Partition | None = None
    best_score = 0
    for candidate in partitions(available, size):
        if not any(set(required) <= set(g) and PAD not in g for g in candidate):
            continue
        score = sum(set_score(g, pair) for g in candidate)
        if best is None or score > best_score:
            best, best_score = candidate, score
    if best is None:
        return [], None
    holding = [g for g in best if set(required) <= set(g)]
    pick = holding[0]
    for g in holding[1:]:
        if set_score(g, pair) > set_score(pick, pair):
            pick = g
    return pick, best


def expected_choice(
    available: Sequence[int], required: Sequence[int], size: int, pair: Callable[[int, int], int]
) -> tuple[int, ...] | None:
    """go-gpuallocator's pick, except that where it would pick a padded set (and then
    fail) the best unpadded set of its partition holding the required GPUs is expected."""
    pick, partition = allocate(available, required, size, pair)
    if partition is None:
        return None
    if PAD in pick:
        whole = [g for g in partition if PAD not in g and set(required) <= set(g)]
        pick = whole[0]
        for g in whole[1:]:
            if set_score(g, pair) > set_score(pick, pair):
                pick = g
    return tuple(sorted(int(d) for d in pick))
