"""A dataset's bundles unpacked in forked processes: the same verified, all-or-nothing result."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from dsagent.errors import IntegrityError
from dsagent.format import digestpool
from dsagent.format.bundles import extract
from dsagent.format.bundles.bundle import pack, unpack, verify_tree
from dsagent.format.manifest import bundle_path
from tests.dsagent.conftest import write_tree

pytestmark = pytest.mark.usefixtures("native_mode")  # each test with the native loops and the pure ones


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Processes even under a test runner with threads; records each pool's size."""
    sizes: list[int] = []
    original = extract._in_processes

    def recording(*args: object) -> None:
        sizes.append(args[-1])  # type: ignore[arg-type]
        original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(digestpool, "can_fork", lambda: True)
    monkeypatch.setattr(extract, "_in_processes", recording)
    return sizes


def _dataset(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    files = {f"c{i % 4}/{i:03d}.bin": os.urandom(1000 + 37 * i) for i in range(24)}
    return write_tree(tmp_path / "src", files, ("empty/dir",)), files


def test_several_bundles_unpack_in_processes_verified(tmp_path: Path, forking: list[int]) -> None:
    src, files = _dataset(tmp_path)
    manifest = pack(src, tmp_path / "store", name="d", max_files=5)
    assert len(manifest.bundles) >= 4
    seen: list[tuple[int, int]] = []
    unpack(tmp_path / "store", name="d", dest=tmp_path / "out", workers=2, progress=lambda b, f: seen.append((b, f)))
    assert forking == [2]
    verify_tree(tmp_path / "out", manifest)
    assert sum(b for b, _ in seen) == manifest.total_bytes and sum(f for _, f in seen) == len(files)
    assert multiprocessing.active_children() == []


def test_one_bad_bundle_fails_the_whole_unpack_and_leaves_nothing(tmp_path: Path, forking: list[int]) -> None:
    src, _ = _dataset(tmp_path)
    manifest = pack(src, tmp_path / "store", name="d", max_files=5)
    victim = Path(bundle_path(str(tmp_path / "store"), manifest.bundles[2].digest))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        unpack(tmp_path / "store", name="d", dest=tmp_path / "out", workers=2)
    assert forking == [2]
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_an_unpacking_process_that_dies_fails_cleanly(
    tmp_path: Path, forking: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, _ = _dataset(tmp_path)
    pack(src, tmp_path / "store", name="d", max_files=5)

    def dying(*args: object, **kwargs: object) -> None:
        os._exit(9)  # as the OOM killer leaves it

    monkeypatch.setattr(extract, "unpack_bundle", dying)  # inherited by the forked processes
    with pytest.raises(IntegrityError, match="an unpacking process of dataset 'd' died"):
        unpack(tmp_path / "store", name="d", dest=tmp_path / "out", workers=2)
    assert not (tmp_path / "out").exists()
