"""Fault injection over a multi-bundle fetch, a sample in the suite.

``tools/support/faults.py`` makes the Nth filesystem operation (open, write, fsync and
syncfs, rename, mkdir) or catalog commit of a fetch fail with ENOSPC, EIO or EDQUOT, or
kills the agent there, then repeats the same request with the fault gone, and checks after
each: failed with a clear code or ready with a copy that verifies; nothing in between
reported ready; no staging, reservation, bundle record or trash left. Here a spread of
points (the first, the last, and some between, each errno, once and from there on) and
a few kill -9 points; ``tools/faults/sweep.py`` runs every point.
The ENOSPC points during unpacking guard the invariant a retry needs: never ready with
files missing.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from tools.support.faults import Dataset, run_forked_kill_point, run_point

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("native_mode")]  # faults in the native loops and the pure ones


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return Dataset.make(tmp_path_factory.mktemp("faults"))


@pytest.fixture
def dataset(packed: Dataset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Dataset, int]:
    """The dataset and its count of points, counted with the loops of this test's mode."""
    data = packed
    outcome, injector = run_point(tmp_path_factory.mktemp("count"), data, None)
    assert outcome.violations == [] and outcome.first == "ready", outcome
    assert len(data.manifest().bundles) >= 3
    assert set(injector.kinds) == {"open", "write", "fsync", "rename", "mkdir", "commit"}, injector.kinds
    return data, injector.count


@pytest.mark.parametrize(
    ("fraction", "code", "persist"),
    [
        (0.0, errno.ENOSPC, True),
        (0.3, errno.ENOSPC, True),  # mid-unpack, the disk stays full
        (0.45, errno.ENOSPC, False),
        (0.6, errno.EIO, False),
        (0.7, errno.EDQUOT, True),
        (0.8, errno.EIO, True),
        (0.9, errno.ENOSPC, False),
        (1.0, errno.EIO, False),  # the last operation: the ready commit
    ],
)
def test_a_fault_at_point_n_then_the_same_request_never_publishes_anything_incomplete(
    dataset: tuple[Dataset, int], tmp_path: Path, fraction: float, code: int, persist: bool
) -> None:
    data, points = dataset
    at = max(1, round(fraction * points))
    outcome, injector = run_point(tmp_path, data, at, code=code, persist=persist)
    assert injector.fired >= 1, f"point {at} of {points} was not reached"
    assert outcome.violations == [], outcome
    assert outcome.first == "ready" or outcome.first.split(":")[0] in ("failed", "refused"), outcome
    assert outcome.retry == "ready", outcome


def test_every_tenth_point_with_enospc_from_there_on(dataset: tuple[Dataset, int], tmp_path: Path) -> None:
    data, points = dataset
    for at in range(1, points + 1, 10):
        outcome, _ = run_point(tmp_path / str(at), data, at, code=errno.ENOSPC, persist=True)
        assert outcome.violations == [], outcome


def test_kill_9_at_a_sample_of_points_then_a_restart_and_the_same_request(
    dataset: tuple[Dataset, int], tmp_path: Path
) -> None:
    data, points = dataset
    _, counted = run_point(tmp_path / "count", data, None)
    # the write of the version's manifest: a kill there left its temporary file for good
    # before (found by tools/faults/sweep.py)
    manifest_write = 1 + next(
        i for i, (kind, path) in enumerate(counted.ops) if "/manifests/" in path and kind == "write"
    )
    for at in sorted({1, manifest_write, points // 3, points // 2, (2 * points) // 3, points}):
        outcome = run_forked_kill_point(tmp_path / str(at), data, at)
        assert outcome.first == "killed", outcome
        assert outcome.violations == [], outcome
        assert outcome.retry == "ready", outcome


# a failing cache disk was reported as the source's failure (source_unavailable,
# "worth retrying") wherever it happened: unpacking, creating staging, finishing, publishing
@pytest.mark.parametrize("code", [errno.EIO, errno.EROFS], ids=["EIO", "EROFS"])
def test_a_cache_disk_error_anywhere_in_a_fetch_is_cache_disk_not_the_source(
    dataset: tuple[Dataset, int], tmp_path: Path, code: int
) -> None:
    data, _ = dataset
    _, counted = run_point(tmp_path / "count", data, None)
    # the first operation of each kind in each place: storing the manifest, creating and
    # finishing staging, a bundle's unpack, publishing
    first: dict[tuple[str, str], int] = {}
    for number, (kind, path) in enumerate(counted.ops, start=1):
        parts = path.split("/cache/", 1)[-1].split("/")
        # below a version's staging directory: a bundle's files, written by the unpack
        place = "unpack" if parts[0] == "staging" and len(parts) > 2 else parts[0]
        if kind != "commit" and (kind, place) not in first:
            first[(kind, place)] = number
    assert {("mkdir", "staging"), ("rename", "datasets"), ("write", "unpack"), ("fsync", "manifests")} <= set(first)
    for (kind, place), at in sorted(first.items(), key=lambda item: item[1]):
        outcome, injector = run_point(tmp_path / f"{code}-{at}", data, at, code=code)
        assert injector.fired == 1, (kind, place, at)
        assert outcome.violations == [], outcome
        if outcome.first != "ready":  # a failure retried inside the fetch may still end ready
            assert outcome.first in ("failed:cache_disk", "refused:cache_disk"), (kind, place, outcome)
        assert outcome.retry == "ready", outcome


def test_a_cache_disk_error_in_a_per_file_copy_is_cache_disk_not_the_source(
    dataset: tuple[Dataset, int], tmp_path: Path
) -> None:
    """A source without bundles is copied file by file; a failed write into the cache was
    is the cache disk's failure (cache_disk), never the source file's (source_unavailable)."""
    import asyncio

    from dsagent.cache.service import CacheService, DatasetRequest
    from tools.support.faults import Injector, _settings

    data, _ = dataset
    request = DatasetRequest(data.name, str(data.source))  # no bundle store: the per-file copy

    def fetch(root: Path, at: int | None) -> tuple[Any, Injector]:
        root.mkdir(parents=True)
        injector = Injector(root, at=at, code=errno.EIO, armed=False)

        async def scenario() -> Any:
            service = CacheService(_settings(root, data.source.parent))
            await service.start()
            try:
                injector.armed = True
                return await service.submit_task("pod-a", [request], wait=60)
            finally:
                injector.armed = False
                await service.stop()

        with injector:
            return asyncio.run(scenario()), injector

    record, counted = fetch(tmp_path / "count", None)
    assert record.state == "ready"
    writes = [n for n, (kind, path) in enumerate(counted.ops, 1) if kind == "write" and "/staging/" in path]
    opens = [n for n, (kind, path) in enumerate(counted.ops, 1) if kind == "open" and "/staging/" in path]
    for at in (writes[0], opens[0]):
        record, injector = fetch(tmp_path / str(at), at)
        assert injector.fired == 1 and record.state == "failed", (at, record)
        assert record.datasets[0].error["code"] == "cache_disk", record.datasets[0].error
