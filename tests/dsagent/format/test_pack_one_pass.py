"""``dsctl pack`` in one pass: each file read once, the manifest from the hashes taken while packing."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from dsagent.cli import main
from dsagent.errors import IntegrityError
from dsagent.format.bundles import storeobjects
from dsagent.format.bundles.bundle import (
    BundleOptions,
    PackOptions,
    pack,
    pack_dataset,
    unpack,
    verify_tree,
    write_bundles,
)
from dsagent.format.digestcache import DigestCache
from dsagent.format.digester import build_manifest
from dsagent.format.manifest import read_manifest
from tests.dsagent.conftest import AWKWARD_EMPTY_DIRS, AWKWARD_FILES, write_tree


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Counter[str]:
    """How many times each file under ``tmp_path / "source"`` was opened (any module, any thread).

    Python's opens only: the pure loops run (the optional C reader opens files where Python
    cannot count them; ``test_native_pack.py`` holds its output equal to this loop's)."""
    from dsagent.format import native

    monkeypatch.setattr(native, "AVAILABLE", False)
    counts: Counter[str] = Counter()
    real_open = os.open
    prefix = f"{tmp_path / 'source'}/"

    def counting_open(path: str | os.PathLike[str], flags: int, *args: object, **kwargs: object) -> int:
        text = os.fspath(path)
        if text.startswith(prefix) and not flags & os.O_DIRECTORY:  # files read, not directories listed
            counts[text[len(prefix) :]] += 1
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting_open)
    return counts


def _files(count: int = 60) -> dict[str, bytes]:
    return {f"c{i % 4}/{i:03d}.jpg": os.urandom(300 + 37 * i) for i in range(count)}


def test_dsctl_pack_reads_each_file_once(
    awkward_dataset: Path, opened: Counter[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        main(["pack", str(awkward_dataset), "--name", "awk", "--to", str(tmp_path / "store"), "--max-files", "3"])
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err
    assert opened == Counter(dict.fromkeys(AWKWARD_FILES, 1))
    manifest = read_manifest(str(tmp_path / "store"), "awk")
    assert manifest.digest == build_manifest(awkward_dataset, name="awk").digest
    unpack(tmp_path / "store", name="awk", dest=tmp_path / "out")
    verify_tree(tmp_path / "out", manifest)
    assert set(AWKWARD_EMPTY_DIRS) == set(manifest.directories)


def test_one_pass_writes_what_digest_then_pack_writes(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "source", _files())
    options = PackOptions(max_files=7)
    one, reused = pack_dataset(src, tmp_path / "one", options, name="d")
    two, _ = write_bundles(build_manifest(src, name="d"), src, tmp_path / "two", options)
    assert one == two and reused == 0 and len(one.bundles) > 3
    for ref in one.bundles:
        name = f"{ref.digest}.tar.zst"
        assert (tmp_path / "one" / "bundles" / name).read_bytes() == (tmp_path / "two" / "bundles" / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "one" / "bundles").iterdir()) == sorted(
        p.name for p in (tmp_path / "two" / "bundles").iterdir()
    )  # no temporary object left behind


def test_options_are_taken_as_one_object_or_as_keywords(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "source", _files(20))
    by_keywords = pack(src, tmp_path / "a", name="d", max_files=3, level=3)
    by_object = pack(src, tmp_path / "b", PackOptions(max_files=3, level=3), name="d")
    overridden = pack(src, tmp_path / "c", PackOptions(max_files=50, level=3), name="d", max_files=3)
    assert by_keywords == by_object == overridden
    assert len(by_keywords.bundles) > 1 and max(b.count for b in by_keywords.bundles) <= 3
    with pytest.raises(TypeError, match="max_file"):
        pack(src, tmp_path / "d", name="d", max_file=3)
    with pytest.raises(TypeError, match="processes"):  # a pack's option, not a writer's
        write_bundles(by_keywords, src, tmp_path / "e", processes=2)


def test_a_packs_options_begin_with_a_writers_under_the_same_defaults(tmp_path: Path) -> None:
    """PackOptions repeats BundleOptions' fields (records cannot extend one another): the
    same names, in the same order, with the same defaults, and either is taken by the other's
    functions for the fields both have."""
    shared = BundleOptions._fields
    assert PackOptions._fields[: len(shared)] == shared
    assert tuple(PackOptions()[: len(shared)]) == tuple(BundleOptions())
    src = write_tree(tmp_path / "source", _files(20))
    by_pack_options, _ = write_bundles(build_manifest(src, name="d"), src, tmp_path / "a", PackOptions(max_files=3))
    by_bundle_options = pack(src, tmp_path / "b", BundleOptions(max_files=3), name="d")  # type: ignore[arg-type]
    assert by_pack_options == by_bundle_options and max(b.count for b in by_pack_options.bundles) <= 3


def test_repack_with_the_digest_cache_reads_only_the_changed_bundle(tmp_path: Path, opened: Counter[str]) -> None:
    files = _files()
    src = write_tree(tmp_path / "source", files)
    store = tmp_path / "store"
    with DigestCache(tmp_path / "cache.sqlite", racy_window_ns=0) as cache:
        first, reused = pack_dataset(src, store, name="d", max_files=7, digest_cache=cache)
        assert reused == 0 and sum(opened.values()) == len(files)
        opened.clear()
        again, reused = pack_dataset(src, store, name="d", max_files=7, digest_cache=cache)
        assert again == first and reused == len(first.bundles) and not opened  # nothing read
        (src / "c1" / "005.jpg").write_bytes(b"changed")
        changed, reused = pack_dataset(src, store, name="d", max_files=7, digest_cache=cache)
    ref = next(b for b in changed.bundles if any(e.path == "c1/005.jpg" for e in changed.bundle_entries(b)))
    assert set(opened) == {e.path for e in changed.bundle_entries(ref)}  # that bundle's files, and only them
    assert reused == len(changed.bundles) - 1
    assert changed.digest == build_manifest(src, name="d").digest
    unpack(store, name="d", dest=tmp_path / "out")
    verify_tree(tmp_path / "out", changed)


def _pack_changing(src: Path, store: Path, change: str, how: str) -> None:
    """Pack ``src`` while rewriting ``change`` as soon as the first file is packed (the
    Python loop, which reports each file: the C reader reports a buffer at a time, and
    ``test_native_pack.py`` changes files under it its own way)."""
    from dsagent.format import native

    if native.AVAILABLE:
        native.AVAILABLE = False
        try:
            return _pack_changing(src, store, change, how)
        finally:
            native.AVAILABLE = True
    done = []

    def progress(_bytes: int, _files: int) -> None:
        if done:
            return
        done.append(True)
        path = src / change
        st = path.stat()
        if how == "grow":
            path.write_bytes(path.read_bytes() + b"more")
        else:  # same size, new bytes, a new mtime
            path.write_bytes(bytes(255 - b for b in path.read_bytes()))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    pack_dataset(src, store, name="d", progress=progress)


@pytest.mark.parametrize("how", ["grow", "rewrite"])
def test_a_file_changed_during_the_pass_fails_the_pack_and_publishes_nothing(tmp_path: Path, how: str) -> None:
    src = write_tree(tmp_path / "source", {"a.jpg": b"a" * 100, "b.jpg": b"b" * 5000, "c.jpg": b"c" * 10})
    with pytest.raises(IntegrityError, match="'b.jpg' changed while it was packed"):
        _pack_changing(src, tmp_path / "store", "b.jpg", how)
    assert list((tmp_path / "store" / "bundles").iterdir()) == []  # not even a temporary object
    assert not (tmp_path / "store" / "d").exists()


def test_a_remote_source_is_digested_then_packed(memory_root: str, tmp_path: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    for rel, data in AWKWARD_FILES.items():
        fs.pipe_file(f"{memory_root}/src/{rel}", data)
    manifest, _ = pack_dataset(f"{memory_root}/src", tmp_path / "store", name="m", max_files=2)
    assert manifest == read_manifest(str(tmp_path / "store"), "m")
    assert manifest.digest == build_manifest(f"{memory_root}/src", name="m").digest


def test_a_full_store_during_a_one_pass_pack_leaves_no_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from dsagent.errors import InsufficientSpace

    src = write_tree(tmp_path / "source", _files(10))

    class Full:
        def __init__(self, raw: object, writeback: object = None) -> None:
            pass

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def writev(self, pieces: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self) -> None:
            pass

    monkeypatch.setattr(storeobjects, "CountingWriter", Full)
    with pytest.raises(InsufficientSpace):
        pack_dataset(src, tmp_path / "store", name="d")
    assert list((tmp_path / "store" / "bundles").iterdir()) == []


def test_dsctl_pack_and_unpack_pause_the_cycle_collector_and_restore_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the per-file objects hold no cycles: the collector rescanning them cost 0.2 s of a
    # 200,000-file pack; a process that goes on (a test, a caller of main) gets it back
    import gc

    import dsagent.format.bundles.bundle as bundle_module
    import dsagent.format.bundles.extract as extract_module

    write_tree(tmp_path / "src", _files(8))
    seen: list[bool] = []
    for module, name in ((bundle_module, "pack_dataset"), (extract_module, "unpack")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, **k: (seen.append(gc.isenabled()), _real(*a, **k))[1])
    assert gc.isenabled()
    for argv in (
        ["pack", str(tmp_path / "src"), "--name", "d", "--to", str(tmp_path / "store")],
        ["unpack", str(tmp_path / "store"), str(tmp_path / "out"), "--name", "d"],
    ):
        try:
            main(argv)
        except SystemExit as exc:
            assert exc.code in (0, None)
        assert gc.isenabled()
    assert seen == [False, False]
    assert sorted(p.name for p in (tmp_path / "out").rglob("*.jpg")) == sorted(Path(k).name for k in _files(8))
