"""A large bundle packed in segments by forked processes is the same tar stream, verified
the same way, and fails the same way."""

from __future__ import annotations

import io
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import zstandard

from dsagent.errors import IntegrityError
from dsagent.format import native
from dsagent.format.bundles import bundle, packparallel, packwriter
from dsagent.format.bundles.bundle import pack_dataset, unpack, verify_tree
from dsagent.format.manifest import FileEntry, bundle_path
from tests.dsagent.conftest import write_tree


@pytest.fixture
def segmenting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments for small bundles, and forks even under a test runner with threads."""
    monkeypatch.setattr(bundle, "SEGMENT_MIN_BYTES", 1)
    monkeypatch.setattr(packparallel, "SEGMENT_MIN_BYTES", 1)
    monkeypatch.setattr(packparallel, "SEGMENT_MIN_FILES", 4)
    monkeypatch.setattr(bundle, "can_fork", lambda: True)


def _files() -> dict[str, bytes]:
    return {f"d{i % 3}/{i:03d}.bin": (os.urandom(900 + 41 * i) if i % 2 else b"text " * (300 + i)) for i in range(40)}


def _tar(path: str) -> bytes:
    raw = Path(path).read_bytes()
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True).read()


@pytest.mark.usefixtures("segmenting")
def test_a_segmented_bundle_is_the_same_tar_and_unpacks_verified(tmp_path: Path) -> None:
    files = _files()
    src = write_tree(tmp_path / "src", files, ("empty",))
    counted: list[tuple[int, int]] = []
    one, _ = pack_dataset(src, tmp_path / "one", name="d")
    three, _ = pack_dataset(
        src, tmp_path / "three", name="d", processes=3, progress=lambda b, f: counted.append((b, f))
    )
    assert three.digest == one.digest and [b.digest for b in three.bundles] == [b.digest for b in one.bundles]
    (ref,) = three.bundles
    assert _tar(bundle_path(str(tmp_path / "three"), ref.digest)) == _tar(
        bundle_path(str(tmp_path / "one"), ref.digest)
    )
    assert sum(f for _, f in counted) == len(files) and sum(b for b, _ in counted) == three.total_bytes
    unpack(tmp_path / "three", name="d", dest=tmp_path / "out")
    verify_tree(tmp_path / "out", three)
    if shutil.which("zstd") and shutil.which("tar"):
        (tmp_path / "c").mkdir()
        path = bundle_path(str(tmp_path / "three"), ref.digest)
        subprocess.run(f"zstd -dc {path} | tar -x -C {tmp_path / 'c'}", shell=True, check=True)
        assert {
            p.relative_to(tmp_path / "c").as_posix(): p.read_bytes() for p in (tmp_path / "c").rglob("*.bin")
        } == files
    assert multiprocessing.active_children() == []


@pytest.mark.usefixtures("segmenting")
def test_a_file_changed_inside_a_segment_fails_the_pack_and_leaves_no_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tree(tmp_path / "src", _files())
    real = packwriter.BundleWriter._read_local

    def rewritten(self: packwriter.BundleWriter, entry: FileEntry, tar: object, state: object) -> int:
        if entry.path == "d2/038.bin":  # in the last segment, packed by a forked process
            (src / entry.path).write_bytes(b"rewritten while packed")
        return real(self, entry, tar, state)  # type: ignore[arg-type]

    monkeypatch.setattr(packwriter.BundleWriter, "_read_local", rewritten)
    monkeypatch.setattr(native, "AVAILABLE", False)  # the Python reader, hooked above
    with pytest.raises(IntegrityError, match="changed while it was packed"):
        pack_dataset(src, tmp_path / "store", name="d", processes=2)
    assert list((tmp_path / "store" / "bundles").iterdir()) == []
    assert multiprocessing.active_children() == []
