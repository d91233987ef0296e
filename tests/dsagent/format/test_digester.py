"""Digesting local trees: the same entries, errors and cache behaviour on processes as on threads."""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import xxhash

from dsagent.errors import IntegrityError, InvalidInput, NotFound, SourceUnavailable
from dsagent.format import digester, digestpool
from dsagent.format import walk as walk_module
from dsagent.format.digestcache import DigestCache
from dsagent.format.digester import build_manifest
from dsagent.format.hashing import CHUNK_SIZE, HASH_BUFFER, ReadBuffer, hash_fd, read_buffer
from tests.dsagent.conftest import AWKWARD_EMPTY_DIRS, AWKWARD_FILES, write_tree

# Tests that force the process path fork beside the daemon threads other tests leave (fsspec's
# IO loop); Python >= 3.12 warns about that. The hashing workers only read files.
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every process pool a digest starts (appended as it starts); the pure-Python
    loops run even where the native extension is built (tests/dsagent/format/test_native.py)."""
    monkeypatch.setattr(digester.native_loops, "AVAILABLE", False)
    started: list[int] = []
    original = digestpool.ProcessPool.__init__

    def recording(
        self: digestpool.ProcessPool,
        processes: int,
        snapshot: dict[str, tuple[int, int, int, int, str]] | None,
        **options: bool,
    ) -> None:
        started.append(processes)
        original(self, processes, snapshot, **options)

    monkeypatch.setattr(digestpool.ProcessPool, "__init__", recording)
    return started


@pytest.fixture
def on_processes(monkeypatch: pytest.MonkeyPatch, pools: list[int]) -> list[int]:
    """Small trees digest on processes too, in requests of three files (many round trips)."""
    monkeypatch.setattr(digester, "PROCESS_MIN_FILES", 2)
    monkeypatch.setattr(digestpool, "REQUEST_FILES", 3)
    monkeypatch.setattr(digester, "can_fork", lambda: True)  # even beside other tests' threads
    return pools


@pytest.fixture
def big_tree(tmp_path: Path) -> Path:
    files = dict(AWKWARD_FILES)
    files["huge/over-two-chunks.bin"] = os.urandom(2 * CHUNK_SIZE + 7)
    files["huge/one-chunk.bin"] = os.urandom(CHUNK_SIZE)
    files.update({f"flat/{i:04d}.jpg": os.urandom(i * 37) for i in range(600)})  # more than one walk group
    root = write_tree(tmp_path / "src", files, AWKWARD_EMPTY_DIRS)
    (root / "linked.jpg").symlink_to(root / "train" / "cat" / "0001.jpg")
    return root


def test_a_tree_digests_the_same_on_processes_as_inline(big_tree: Path, on_processes: list[int]) -> None:
    processes = build_manifest(big_tree, name="d", workers=2)
    assert on_processes == [2]
    inline = build_manifest(big_tree, name="d", workers=1)
    assert on_processes == [2]  # one worker never forks
    assert processes == inline
    assert processes.file_count == len(AWKWARD_FILES) + 603
    assert processes.directories == tuple(sorted(AWKWARD_EMPTY_DIRS))
    by_path = {entry.path: entry for entry in processes.entries}
    assert by_path["linked.jpg"].digest == xxhash.xxh3_128_hexdigest(AWKWARD_FILES["train/cat/0001.jpg"])
    assert by_path["huge/over-two-chunks.bin"].size == 2 * CHUNK_SIZE + 7
    assert multiprocessing.active_children() == []


def test_small_trees_and_single_workers_stay_in_process(big_tree: Path, pools: list[int]) -> None:
    build_manifest(big_tree / "train", name="d", workers=2)
    build_manifest(big_tree, name="d", workers=1)
    assert pools == []


def test_a_process_running_other_threads_digests_on_threads(
    big_tree: Path, pools: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digester, "PROCESS_MIN_FILES", 2)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not digester.can_fork()
        build_manifest(big_tree, name="d", workers=2)
    finally:
        stop.set()
        other.join()
    assert pools == []


def test_the_digest_cache_is_consulted_and_filled_from_processes(tmp_path: Path, on_processes: list[int]) -> None:
    tree = write_tree(tmp_path / "src", {f"c{i % 3}/{i}.jpg": os.urandom(100 + i) for i in range(30)})
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        first = build_manifest(tree, name="d", workers=2, digest_cache=cache)
        assert (cache.hits, cache.misses) == (0, 30)
        again = build_manifest(tree, name="d", workers=2, digest_cache=cache)
        assert (cache.hits, cache.misses) == (30, 30)
        assert again == first
        changed = tree / "c1" / "4.jpg"
        before = changed.stat()
        changed.write_bytes(os.urandom(104))  # same size, mtime set back: only ctime moves
        os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns))
        third = build_manifest(tree, name="d", workers=2, digest_cache=cache)
        assert (cache.hits, cache.misses) == (59, 31)
    assert on_processes == [2, 2, 2]
    assert {e.path: e.digest for e in third.entries}["c1/4.jpg"] == xxhash.xxh3_128_hexdigest(changed.read_bytes())
    assert third.digest != first.digest


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_read_longer_than_its_stat_is_an_integrity_error(
    tmp_path: Path, workers: int, on_processes: list[int]
) -> None:
    # /proc files stat as empty regular files and then read as text: like a file written
    # between its stat and its read, which must not get a digest under the stat'ed size
    tree = write_tree(tmp_path / "src", {f"{i}.jpg": b"x" * i for i in range(5)})
    (tree / "status").symlink_to("/proc/self/status")
    with pytest.raises(IntegrityError, match=r"'status' changed while it was digested \(0 -> \d+ bytes\)"):
        build_manifest(tree, name="d", workers=workers)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("cached", [False, True])
def test_a_file_gone_between_the_walk_and_its_read_is_not_found_by_name(
    tmp_path: Path, workers: int, cached: bool, on_processes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = write_tree(tmp_path / "src", {f"d/{i}.jpg": b"x" * i for i in range(5)})
    walk = walk_module.iter_local_dirs

    def listing_a_deleted_file(
        root: str, empty: list[str], confine: list[str] | None = None
    ) -> Iterator[walk_module.Dir]:
        for group in walk(root, empty, confine):
            yield group._replace(names=[*group.names, "gone.jpg"])

    monkeypatch.setattr(walk_module, "iter_local_dirs", listing_a_deleted_file)
    with DigestCache(tmp_path / "cache.sqlite") as cache, pytest.raises(NotFound, match=r"/d/gone\.jpg"):
        build_manifest(tree, name="d", workers=workers, digest_cache=cache if cached else None)
    assert on_processes == ([2] if workers == 2 else [])
    assert multiprocessing.active_children() == []


def test_a_hashing_process_that_dies_fails_the_digest_cleanly(
    big_tree: Path, on_processes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def dying(*args: object) -> None:
        os._exit(9)  # as the OOM killer would leave it: no reply, the pipe closes

    monkeypatch.setattr(digestpool, "_hash_request", dying)  # inherited by the fork
    with pytest.raises(SourceUnavailable, match="a digest process died"):
        build_manifest(big_tree, name="d", workers=2)
    assert on_processes == [2]
    assert multiprocessing.active_children() == []


def test_a_broken_link_found_while_processes_hash_is_refused_and_they_are_reaped(
    tmp_path: Path, on_processes: list[int]
) -> None:
    tree = write_tree(tmp_path / "src", {**{f"{i}.jpg": b"x" * i for i in range(5)}, "z/a.jpg": b"a"})
    (tree / "z" / "broken").symlink_to(tmp_path / "nowhere")
    with pytest.raises(InvalidInput, match="broken symlink"):
        build_manifest(tree, name="d", workers=2)
    assert on_processes == [2]  # the root's files started the pool before the walk reached z/
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("size", [0, 1, 4095, CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 3 * CHUNK_SIZE + 5])
@pytest.mark.parametrize("stated", ["right", "smaller", "larger"])
@pytest.mark.parametrize("buffer", [bytearray, read_buffer], ids=["bytearray", "read_buffer"])
def test_hash_fd_returns_what_it_read_whatever_size_it_was_told(
    tmp_path: Path, size: int, stated: str, buffer: Callable[[int], ReadBuffer]
) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    expected = {"right": size, "smaller": max(0, size - 1), "larger": size + 1}[stated]
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert hash_fd(fd, expected, buffer(CHUNK_SIZE)) == (xxhash.xxh3_128_hexdigest(data), size)
    finally:
        os.close(fd)


def test_read_buffers_start_on_a_page() -> None:
    """The kernel copies file data twice as slowly into a misaligned buffer (see read_buffer)."""
    for size in (1, HASH_BUFFER, CHUNK_SIZE):
        buffer = read_buffer(size)
        assert len(buffer) == size
        assert ctypes.addressof(ctypes.c_char.from_buffer(buffer)) % mmap.PAGESIZE == 0


class TestConfinedWalks:
    """``confine``: the agent's walks refuse symlinks that leave the allowed directories."""

    @staticmethod
    def _tree(tmp_path: Path) -> tuple[Path, Path]:
        allowed = tmp_path / "allowed"
        source = allowed / "ds"
        (source / "a").mkdir(parents=True)
        (source / "a" / "1.jpg").write_bytes(b"one")
        (allowed / "shared.jpg").write_bytes(b"shared")
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "secret").write_bytes(b"secret")
        return allowed, source

    def test_a_link_to_a_file_outside_is_refused(self, tmp_path: Path) -> None:
        allowed, source = self._tree(tmp_path)
        (source / "a" / "2.jpg").symlink_to(tmp_path / "outside" / "secret")
        with pytest.raises(InvalidInput, match="points outside the allowed directories"):
            build_manifest(str(source), name="ds", confine=[allowed])

    def test_a_link_to_a_directory_outside_is_refused(self, tmp_path: Path) -> None:
        allowed, source = self._tree(tmp_path)
        (source / "etc").symlink_to(tmp_path / "outside")
        with pytest.raises(InvalidInput, match="points outside"):
            build_manifest(str(source), name="ds", confine=[allowed])

    def test_a_link_inside_the_allowed_directories_is_followed(self, tmp_path: Path) -> None:
        allowed, source = self._tree(tmp_path)
        (source / "a" / "2.jpg").symlink_to(allowed / "shared.jpg")
        manifest = build_manifest(str(source), name="ds", confine=[allowed])
        assert [e.path for e in manifest.entries] == ["a/1.jpg", "a/2.jpg"]

    def test_without_confinement_links_are_followed_as_before(self, tmp_path: Path) -> None:
        _, source = self._tree(tmp_path)
        (source / "a" / "2.jpg").symlink_to(tmp_path / "outside" / "secret")
        manifest = build_manifest(str(source), name="ds")
        assert manifest.file_count == 2
