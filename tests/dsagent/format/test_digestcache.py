"""The digest cache: an unchanged tree is re-digested with a walk and a stat per file, no opens,
by the native loops as by the pure ones (threads, and the forked processes of a big tree)."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsagent.errors import SourceUnavailable
from dsagent.format import digestcache, digester, native
from dsagent.format.digestcache import DigestCache
from dsagent.format.digester import build_manifest
from dsagent.format.manifest import Manifest
from tests.dsagent.conftest import write_tree
from tests.opens import OpenWatch

#: the loops that hash what the cache does not answer: the native tree digest, the pure loop
#: on threads, and the pure loop on forked processes (a tree past PROCESS_MIN_FILES files)
LOOPS = [
    pytest.param("native", marks=pytest.mark.skipif(not native.AVAILABLE, reason="the native loops are not built")),
    "threads",
    "processes",
]


@pytest.fixture(params=LOOPS)
def digest(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Manifest]:
    loop = request.param
    if loop == "processes":
        monkeypatch.setattr(digester, "PROCESS_MIN_FILES", 8)  # the tests' trees are small
    else:
        monkeypatch.setattr(digester, "PROCESS_MIN_FILES", 1 << 30)

    def run(tree: Path, cache: DigestCache | None) -> Manifest:
        return build_manifest(tree, name="d", digest_cache=cache, native=loop == "native")

    return run


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "src", {f"c{i % 3}/{i}.jpg": os.urandom(100 + i) for i in range(30)})


def test_an_unchanged_tree_is_redigested_without_opening_a_file(
    tree: Path, tmp_path: Path, digest: Callable[..., Manifest]
) -> None:
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        with OpenWatch(tree) as first_reads:
            first = digest(tree, cache)
        assert len(first_reads.opened) == 30
        with OpenWatch(tree) as second_reads:
            second = digest(tree, cache)
        assert second_reads.opened == set()
        assert (cache.hits, cache.misses) == (30, 30)
    assert second == first == build_manifest(tree, name="d")


@pytest.mark.parametrize("change", ["rewrite-same-size-restore-mtime", "replace-by-rename", "touch"])
def test_any_change_to_a_file_makes_it_read_again(
    change: str, tree: Path, tmp_path: Path, digest: Callable[..., Manifest]
) -> None:
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        digest(tree, cache)
        target = tree / "c1" / "4.jpg"
        st = target.stat()
        if change == "rewrite-same-size-restore-mtime":
            target.write_bytes(b"Z" * st.st_size)
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # only ctime still tells
        elif change == "replace-by-rename":
            (tree / "tmp").write_bytes(b"Y" * st.st_size)
            os.utime(tree / "tmp", ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tree / "tmp", target)
        else:
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        with OpenWatch(tree) as reads:
            manifest = digest(tree, cache)
    assert reads.opened == {"c1/4.jpg"}
    assert manifest == build_manifest(tree, name="d", native=False)


def test_added_and_removed_files_are_read_and_forgotten(
    tree: Path, tmp_path: Path, digest: Callable[..., Manifest]
) -> None:
    """A tree listed other than it was recorded is matched file by file: a new file is read,
    the others are not, and a removed one leaves the record."""
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        digest(tree, cache)
        (tree / "c0" / "0.jpg").unlink()
        (tree / "c2" / "new.jpg").write_bytes(b"new")
        with OpenWatch(tree) as reads:
            manifest = digest(tree, cache)
        assert reads.opened == {"c2/new.jpg"}
        assert manifest == build_manifest(tree, name="d", native=False)
        recorded = cache.snapshot(str(tree))
    assert "c0/0.jpg" not in recorded.paths and "c2/new.jpg" in recorded.paths and len(recorded) == 30


def test_files_modified_just_before_hashing_are_not_cached(
    tree: Path, tmp_path: Path, digest: Callable[..., Manifest]
) -> None:
    with DigestCache(tmp_path / "cache.sqlite") as cache:  # default racy window: 2 s
        digest(tree, cache)
        with OpenWatch(tree) as reads:
            digest(tree, cache)
    assert len(reads.opened) == 30


def test_the_cache_survives_reopening(tree: Path, tmp_path: Path, digest: Callable[..., Manifest]) -> None:
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        digest(tree, cache)
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache, OpenWatch(tree) as reads:
        digest(tree, cache)
        assert cache.hits == 30
    assert reads.opened == set()


def test_a_record_that_does_not_add_up_is_a_miss_not_an_error(tree: Path, tmp_path: Path) -> None:
    """The cache is only a cache: a record cut short (or of another format) reads the tree again."""
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        first = build_manifest(tree, name="d", digest_cache=cache)
    db = sqlite3.connect(tmp_path / "cache.sqlite")
    with db:
        db.execute("UPDATE trees SET record = substr(record, 1, 100)")
    db.close()
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache, OpenWatch(tree) as reads:
        assert build_manifest(tree, name="d", digest_cache=cache) == first
        assert cache.misses == 30
    assert len(reads.opened) == 30


def test_a_cache_of_the_row_a_file_format_is_replaced(tmp_path: Path, tree: Path) -> None:
    db = sqlite3.connect(tmp_path / "cache.sqlite")
    db.execute("CREATE TABLE digests (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, inode INTEGER,"
               " ctime_ns INTEGER, digest TEXT) WITHOUT ROWID")  # fmt: skip
    db.close()
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        build_manifest(tree, name="d", digest_cache=cache)
        assert len(cache.snapshot(str(tree))) == 30
    db = sqlite3.connect(tmp_path / "cache.sqlite")
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    db.close()
    assert tables == {"trees"}


def test_inodes_past_two_to_the_63_match(tmp_path: Path) -> None:
    """A 64-bit inode (NFS file ids, overlayfs) is held as the native listing holds it."""
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        snapshot = cache.snapshot("/data")
        big = (1 << 64) - 5
        cache.store(snapshot, ["a"], [3], [10], [big], [11], b"\x01" * 16)
        again = cache.snapshot("/data/")  # the same tree, however its root is spelt
        item: Any = type("F", (), {"path": "a", "size": 3, "mtime_ns": 10, "inode": big, "ctime_ns": 11})()
        assert cache.match(again, item) == "01" * 16
        assert again.lookup(["a"], [3], [10], [big], [11]) == [0]
        assert again.lookup(["a"], [3], [10], [big - 1], [11]) == [-1]


def test_a_cache_another_opener_holds_locked_at_once_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two openers of a new cache both switch it to WAL, and SQLite answers one of them
    "database is locked" at once, without its busy wait: that one opens again (it used to
    fail the dataset as ``source_unavailable``); any other SQLite error still fails."""
    real = sqlite3.connect
    refusals = {"left": 2}

    class Refusing:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def execute(self, sql: str, *args: object) -> Any:
            if sql == "PRAGMA journal_mode=WAL" and refusals["left"] > 0:
                refusals["left"] -= 1
                raise sqlite3.OperationalError("database is locked")
            return self.db.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.db, name)

    monkeypatch.setattr(digestcache.sqlite3, "connect", lambda *a, **kw: Refusing(real(*a, **kw)))
    with DigestCache(tmp_path / "digests.db") as cache:
        assert len(cache.snapshot("/")) == 0
    assert refusals["left"] == 0  # refused twice, opened the third time

    def broken(*a: object, **kw: object) -> Any:
        raise sqlite3.OperationalError("file is not a database")

    monkeypatch.setattr(digestcache.sqlite3, "connect", broken)
    with pytest.raises(SourceUnavailable, match="file is not a database"):
        DigestCache(tmp_path / "other.db")


def test_a_packed_tree_is_digested_from_the_record_the_pack_left(tree: Path, tmp_path: Path) -> None:
    """``dsctl pack`` and ``dsctl digest`` of one tree share its record: either answers the other."""
    from dsagent.format.bundles.bundle import pack_dataset

    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        packed, _ = pack_dataset(tree, tmp_path / "store", name="d", digest_cache=cache)
        with OpenWatch(tree) as reads:
            digested = build_manifest(tree, name="d", digest_cache=cache)
        assert reads.opened == set()
        assert digested.digest == packed.digest
        with OpenWatch(tree) as reads:
            again, reused = pack_dataset(tree, tmp_path / "store", name="d", digest_cache=cache)
        assert reads.opened == set() and reused == len(again.bundles) == 1


@pytest.mark.skipif(not native.AVAILABLE, reason="the native loops are not built")
def test_a_file_changed_between_its_stat_and_its_read_is_taken_as_read_and_not_recorded(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = digester.list_local
    target = tree / "c2" / "5.jpg"

    def list_then_change(*args: Any) -> Any:
        listing = listed(*args)
        target.write_bytes(target.read_bytes() + b"grown after the listing")
        return listing

    monkeypatch.setattr(digester, "list_local", list_then_change)
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        manifest = build_manifest(tree, name="d", digest_cache=cache, native=True)
        recorded = cache.snapshot(str(tree))
    monkeypatch.undo()
    assert manifest == build_manifest(tree, name="d", native=False)  # its size and digest as read
    assert "c2/5.jpg" not in recorded.paths and len(recorded) == 29


def test_a_big_tree_is_recorded_in_parts(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record is cut into parts (SQLite refuses a value over 1 GB: a tree of 14 million
    files would be one), read back as one, and its parts past the new last one dropped when
    the tree shrinks."""
    monkeypatch.setattr(digestcache, "PART_FILES", 7)
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        first = build_manifest(tree, name="d", digest_cache=cache)
        assert len(cache.snapshot(str(tree)).parts) == 3  # a directory of 10 files a part
        with OpenWatch(tree) as reads:
            assert build_manifest(tree, name="d", digest_cache=cache) == first
        assert reads.opened == set()
        for path in sorted(tree.rglob("*.jpg"))[:20]:  # c0 and c1
            path.unlink()
        build_manifest(tree, name="d", digest_cache=cache)
        assert len(cache.snapshot(str(tree))) == 10
    db = sqlite3.connect(tmp_path / "cache.sqlite")
    parts = [part for (part,) in db.execute("SELECT part FROM trees ORDER BY part")]
    db.close()
    assert parts == [0]  # 10 files: one part, the other two of the 30-file record gone


def test_parts_end_where_a_directory_does() -> None:
    """A part ends at the first change of directory past PART_FILES files, or at
    PART_FILES_MAX files in a directory that long; the last part holds what is left."""
    tree = [f"a/{i:02}" for i in range(10)] + [f"b/c/{i:02}" for i in range(3)] + [f"d/{i:02}" for i in range(25)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(digestcache, "PART_FILES", 4)
        patch.setattr(digestcache, "PART_FILES_MAX", 8)
        # a's first 8 (the most a part holds); a's last 2 with b/c's 3 (at least 4 before a
        # directory ends the part); d's 25 as 8, 8, 8 and 1
        assert digestcache.part_starts(tree) == [0, 8, 13, 21, 29, 37]
        assert digestcache.part_starts(tree[:10] + ["e"]) == [0, 8]
        assert digestcache.part_starts(tree[:4]) == [0]
        assert digestcache.part_starts([]) == [0]


def written_parts(cache: DigestCache) -> list[int]:
    """Starts listening to ``cache``'s statements: the parts its writes insert, in order."""
    parts: list[int] = []

    def trace(statement: str) -> None:
        found = re.match(r"INSERT OR REPLACE INTO trees VALUES \('[^']*', (\d+),", statement)
        if found:
            parts.append(int(found.group(1)))

    cache._db.set_trace_callback(trace)
    return parts


def test_a_changed_file_rewrites_only_its_part(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digest: Callable[..., Manifest]
) -> None:
    """A file changed in a tree of many parts rewrites the one part that holds it (a tree of
    14 million files would otherwise write 1.1 GB for one file); an unchanged tree writes none."""
    monkeypatch.setattr(digestcache, "PART_FILES", 7)
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        first = digest(tree, cache)
        record = cache.snapshot(str(tree))
        assert len(record.parts) == 3  # 30 files in 3 directories, 7 a part at least
        parts = written_parts(cache)
        assert digest(tree, cache) == first
        assert parts == []
        changed = record.paths[16]  # in the record's second part, in whatever order the loop wrote it
        (tree / changed).write_bytes(b"changed")
        manifest = digest(tree, cache)
        assert parts == [1]
        assert manifest == build_manifest(tree, name="d", native=False)
        with OpenWatch(tree) as reads:
            assert digest(tree, cache) == manifest
        assert reads.opened == set()


def test_a_file_added_or_removed_rewrites_only_its_directorys_part(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts end where directories do: a file added shifts the files after it, but only its
    own part's bytes change; one removed likewise."""
    monkeypatch.setattr(digestcache, "PART_FILES", 7)
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        build_manifest(tree, name="d", digest_cache=cache)
        parts = written_parts(cache)
        (tree / "c1" / "20.jpg").write_bytes(b"new")
        added = build_manifest(tree, name="d", digest_cache=cache)
        assert parts == [1]  # c1's part: c0's and c2's stay
        (tree / "c0" / "3.jpg").unlink()
        removed = build_manifest(tree, name="d", digest_cache=cache)
        assert parts == [1, 0]
        assert len(cache.snapshot(str(tree))) == 30
        with OpenWatch(tree) as reads:
            assert build_manifest(tree, name="d", digest_cache=cache) == removed
        assert reads.opened == set()
    assert (added.file_count, removed.file_count) == (31, 30)


def test_a_part_that_does_not_add_up_is_replaced_with_every_other(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record with a part that does not add up reads as empty, so the next digest reads
    every file and writes the whole record again, leaving no part of the old one behind."""
    monkeypatch.setattr(digestcache, "PART_FILES", 7)
    path = tmp_path / "cache.sqlite"
    with DigestCache(path, racy_window_ns=0) as cache:
        first = build_manifest(tree, name="d", digest_cache=cache)
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE trees SET record = x'00' WHERE part = 1")
        db.execute("INSERT INTO trees SELECT root, 9, record FROM trees WHERE part = 0")  # a stray part past the end
    db.close()
    with DigestCache(path, racy_window_ns=0) as cache:
        assert len(cache.snapshot(str(tree))) == 0
        with OpenWatch(tree) as reads:
            assert build_manifest(tree, name="d", digest_cache=cache) == first
        assert len(reads.opened) == 30
        assert len(cache.snapshot(str(tree))) == 30
    db = sqlite3.connect(path)
    assert [part for (part,) in db.execute("SELECT part FROM trees ORDER BY part")] == [0, 1, 2]
    db.close()


@pytest.mark.skipif(not native.AVAILABLE, reason="the native loops are not built")
def test_a_record_the_pure_loop_wrote_in_walk_order_answers_the_native_loop(tmp_path: Path) -> None:
    """The pure loop records files in its walk's order, the native one in path order: each
    answers the other, file by file (a directory's own files walk before its subdirectory's,
    "a/z.jpg" before "a/b/x.jpg", which sorts first)."""
    tree = write_tree(tmp_path / "src", {"a/z.jpg": b"z" * 50, "a/b/x.jpg": b"x" * 60, "a/b/y.jpg": b"y" * 70})
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        build_manifest(tree, name="d", digest_cache=cache, native=False)
        recorded = cache.snapshot(str(tree)).paths
        with OpenWatch(tree) as reads:
            digested = build_manifest(tree, name="d", digest_cache=cache, native=True)
        assert reads.opened == set() and digested == build_manifest(tree, name="d")
        with OpenWatch(tree) as reads:
            assert build_manifest(tree, name="d", digest_cache=cache, native=False) == digested
        assert reads.opened == set()
    assert recorded != sorted(recorded)  # the case this test is about


def test_a_cache_of_a_later_release_is_left_as_it_is(tree: Path, tmp_path: Path) -> None:
    """Two releases sharing one cache file: this one reads a later format as empty and
    writes nothing, rather than emptying it for the other."""
    db = sqlite3.connect(tmp_path / "cache.sqlite")
    db.execute("CREATE TABLE later (x)")
    db.execute("PRAGMA user_version = 99")
    db.close()
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache, OpenWatch(tree) as reads:
        manifest = build_manifest(tree, name="d", digest_cache=cache)
        assert len(cache.snapshot(str(tree))) == 0
    assert len(reads.opened) == 30 and manifest == build_manifest(tree, name="d")
    db = sqlite3.connect(tmp_path / "cache.sqlite")
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    version = db.execute("PRAGMA user_version").fetchone()[0]
    db.close()
    assert tables == {"later"} and version == 99


def test_caches_opened_at_once_on_a_new_file_all_read_it(tmp_path: Path) -> None:
    """Datasets digested at once each open the agent's cache: on a new file one of them makes
    the table while the others wait, and none drops it under another's read (each made it
    one statement at a time before, and one in five rounds failed "no such table")."""
    errors: list[BaseException] = []
    for round_ in range(50):
        path = tmp_path / f"round{round_}" / "digests.db"
        start = threading.Barrier(8)

        def open_and_read(path: Path = path, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                with DigestCache(path) as cache:
                    cache.snapshot("/data")
            except BaseException as exc:  # noqa: BLE001 - counted below
                errors.append(exc)

        threads = [threading.Thread(target=open_and_read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
