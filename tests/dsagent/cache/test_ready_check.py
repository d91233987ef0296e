"""The ready check's look at the disk (dsagent.cache.ready): every file of the manifest a
regular file of its size, on the native path (the lstat loop in C) and the pure one alike,
with the same words for every problem."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import pytest

from dsagent.cache import ready
from dsagent.errors import IntegrityError
from dsagent.format import native
from dsagent.format.digester import build_manifest
from dsagent.format.entries import EntryTable
from dsagent.format.manifest import Manifest
from dsplatform import cores

both_paths = pytest.mark.usefixtures("native_mode")


def tree(root: Path) -> Manifest:
    for i in range(40):
        path = root / f"class_{i % 4}" / f"{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(i * 7))
    (root / "empty").mkdir()
    odd = os.fsdecode(b"caf\xe9.bin")  # a name that is not UTF-8, as os.fsdecode gives it
    (root / odd).write_bytes(b"x" * 5)
    return build_manifest(root, name="ds")


@both_paths
def test_a_complete_copy_passes_and_each_kind_of_problem_is_named(tmp_path: Path) -> None:
    manifest = tree(tmp_path / "ds")
    root = tmp_path / "ds"
    ready.check_complete(root, manifest)
    assert ready.incomplete(root, manifest) == []

    (root / "class_1" / "005.bin").unlink()
    (root / "class_2" / "006.bin").write_bytes(b"longer than it was, by far, much longer")
    (root / "class_3" / "007.bin").unlink()
    (root / "class_3" / "007.bin").symlink_to(root / "class_3" / "011.bin")
    (root / "class_0" / "008.bin").unlink()
    (root / "class_0" / "008.bin").mkdir()
    (root / "empty").rmdir()
    assert ready.incomplete(root, manifest) == [
        "not a regular file: class_0/008.bin",
        "missing file: class_1/005.bin",
        "wrong size: class_2/006.bin (39 bytes, expected 42)",
        "not a regular file: class_3/007.bin",
        "missing directory: empty",
    ]
    with pytest.raises(IntegrityError, match=r"is not complete on disk, not publishing it: not a regular file"):
        ready.check_complete(root, manifest)


@both_paths
def test_a_range_of_entries_is_checked_alone(tmp_path: Path) -> None:
    manifest = tree(tmp_path / "ds")
    root = tmp_path / "ds"
    table = EntryTable.of(manifest.entries)
    victim = table.paths.index("class_2/010.bin")
    (root / "class_2" / "010.bin").unlink()
    assert ready.incomplete(root, manifest, range(victim + 1, len(table))) == []
    assert ready.incomplete(root, manifest, range(victim, victim + 3)) == ["missing file: class_2/010.bin"]
    odd = os.fsdecode(b"caf\xe9.bin")
    (root / odd).write_bytes(b"")
    assert ready.incomplete(root, manifest) == [
        f"wrong size: {odd} (0 bytes, expected 5)",
        "missing file: class_2/010.bin",
    ]


@both_paths
def test_a_directory_that_is_gone_is_refused(tmp_path: Path) -> None:
    manifest = tree(tmp_path / "ds")
    with pytest.raises(IntegrityError, match="is not a directory"):
        ready.check_complete(tmp_path / "gone", manifest)
    assert len(ready.incomplete(tmp_path / "gone", manifest)) == manifest.file_count + 1


def test_the_native_loop_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    if not native.LOADED:
        pytest.skip(f"the native loops are not here: {native.OFF_REASON}")
    sizes = array("Q", [1, 2])
    with pytest.raises(ValueError, match="one 64-bit size a path"):
        native.sized_files(str(tmp_path), ["a", "b", "c"], sizes, 0, 3)
    with pytest.raises(ValueError, match="out of range"):
        native.sized_files(str(tmp_path), ["a", "b"], sizes, 1, 3)
    with pytest.raises(TypeError):
        native.sized_files(str(tmp_path), ("a", "b"), sizes, 0, 2)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        native.sized_files(str(tmp_path / "gone"), ["a", "b"], sizes, 0, 2)
    (tmp_path / "b").write_bytes(b"xy")
    assert native.sized_files(str(tmp_path), ["a", "b"], sizes, 0, 2) == [0]
    assert native.sized_files(str(tmp_path), ["a", "b"], sizes, 1, 2) == []


def test_the_check_split_over_threads_finds_what_one_thread_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not native.LOADED:
        pytest.skip(f"the native loops are not here: {native.OFF_REASON}")
    monkeypatch.setattr(native, "AVAILABLE", True)
    manifest = tree(tmp_path / "ds")
    root = tmp_path / "ds"
    for name in ("class_0/000.bin", "class_1/021.bin", "class_3/039.bin"):  # first, middle, last of the tree
        (root / name).unlink()
    monkeypatch.setattr(ready, "_PER_THREAD", 10**9)
    alone = ready.incomplete(root, manifest)
    monkeypatch.setattr(ready, "_PER_THREAD", 4)
    monkeypatch.setattr(cores, "usable", lambda: 6)  # 41 files: six threads of seven
    assert (
        ready.incomplete(root, manifest)
        == alone
        == [
            "missing file: class_0/000.bin",
            "missing file: class_1/021.bin",
            "missing file: class_3/039.bin",
        ]
    )
