"""Bundles: pack into a store, unpack verified, reuse unchanged bundles."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pytest

from dsagent.errors import Conflict, IntegrityError
from dsagent.format.bundles.bundle import pack, unpack, verify_tree
from dsagent.format.manifest import read_manifest
from tests.dsagent.conftest import AWKWARD_EMPTY_DIRS, AWKWARD_FILES, write_tree

pytestmark = pytest.mark.usefixtures("native_mode")  # each test with the native loops and the pure ones


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_awkward_dataset_round_trips_with_contents_mtimes_and_empty_dirs(awkward_dataset: Path, tmp_path: Path) -> None:
    manifest = pack(awkward_dataset, tmp_path / "store", name="awkward", max_files=3, max_bytes=20_000)
    assert len(manifest.bundles) > 1
    big = next(b for b in manifest.bundles if any(e.path == "big.bin" for e in manifest.bundle_entries(b)))
    assert big.count == 1  # a file larger than max_bytes gets a bundle of its own
    unpack(tmp_path / "store", name="awkward", dest=tmp_path / "out")
    assert _tree(tmp_path / "out") == AWKWARD_FILES
    for rel in AWKWARD_EMPTY_DIRS:
        assert (tmp_path / "out" / rel).is_dir()
    for entry in manifest.entries:
        assert os.stat(tmp_path / "out" / entry.path).st_mtime_ns == entry.mtime_ns
    verify_tree(tmp_path / "out", manifest)
    assert read_manifest(str(tmp_path / "store"), "awkward") == manifest
    assert not any(p.name.startswith(".") for p in (tmp_path).iterdir())


def test_a_file_name_that_is_not_utf8_round_trips(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", {"plain.bin": b"p"})
    (src / os.fsdecode(b"caf\xe9.bin")).write_bytes(b"latin-1 named")  # a name from an old archive
    manifest = pack(src, tmp_path / "store", name="latin")
    assert read_manifest(str(tmp_path / "store"), "latin") == manifest  # the stored manifest reads back
    unpack(tmp_path / "store", name="latin", dest=tmp_path / "out")
    assert (tmp_path / "out" / os.fsdecode(b"caf\xe9.bin")).read_bytes() == b"latin-1 named"
    assert b"caf\xe9.bin" in os.listdir(os.fsencode(tmp_path / "out"))  # the very bytes, not re-encoded
    verify_tree(tmp_path / "out", manifest)


def test_memory_source_and_memory_store_round_trip(memory_root: str, tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    for rel, data in AWKWARD_FILES.items():
        fs.pipe_file(f"{memory_root}/src/{rel}", data)
    manifest = pack(f"{memory_root}/src", f"{memory_root}/store", name="m", max_files=4)
    unpack(f"{memory_root}/store", name="m", dest=tmp_path / "out")
    assert _tree(tmp_path / "out") == AWKWARD_FILES
    verify_tree(tmp_path / "out", manifest)


def test_an_empty_dataset_packs_to_no_bundles_and_unpacks_to_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    manifest = pack(tmp_path / "src", tmp_path / "store", name="empty")
    assert manifest.bundles == () and manifest.entries == ()
    unpack(tmp_path / "store", name="empty", dest=tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []
    verify_tree(tmp_path / "out", manifest)


def test_unchanged_bundles_are_reused_not_rewritten(tmp_path: Path) -> None:
    files = {f"c{i % 7}/{i:04d}.jpg": os.urandom(500 + i) for i in range(200)}
    src = write_tree(tmp_path / "src", files)
    first = pack(src, tmp_path / "store", name="d", max_files=20)
    bundle_dir = tmp_path / "store" / "bundles"
    before = {p.name: p.stat().st_ino for p in bundle_dir.iterdir()}
    (src / "c3" / "0010.jpg").write_bytes(b"changed")
    second = pack(src, tmp_path / "store", name="d", max_files=20)
    after = {p.name: p.stat().st_ino for p in bundle_dir.iterdir()}
    new = {b.digest for b in second.bundles} - {b.digest for b in first.bundles}
    assert 1 <= len(new) <= 2
    for ref in second.bundles:
        name = f"{ref.digest}.tar.zst"
        if ref.digest not in new:
            assert after[name] == before[name]  # same inode: not rewritten
    unpack(tmp_path / "store", name="d", dest=tmp_path / "out")
    verify_tree(tmp_path / "out", second)


def test_unpack_refuses_a_non_empty_target(awkward_dataset: Path, tmp_path: Path) -> None:
    pack(awkward_dataset, tmp_path / "store", name="a")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("mine")
    with pytest.raises(Conflict):
        unpack(tmp_path / "store", name="a", dest=tmp_path / "out")
    assert (tmp_path / "out" / "keep").read_text() == "mine"


def test_unpack_takes_a_target_written_any_way_path_would_read_it(
    awkward_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trailing slash, a trailing ``.``, doubled slashes and a relative name all land in
    the one directory they name, with nothing left beside it."""
    manifest = pack(awkward_dataset, tmp_path / "store", name="a")
    targets = tmp_path / "targets"
    targets.mkdir()
    monkeypatch.chdir(targets)
    for written, lands in (
        (f"{targets}/one/", "one"),
        (f"{targets}//two/.", "two"),
        ("three", "three"),
        ("deep/./four/", "deep/four"),
    ):
        unpack(tmp_path / "store", name="a", dest=written)
        verify_tree(targets / lands, manifest)
    assert sorted(p.name for p in targets.iterdir()) == ["deep", "one", "three", "two"]
    assert [p.name for p in (targets / "deep").iterdir()] == ["four"]  # no stage left behind


def test_verify_tree_lists_what_differs(awkward_dataset: Path, tmp_path: Path) -> None:
    manifest = pack(awkward_dataset, tmp_path / "store", name="a")
    unpack(tmp_path / "store", name="a", dest=tmp_path / "out")
    (tmp_path / "out" / "train/cat/0001.jpg").write_bytes(b"X" * len(AWKWARD_FILES["train/cat/0001.jpg"]))
    (tmp_path / "out" / "train/dog/0001.jpg").unlink()
    (tmp_path / "out" / "extra").write_bytes(b"")
    with pytest.raises(IntegrityError) as excinfo:
        verify_tree(tmp_path / "out", manifest)
    assert set(excinfo.value.details["problems"]) == {
        "wrong content: train/cat/0001.jpg",
        "missing file: train/dog/0001.jpg",
        "unexpected file: extra",
    }


def test_bundles_are_standard_pax_tar_in_one_zstd_frame(awkward_dataset: Path, tmp_path: Path) -> None:
    import io
    import tarfile

    import zstandard

    from dsagent.format.manifest import bundle_path

    manifest = pack(awkward_dataset, tmp_path / "store", name="awk")
    names = []
    for ref in manifest.bundles:
        raw = Path(bundle_path(str(tmp_path / "store"), ref.digest)).read_bytes()
        assert len(raw) == ref.compressed_size
        data = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                assert member.isreg()
                names.append(member.name)
                assert tar.extractfile(member).read() == AWKWARD_FILES[member.name]  # type: ignore[union-attr]
    assert names == [e.path for e in manifest.entries]


def test_a_file_changed_after_digesting_fails_the_pack_and_publishes_nothing(tmp_path: Path) -> None:
    from dsagent.format.bundles.bundle import write_bundles
    from dsagent.format.digester import build_manifest

    src = write_tree(tmp_path / "src", {"a.jpg": b"a" * 100, "b.jpg": b"b" * 100})
    manifest = build_manifest(src, name="d")
    (src / "b.jpg").write_bytes(b"B" * 100)
    with pytest.raises(IntegrityError, match="changed after it was digested"):
        write_bundles(manifest, src, tmp_path / "store")
    assert list((tmp_path / "store" / "bundles").iterdir()) == []
    assert not (tmp_path / "store" / "d").exists()


def test_remote_sources_stream_large_files_and_prefetch_small_ones(
    memory_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.format.bundles import packwriter as bundle

    monkeypatch.setattr(bundle, "PREFETCH_MAX_FILE", 1000)
    monkeypatch.setattr(bundle, "PREFETCH_FILES", 2)
    fs = fsspec.filesystem("memory")
    for rel, data in AWKWARD_FILES.items():
        fs.pipe_file(f"{memory_root}/src/{rel}", data)
    manifest = pack(f"{memory_root}/src", tmp_path / "store", name="m")
    assert any(e.size > 1000 for e in manifest.entries) and any(e.size <= 1000 for e in manifest.entries)
    unpack(tmp_path / "store", name="m", dest=tmp_path / "out")
    assert _tree(tmp_path / "out") == AWKWARD_FILES


def test_progress_callbacks_add_up_to_the_dataset(awkward_dataset: Path, tmp_path: Path) -> None:
    from dsagent.format.digester import build_manifest

    seen = {"digest": [0, 0], "pack": [0, 0], "unpack": [0, 0]}

    def counter(step: str):  # type: ignore[no-untyped-def]
        def progress(done_bytes: int, files: int) -> None:
            seen[step][0] += done_bytes
            seen[step][1] += files

        return progress

    manifest = build_manifest(awkward_dataset, name="awk", progress=counter("digest"))
    pack(awkward_dataset, tmp_path / "store", name="awk", max_files=2, progress=counter("pack"))
    unpack(tmp_path / "store", name="awk", dest=tmp_path / "out", workers=3, progress=counter("unpack"))
    assert seen == {step: [manifest.total_bytes, manifest.file_count] for step in seen}
