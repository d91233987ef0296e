"""The digest cache: an unchanged tree is re-digested with a walk and a stat per file, no opens."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsagent.errors import SourceUnavailable
from dsagent.format import digestcache
from dsagent.format.digestcache import DigestCache
from dsagent.format.digester import build_manifest
from tests.dsagent.conftest import write_tree

_opened: list[str] | None = None


def _audit(event: str, args: tuple[object, ...]) -> None:
    # Python raises an "open" audit event for os.open and open(): a real count of opens.
    if _opened is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))  # type: ignore[arg-type]


sys.addaudithook(_audit)


@pytest.fixture
def opens() -> Iterator[list[str]]:
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "src", {f"c{i % 3}/{i}.jpg": os.urandom(100 + i) for i in range(30)})


def _files_opened(opened: list[str], root: Path) -> set[str]:
    return {os.path.relpath(p, root) for p in opened if p.startswith(str(root)) and os.path.isfile(p)}


def test_an_unchanged_tree_is_redigested_without_opening_a_file(tree: Path, tmp_path: Path, opens: list[str]) -> None:
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        first = build_manifest(tree, name="d", digest_cache=cache)
        assert len(_files_opened(opens, tree)) == 30
        opens.clear()
        second = build_manifest(tree, name="d", digest_cache=cache)
        assert _files_opened(opens, tree) == set()
        assert (cache.hits, cache.misses) == (30, 30)
    assert second == first


@pytest.mark.parametrize("change", ["rewrite-same-size-restore-mtime", "replace-by-rename", "touch"])
def test_any_change_to_a_file_makes_it_read_again(change: str, tree: Path, tmp_path: Path, opens: list[str]) -> None:
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        build_manifest(tree, name="d", digest_cache=cache)
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
        opens.clear()
        manifest = build_manifest(tree, name="d", digest_cache=cache)
    assert _files_opened(opens, tree) == {"c1/4.jpg"}
    assert manifest == build_manifest(tree, name="d")


def test_files_modified_just_before_hashing_are_not_cached(tree: Path, tmp_path: Path, opens: list[str]) -> None:
    with DigestCache(tmp_path / "cache.sqlite") as cache:  # default racy window: 2 s
        build_manifest(tree, name="d", digest_cache=cache)
        opens.clear()
        build_manifest(tree, name="d", digest_cache=cache)
    assert len(_files_opened(opens, tree)) == 30


def test_the_cache_survives_reopening(tree: Path, tmp_path: Path, opens: list[str]) -> None:
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        build_manifest(tree, name="d", digest_cache=cache)
    opens.clear()
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        build_manifest(tree, name="d", digest_cache=cache)
        assert cache.hits == 30
    assert _files_opened(opens, tree) == set()


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
        assert cache.snapshot("/") == {}
    assert refusals["left"] == 0  # refused twice, opened the third time

    def broken(*a: object, **kw: object) -> Any:
        raise sqlite3.OperationalError("file is not a database")

    monkeypatch.setattr(digestcache.sqlite3, "connect", broken)
    with pytest.raises(SourceUnavailable, match="file is not a database"):
        DigestCache(tmp_path / "other.db")
