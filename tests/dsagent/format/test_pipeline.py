"""The pipelined pack and unpack of one bundle: same bytes, every file verified, errors from any stage."""

from __future__ import annotations

import errno
import io
import os
import random
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from dsagent.errors import InsufficientSpace, IntegrityError
from dsagent.format.bundles import packwriter, storeobjects
from dsagent.format.bundles.bundle import pack, unpack, write_bundles
from dsagent.format.digester import build_manifest
from dsagent.format.manifest import FileEntry, bundle_path
from tests.dsagent.conftest import write_tree


def _files(seed: int = 7) -> dict[str, bytes]:
    """Sizes around every buffer and block edge: empty, 1 byte, 511-513, a few buffers' worth."""
    rng = random.Random(seed)
    sizes = [
        0,
        1,
        511,
        512,
        513,
        4095,
        4096,
        4097,
        10_000,
        3 * 4096 + 7,
        50_000,
        *(rng.randrange(0, 9000) for _ in range(40)),
    ]
    return {f"d{i % 3}/f{i:03d}.bin": rng.randbytes(size) for i, size in enumerate(sizes)}


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def small_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers of 4 KiB, two of them: every file crosses buffer edges and the stages wait on each other."""
    monkeypatch.setattr(packwriter, "CHUNK_SIZE", 4096)
    monkeypatch.setattr(packwriter, "PIPELINE_BUFFERS", 2)


def test_fast_tar_headers_are_byte_for_byte_what_tarfile_writes() -> None:
    rng = random.Random(1)
    entries = [
        FileEntry("a" * 100, 5, 0, "0" * 32),
        FileEntry("a" * 101, 5, 0, "0" * 32),  # too long for ustar: pax
        FileEntry("é/ü.jpg", 5, 10**18, "0" * 32),  # not ASCII: pax
        FileEntry("x/y.bin", 8**11, 1, "0" * 32),  # size needs 12 digits: pax
        FileEntry("x/y.bin", 8**11 - 1, (8**11 - 1) * 10**9, "0" * 32),
        FileEntry("x", 0, -5 * 10**9, "0" * 32),  # before 1970: pax
    ]
    for _ in range(2000):
        parts = ("".join(rng.choice("abc_.-09XY") for _ in range(rng.randint(1, 40))) for _ in range(rng.randint(1, 4)))
        entries.append(FileEntry("/".join(parts), rng.randint(0, 10**12), rng.randint(0, 4 * 10**18), "0" * 32))
    for entry in entries:
        assert packwriter.tar_header(entry) == packwriter._tar_header_slow(entry), entry


def test_the_tar_block_and_record_sizes_are_tarfiles() -> None:
    from dsagent.format import tarstream

    assert (tarstream.BLOCK, tarstream.RECORD) == (tarfile.BLOCKSIZE, tarfile.RECORDSIZE)


def _as_read(info: tarfile.TarInfo | None) -> tuple[object, ...] | None:
    return None if info is None else (info.name, info.size, info.mtime, info.mode, info.type, info.linkname)


def test_the_fast_header_reader_reads_what_tarfile_reads_or_leaves_it_to_tarfile() -> None:
    """Every plain header bundles write is read as ``TarInfo.frombuf`` reads it; a header with
    any byte changed is either left to ``frombuf`` (None) or still read exactly as it reads it."""
    from dsagent.format import tarstream

    rng = random.Random(3)
    alphabet = "abcXYZ019_.-/"
    for _ in range(500):
        path = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 100))).strip("/") or "x"
        entry = FileEntry(path, rng.randrange(0, 8**11), rng.randrange(0, 8**11) * 10**9, "0" * 32)
        header = packwriter.tar_header(entry)
        if len(header) != tarfile.BLOCKSIZE:
            continue  # a pax header first: not the plain form
        expected = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        assert _as_read(tarstream._plain_header(header)) == _as_read(expected)
        for _ in range(20):
            damaged = bytearray(header)
            damaged[rng.randrange(tarfile.BLOCKSIZE)] = rng.randrange(256)
            fast = tarstream._plain_header(bytes(damaged))
            if fast is None:
                continue
            assert _as_read(fast) == _as_read(tarfile.TarInfo.frombuf(bytes(damaged), "utf-8", "surrogateescape"))
    link = tarfile.TarInfo("link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    for header in (  # what bundles never hold is never taken by the fast path
        link.tobuf(tarfile.USTAR_FORMAT),
        packwriter.tar_header(FileEntry("a", 8, 0, "0" * 32)).replace(b"0000644", b"0000755"),
        packwriter.tar_header(FileEntry("a", 8, 0, "0" * 32)).replace(b"00000000010", b"0000000001 "),
    ):
        assert tarstream._plain_header(header) is None
    # after a pax header the ustar block holds tarfile's ASCII stand-in name, read the same way
    # (the pax record's path then overrides it, as before)
    after_pax = packwriter._tar_header_slow(FileEntry("é.bin", 1, 0, "0" * 32))[-tarfile.BLOCKSIZE :]
    assert _as_read(tarstream._plain_header(after_pax)) == _as_read(
        tarfile.TarInfo.frombuf(after_pax, "utf-8", "surrogateescape")
    )


def test_a_pack_on_many_threads_compresses_that_many_buffers_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.format.bundles.frames import FrameEncoder

    monkeypatch.setattr(packwriter, "CHUNK_SIZE", 4096)
    threads = 12  # more than the reader's usual buffers: it is lent one more for each
    together = threading.Barrier(threads, timeout=10)
    encode = FrameEncoder.encode

    turns = iter(range(threads + 1))

    def meeting(self: FrameEncoder, data: memoryview | bytes | bytearray) -> list[bytes | memoryview]:
        if next(turns, None):  # the `threads` buffers after the first meet (it shows zstd the text)
            together.wait()
        return encode(self, data)

    monkeypatch.setattr(FrameEncoder, "encode", meeting)
    rng = random.Random(3)
    files = {f"t{i:02d}.txt": " ".join(rng.choice(("alpha", "beta", "gamma")) for _ in range(700)).encode()
             for i in range(3 * threads)}  # fmt: skip
    src = write_tree(tmp_path / "src", files)
    pack(src, tmp_path / "store", name="many", threads=threads)
    assert not together.broken
    unpack(tmp_path / "store", name="many", dest=tmp_path / "out")
    assert _tree(tmp_path / "out") == files


@pytest.mark.usefixtures("small_buffers")
@pytest.mark.parametrize("threads", [0, 1, 2])
def test_pipelined_pack_writes_a_plain_tar_in_zstd_frames_that_unpacks_verified(tmp_path: Path, threads: int) -> None:
    files = _files()
    src = write_tree(tmp_path / "src", files)
    manifest = pack(src, tmp_path / "store", name="p", threads=threads)
    assert len(manifest.bundles) == 1
    raw = Path(bundle_path(str(tmp_path / "store"), manifest.bundles[0].digest)).read_bytes()
    data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar} == files  # type: ignore[union-attr]
    unpack(tmp_path / "store", name="p", dest=tmp_path / "out")
    assert _tree(tmp_path / "out") == files


@pytest.mark.usefixtures("small_buffers")
def test_a_file_that_grew_after_digesting_fails_the_pack_from_the_reader_thread(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", _files())
    manifest = build_manifest(src, name="p")
    (src / "d1/f010.bin").write_bytes(os.urandom(20_000))
    with pytest.raises(IntegrityError, match="changed after it was digested"):
        write_bundles(manifest, src, tmp_path / "store")
    assert _pipeline_threads() == []  # every stage ended
    assert list((tmp_path / "store" / "bundles").iterdir()) == []


@pytest.mark.usefixtures("small_buffers")
def test_a_full_store_stops_every_stage_and_leaves_no_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_tree(tmp_path / "src", _files())
    manifest = build_manifest(src, name="p")
    writes = []

    def full(self: object, data: bytes) -> int:
        writes.append(len(data))
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)

    def full_vector(self: object, pieces: list[bytes]) -> None:
        full(self, b"".join(pieces))

    monkeypatch.setattr(storeobjects.CountingWriter, "write", full)
    monkeypatch.setattr(storeobjects.CountingWriter, "writev", full_vector)
    with pytest.raises(InsufficientSpace):
        write_bundles(manifest, src, tmp_path / "store")
    assert _pipeline_threads() == []  # every stage ended
    assert list((tmp_path / "store" / "bundles").iterdir()) == []


@pytest.mark.parametrize("threads", [0, 2])
def test_a_store_on_a_really_full_disk_stops_every_stage_and_leaves_no_object(
    tmp_path: Path, small_tmpfs: Callable[[str], Path], threads: int
) -> None:
    files = {f"d{i % 4}/f{i:03d}.bin": os.urandom(40_000) for i in range(100)}  # 4 MB of noise: stored raw
    src = write_tree(tmp_path / "src", files)
    store = small_tmpfs("1m")
    with pytest.raises(InsufficientSpace):
        pack(src, store, name="p", threads=threads)
    assert _pipeline_threads() == []  # every stage ended
    assert list((store / "bundles").iterdir()) == []
    assert not (store / "p").exists()  # no manifest either


@pytest.mark.usefixtures("small_buffers")
@pytest.mark.parametrize("ahead", [0, 1, 2, 8])
def test_unpack_reads_ahead_to_any_depth_and_verifies_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: int
) -> None:
    from dsagent.format import framereader, tarstream
    from dsagent.format.bundles import extract

    monkeypatch.setattr(extract, "UNPACK_AHEAD", ahead)
    for module in (framereader, tarstream):  # many small compressed reads, and member reads
        monkeypatch.setattr(module, "CHUNK_SIZE", 1000)
    files = _files()
    pack(write_tree(tmp_path / "src", files), tmp_path / "store", name="p")
    unpack(tmp_path / "store", name="p", dest=tmp_path / "out")
    assert _tree(tmp_path / "out") == files
    assert _pipeline_threads() == []  # every stage ended


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "tampered"])
def test_errors_found_ahead_or_behind_end_the_read_ahead_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    from dsagent.format import framereader, tarstream

    for module in (framereader, tarstream):
        monkeypatch.setattr(module, "CHUNK_SIZE", 4096)
    files = _files()
    manifest = pack(write_tree(tmp_path / "src", files), tmp_path / "store", name="p")
    path = Path(bundle_path(str(tmp_path / "store"), manifest.bundles[0].digest))
    raw = bytearray(path.read_bytes())
    if damage == "corrupt":
        raw[len(raw) // 2] ^= 0xFF
    elif damage == "truncated":
        del raw[len(raw) // 2 :]
    path.write_bytes(bytes(raw))
    if damage == "tampered":  # the stream is sound but the manifest wants other bytes: found by the writing side
        entries = [
            e if e.path != "d2/f050.bin" else FileEntry(e.path, e.size, e.mtime_ns, "f" * 32) for e in manifest.entries
        ]
        monkeypatch.setattr(type(manifest), "bundle_entries", lambda self, ref: entries)
    with pytest.raises(IntegrityError):
        unpack(tmp_path / "store", name="p", dest=tmp_path / "out")
    assert _pipeline_threads() == []  # every stage ended
    assert not (tmp_path / "out").exists()


PIPELINE_THREADS = ("dsagent-pack-read", "dsagent-pack-write", "dsagent-unpack-read")


def _pipeline_threads() -> list[threading.Thread]:
    """The pipelines' threads still alive (other tests on this worker may run threads of their own)."""
    return [t for t in threading.enumerate() if t.name in PIPELINE_THREADS and t.is_alive()]


def test_a_vector_write_cut_short_goes_on_where_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.writev
    calls = []

    def short(fd: int, pieces: list[memoryview]) -> int:  # a real write of at most 1,000 bytes
        calls.append(len(pieces))
        room, cut = 1000, []
        for piece in pieces:
            cut.append(piece[:room])
            room -= len(cut[-1])
            if not room:
                break
        return real(fd, cut)

    monkeypatch.setattr(storeobjects.os, "writev", short)
    pieces = [os.urandom(n) for n in (0, 1, 999, 1000, 1001, 5000, 3)]
    with open(tmp_path / "out", "wb") as raw:
        raw.write(b"head")  # buffered by the file object: written before the vector
        counter = storeobjects.CountingWriter(raw)
        counter.writev([memoryview(p) for p in pieces])
    assert (tmp_path / "out").read_bytes() == b"head" + b"".join(pieces)
    assert counter.written == sum(map(len, pieces))
    assert len(calls) > 8


def test_a_vector_write_into_a_buffer_without_a_file_is_joined() -> None:
    raw = io.BytesIO()
    counter = storeobjects.CountingWriter(raw)
    counter.writev([b"ab", memoryview(b"cd"), b""])
    assert raw.getvalue() == b"abcd"
    assert counter.written == 4
