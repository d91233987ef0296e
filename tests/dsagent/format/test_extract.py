"""Extraction is verified and safe: crafted tar+zstd bundles never write outside the target."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from dsagent.errors import IntegrityError, UnsafeArchive
from dsagent.format.bundles.bundle import pack, unpack, unpack_bundle
from dsagent.format.manifest import Manifest, bundle_path
from tests.dsagent.conftest import write_tree

pytestmark = pytest.mark.usefixtures("native_mode")  # each test with the native loops and the pure ones

FILES = {"train/a.jpg": b"A" * 3000, "train/b.jpg": b"B" * 700, "val/c.jpg": b"C" * 1500}


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every path under ``root`` (not following links) with its kind and size."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            found[str(path.relative_to(root))] = (oct(st.st_mode >> 12), st.st_size if not path.is_dir() else 0)
    return found


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, Manifest]:
    src = write_tree(tmp_path / "src", FILES)
    store = tmp_path / "store"
    manifest = pack(src, store, name="d")
    assert len(manifest.bundles) == 1
    return store, manifest


def _member(
    name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, linkname: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    info.linkname = linkname
    return info, data


def _craft(store: Path, manifest: Manifest, members: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    """Replace the dataset's one bundle by a real tar+zstd file holding ``members``."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    Path(bundle_path(str(store), manifest.bundles[0].digest)).write_bytes(
        zstandard.ZstdCompressor(write_checksum=True).compress(raw.getvalue())
    )


def _legit() -> list[tuple[tarfile.TarInfo, bytes]]:
    return [_member(path, data) for path, data in sorted(FILES.items())]


MALICIOUS: dict[str, Callable[[], list[tuple[tarfile.TarInfo, bytes]]]] = {
    "absolute path": lambda: [_member("/tmp/dsagent-evil-abs", b"x"), *_legit()],
    "dot-dot path": lambda: [_member("../evil-dotdot", b"x"), *_legit()],
    "dot-dot inside path": lambda: [_member("train/../../evil-inner", b"x"), *_legit()],
    "symlink": lambda: [
        _member("train", kind=tarfile.SYMTYPE, linkname=".."),
        _member("train/a.jpg", FILES["train/a.jpg"]),
    ],
    "symlink to a listed name": lambda: [
        _member("train/a.jpg", kind=tarfile.SYMTYPE, linkname="/etc/passwd"),
        *_legit()[1:],
    ],
    "hard link": lambda: [_member("train/a.jpg", kind=tarfile.LNKTYPE, linkname="/etc/passwd"), *_legit()[1:]],
    "character device": lambda: [_member("train/a.jpg", kind=tarfile.CHRTYPE), *_legit()[1:]],
    "block device": lambda: [_member("train/a.jpg", kind=tarfile.BLKTYPE), *_legit()[1:]],
    "fifo": lambda: [_member("train/a.jpg", kind=tarfile.FIFOTYPE), *_legit()[1:]],
    "directory member": lambda: [_member("train", kind=tarfile.DIRTYPE), *_legit()],
    "unlisted member": lambda: [*_legit(), _member("train/zzz-extra.jpg", b"extra")],
    "duplicate member": lambda: [*_legit(), _member("val/c.jpg", FILES["val/c.jpg"])],
}


@pytest.mark.parametrize("kind", sorted(MALICIOUS))
def test_malicious_members_are_rejected_and_nothing_lands_anywhere(
    kind: str, packed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    store, manifest = packed
    _craft(store, manifest, MALICIOUS[kind]())
    before = _snapshot(tmp_path)
    with pytest.raises(UnsafeArchive):
        unpack(store, name="d", dest=tmp_path / "work" / "out")
    assert not (tmp_path / "work" / "out").exists()
    assert not Path("/tmp/dsagent-evil-abs").exists()
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != "work"} == before  # nothing outside, no staging left behind
    assert not any((tmp_path / "work").iterdir())


@pytest.mark.parametrize("kind", sorted(MALICIOUS))
def test_unpack_bundle_leaves_an_existing_target_as_it_was(
    kind: str, packed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    store, manifest = packed
    _craft(store, manifest, MALICIOUS[kind]())
    target = tmp_path / "cache"
    (target / "other").mkdir(parents=True)
    (target / "other" / "kept").write_bytes(b"k")
    before = _snapshot(tmp_path)
    with pytest.raises(UnsafeArchive):
        unpack_bundle(store, manifest, manifest.bundles[0], target)
    assert _snapshot(tmp_path) == before


def test_a_tampered_file_fails_its_digest(packed: tuple[Path, Manifest], tmp_path: Path) -> None:
    store, manifest = packed
    members = _legit()
    members[1] = _member("train/b.jpg", b"b" * 700)  # same size, other bytes
    _craft(store, manifest, members)
    with pytest.raises(IntegrityError, match="does not match its digest"):
        unpack(store, name="d", dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_member_of_the_wrong_size_is_rejected_before_it_is_written(
    packed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    store, manifest = packed
    members = _legit()
    members[1] = _member("train/b.jpg", b"B" * 701)
    _craft(store, manifest, members)
    with pytest.raises(IntegrityError, match="701 bytes"):
        unpack(store, name="d", dest=tmp_path / "out")


def test_a_missing_member_is_detected(packed: tuple[Path, Manifest], tmp_path: Path) -> None:
    store, manifest = packed
    _craft(store, manifest, _legit()[:-1])
    with pytest.raises(IntegrityError, match="lacks 1 listed file"):
        unpack(store, name="d", dest=tmp_path / "out")


@pytest.mark.parametrize("offset", [0, 10, -40, -5])
def test_a_flipped_bit_anywhere_in_a_bundle_is_detected(
    packed: tuple[Path, Manifest], tmp_path: Path, offset: int
) -> None:
    store, manifest = packed
    path = Path(bundle_path(str(store), manifest.bundles[0].digest))
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        unpack(store, name="d", dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.99])
def test_a_truncated_bundle_is_detected(packed: tuple[Path, Manifest], tmp_path: Path, keep: float) -> None:
    store, manifest = packed
    path = Path(bundle_path(str(store), manifest.bundles[0].digest))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(IntegrityError):
        unpack(store, name="d", dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_symlink_planted_in_the_target_is_not_followed(packed: tuple[Path, Manifest], tmp_path: Path) -> None:
    store, manifest = packed
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "cache"
    target.mkdir()
    (target / "train").symlink_to(outside)
    with pytest.raises(UnsafeArchive, match="not a directory"):
        unpack_bundle(store, manifest, manifest.bundles[0], target)
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in target.iterdir()) == ["train"]


def test_a_missing_bundle_object_is_not_found(packed: tuple[Path, Manifest], tmp_path: Path) -> None:
    from dsagent.errors import NotFound

    store, manifest = packed
    Path(bundle_path(str(store), manifest.bundles[0].digest)).unlink()
    with pytest.raises(NotFound):
        unpack(store, name="d", dest=tmp_path / "out")


def test_a_directory_in_the_way_is_a_conflict_and_the_bundle_is_taken_back(
    packed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    from dsagent.errors import Conflict

    store, manifest = packed
    target = tmp_path / "cache"
    (target / "val" / "c.jpg").mkdir(parents=True)  # a directory where a file must go
    (target / "val" / "c.jpg" / "x").write_bytes(b"keep")
    with pytest.raises(Conflict, match="clear the target"):
        unpack_bundle(store, manifest, manifest.bundles[0], target)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == ["val/c.jpg/x"]


@pytest.mark.parametrize("writers", [None, 1, 3])
def test_unpack_hands_its_writer_count_to_the_member_loop(
    packed: tuple[Path, Manifest], tmp_path: Path, writers: int | None, native_mode: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``unpack(writers=N)`` writes a lone bundle's files on N threads of the C loop (None:
    ``member_writers``), with the same files; the pure loop writes on its one thread."""
    from dsagent.format import native
    from dsagent.format.bundles import extract

    store, manifest = packed
    asked: list[int] = []
    real = native.extract_members

    def spy(*args: object, writers: int = 1, **keywords: object) -> object:
        asked.append(writers)
        return real(*args, writers=writers, **keywords)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "extract_members", spy)
    unpack(store, name="d", dest=tmp_path / "out", writers=writers)
    assert {p: (tmp_path / "out" / p).read_bytes() for p in FILES} == FILES
    if native_mode == "native":
        assert asked == [extract.member_writers(1) if writers is None else writers]
    else:
        assert asked == []
