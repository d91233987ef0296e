"""The digest's walk in C (dsagent.format.walk.iter_native_dirs) against the Python one
(iter_local_dirs): the same files and empty directories under the same rules (links
followed and confined, loops and special files refused), in groups of at most _GROUP
names, on an awkward tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsagent.errors import InvalidInput
from dsagent.format import native
from dsagent.format import walk as walk_module
from tests.dsagent.conftest import AWKWARD_EMPTY_DIRS, AWKWARD_FILES, write_tree

pytestmark = pytest.mark.skipif(not native.LOADED, reason=f"the native loops are not here: {native.OFF_REASON}")


def walked(walk: object, root: Path, confine: list[str] | None = None) -> tuple[set[str], list[str], int]:
    """The walk's files (dataset path -> where the group says it is), its empty directories
    and its largest group."""
    empty: list[str] = []
    files: set[str] = set()
    largest = 0
    for rel, directory, names in walk(str(root), empty, confine):  # type: ignore[operator]
        largest = max(largest, len(names))
        for name in names:
            path = f"{rel}/{name}" if rel else name
            assert os.path.join(directory, name) == os.path.join(str(root), path)
            assert path not in files
            files.add(path)
    return files, sorted(empty), largest


def both(root: Path, confine: list[str] | None = None) -> tuple[set[str], list[str], int]:
    python = walked(walk_module.iter_local_dirs, root, confine)
    in_c = walked(walk_module.iter_native_dirs, root, confine)
    assert in_c == python
    return in_c


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    files = dict(AWKWARD_FILES)
    files.update({f"flat/{i:04d}.jpg": b"x" for i in range(600)})  # three groups
    root = write_tree(tmp_path / "src", files, AWKWARD_EMPTY_DIRS)
    (root / os.fsdecode(b"caf\xe9")).mkdir()  # a directory name that is not UTF-8
    (root / os.fsdecode(b"caf\xe9") / os.fsdecode(b"\xff.bin")).write_bytes(b"odd")
    (root / "linked.jpg").symlink_to(root / "train" / "cat" / "0001.jpg")
    elsewhere = write_tree(tmp_path / "elsewhere", {"level2/leaf.bin": b"leaf"})  # a linked tree, walked once
    (root / "linked-dir").symlink_to(elsewhere)
    return root


def test_the_same_files_groups_and_empty_directories_as_the_python_walk(tree: Path) -> None:
    files, empty, largest = both(tree)
    assert files >= {"linked.jpg", "linked-dir/level2/leaf.bin"}
    assert os.fsdecode(b"caf\xe9/\xff.bin") in files
    assert len(files) == len(AWKWARD_FILES) + 600 + 3
    assert empty == sorted(AWKWARD_EMPTY_DIRS)
    assert largest == walk_module._GROUP


def test_a_root_given_with_a_trailing_slash(tree: Path) -> None:
    root = Path(f"{tree}/")
    assert walked(walk_module.iter_native_dirs, root)[0] == walked(walk_module.iter_local_dirs, root)[0]


def test_confined_links_are_followed_inside_and_refused_outside(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    source = write_tree(allowed / "src", {"a/1.jpg": b"one"})
    (allowed / "shared.jpg").write_bytes(b"shared")
    (tmp_path / "outside").mkdir()
    (source / "a" / "2.jpg").symlink_to(allowed / "shared.jpg")
    assert both(source, [str(allowed)])[0] == {"a/1.jpg", "a/2.jpg"}
    (source / "etc").symlink_to(tmp_path / "outside")
    for walk in (walk_module.iter_local_dirs, walk_module.iter_native_dirs):
        with pytest.raises(InvalidInput, match="points outside"):
            walked(walk, source, [str(allowed)])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: (root / "a" / "loop").symlink_to(root), "directory loop through symlinks"),
        (lambda root: (root / "again").symlink_to(root / "b"), "directory loop through symlinks"),  # walked twice
        (lambda root: (root / "a" / "gone").symlink_to(root / "nowhere"), "broken symlink in source"),
        (lambda root: os.mkfifo(root / "a" / "pipe"), "not a regular file"),
    ],
)
def test_loops_broken_links_and_special_files_are_refused_by_both(tmp_path: Path, make: object, message: str) -> None:
    root = write_tree(tmp_path / "src", {"a/1.jpg": b"one", "b/2.jpg": b"two"})
    make(root)  # type: ignore[operator]
    for walk in (walk_module.iter_local_dirs, walk_module.iter_native_dirs):
        with pytest.raises(InvalidInput, match=message):
            walked(walk, root)


def test_a_directory_that_cannot_be_read_fails_as_os_error_with_its_path(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "src", {"a/1.jpg": b"one"})
    (root / "a").chmod(0)
    try:
        if os.access(root / "a", os.R_OK):
            pytest.skip("running with the rights to read any directory")
        with pytest.raises(PermissionError, match="a"):
            walked(walk_module.iter_native_dirs, root)
    finally:
        (root / "a").chmod(0o755)


def test_the_digest_walks_in_c_where_the_native_loops_run(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[str] = []
    for name in ("iter_local_dirs", "iter_native_dirs"):
        original = getattr(walk_module, name)

        def recording(*args: object, _original: object = original, _name: str = name) -> object:
            used.append(_name)
            return _original(*args)  # type: ignore[operator]

        monkeypatch.setattr(walk_module, name, recording)
    for available in (True, False):
        monkeypatch.setattr(native, "AVAILABLE", available)
        walk_module.walk_source(walk_module.LocalFiles(), str(tree), [])
    assert used == ["iter_native_dirs", "iter_local_dirs"]


def test_a_listing_on_threads_is_the_listing_on_one(tree: Path, tmp_path: Path) -> None:
    directories = sorted(str(p) for p in tree.rglob("*") if p.is_dir() and not p.is_symlink())
    prefixes = [f"{i}/" for i in range(len(directories))]
    for stat in (True, False):
        one = native.list_dirs(directories, prefixes, stat=stat)
        assert native.list_dirs(directories, prefixes, stat=stat, threads=4) == one
        assert native.list_dirs(directories, prefixes, stat=stat, threads=1000) == one
    gone = [*directories[:3], str(tmp_path / "gone-1"), *directories[3:], str(tmp_path / "gone-2")]
    for threads in (1, 4):
        with pytest.raises(FileNotFoundError, match="gone-1"):  # the first in order, whichever thread met it
            native.list_dirs(gone, [""] * len(gone), threads=threads)
