"""A bundle from the store is unpacked in place, straight into the version's staging
directory (:func:`dsagent.cache.fetch.fetch_bundles`): no per-bundle stage is left behind,
and what an interrupted attempt left (partial files of a bundle never recorded) is cleared
before the bundle is unpacked again, so a resumed fetch ends with every file verified."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dsagent.cache.fetch import Source, fetch_bundles
from dsagent.cache.progress import FetchProgress
from dsagent.format.bundles.bundle import pack, verify_tree
from dsagent.format.bundles.extract import STAGING_DIR
from dsagent.format.manifest import BundleRef, Manifest
from dsplatform import cores


def _packed(tmp_path: Path) -> tuple[Path, Manifest]:
    source = tmp_path / "src"
    for i in range(12):
        path = source / f"d{i % 3}" / f"f{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(1000 + 37 * i))
    store = tmp_path / "store"
    return store, pack(source, store, name="ds", max_files=4)


def _fetch(store: Path, manifest: Manifest, staging: Path, done: set[str]) -> list[str]:
    recorded: list[str] = []

    async def record(bundle: BundleRef) -> None:
        recorded.append(bundle.digest)

    async def run() -> None:
        with ThreadPoolExecutor(2) as pool:
            await fetch_bundles(
                Source(str(store.parent / "src"), str(store)), manifest, staging, done=done, on_bundle_done=record,
                progress=FetchProgress(manifest.total_bytes, manifest.file_count), executor=pool, workers=2,
            )  # fmt: skip

    asyncio.run(run())
    return recorded


def test_a_fetch_writes_each_file_at_its_path_and_leaves_no_stage(tmp_path: Path) -> None:
    store, manifest = _packed(tmp_path)
    assert len(manifest.bundles) > 1
    staging = tmp_path / "staging"
    staging.mkdir()
    recorded = _fetch(store, manifest, staging, set())
    assert sorted(recorded) == sorted(b.digest for b in manifest.bundles)
    assert not (staging / STAGING_DIR).exists()
    verify_tree(staging, manifest)


def test_a_resumed_fetch_clears_what_an_unrecorded_attempt_left_and_verifies(tmp_path: Path) -> None:
    store, manifest = _packed(tmp_path)
    staging = tmp_path / "staging"
    staging.mkdir()
    first = manifest.bundles[0]
    second = next(b for b in manifest.bundles[1:] if b.count > 1)
    _fetch(store, manifest, staging, set())
    # a crash in the middle of the second bundle: some of its files written whole, one cut
    # short, one never written; the first bundle was recorded before the crash
    entries = list(manifest.bundle_entries(second))
    (staging / entries[0].path).write_bytes(b"partial")
    (staging / entries[1].path).unlink()
    recorded = _fetch(store, manifest, staging, {first.digest})
    assert first.digest not in recorded and second.digest in recorded
    verify_tree(staging, manifest)


def test_get_task_with_wait_answers_when_the_work_ends_not_after_the_wait(tmp_path: Path, memory_root: str) -> None:
    """A long poll (``GET /v1/tasks/{task}?wait=S``) is held while the task's work runs and
    answered as soon as it ends: a follower learns that the task is ready when it is."""
    import time

    from dsagent.cache.service import DatasetRequest
    from dsagent.cache.settings import Settings
    from tests.dsagent.cache.test_service_races import Gate, running, write_memory_dataset

    write_memory_dataset(memory_root, 3, b"w")
    settings = Settings(root=tmp_path / "agent", sweep_interval=3600)

    async def run() -> None:
        async with running(settings) as service:
            gate = Gate(service, "mark_ready")
            await service.submit_task("pod", [DatasetRequest("mem", memory_root)])
            await gate.reached.wait()
            held = asyncio.ensure_future(service.get_task("pod", wait=30))
            await asyncio.sleep(0.2)
            assert not held.done()  # held while the work runs
            started = time.monotonic()
            gate.open()
            record = await held
            assert record.state == "ready" and time.monotonic() - started < 10  # not the 30 s wait
            again = time.monotonic()
            assert (await service.get_task("pod", wait=30)).state == "ready"
            assert time.monotonic() - again < 10  # no work left: answered at once, not after the 30 s wait

    asyncio.run(run())


def test_a_fetch_gives_each_bundle_the_cores_the_bundles_at_once_leave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.cache import fetch

    store, manifest = _packed(tmp_path)
    given: list[int] = []
    real = fetch.unpack_bundle

    def spy(*args: object, decoders: int = 0, **kwargs: object) -> None:
        given.append(decoders)
        real(*args, decoders=decoders, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cores, "usable", lambda: 16)
    monkeypatch.setattr(fetch, "unpack_bundle", spy)
    staging = tmp_path / "staging"
    staging.mkdir()
    _fetch(store, manifest, staging, set())  # two bundles at once on 16 cores: 16 // 2 - 2 each
    assert given == [6] * len(manifest.bundles)
    verify_tree(staging, manifest)
