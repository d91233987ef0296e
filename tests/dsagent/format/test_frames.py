"""Bundles as zstd frames, raw where zstd cannot shrink the data: readable by the real
``zstd`` and GNU ``tar``, by this project's reader, and old one-frame bundles still unpack."""

from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest
import zstandard

from dsagent.errors import IntegrityError
from dsagent.format import native
from dsagent.format.bundles.bundle import pack, unpack
from dsagent.format.bundles.frames import (
    BLOCK,
    RAW_FRAME_HEADER,
    FrameEncoder,
    FrameWriter,
    raw_frame,
    rle_frame,
    zero_runs,
    zero_tails,
)
from dsagent.format.bundles.repack import repack
from dsagent.format.manifest import bundle_path
from tests.dsagent.conftest import write_tree

_TOOLS = pytest.mark.skipif(
    shutil.which("zstd") is None or shutil.which("tar") is None, reason="needs the zstd and tar binaries"
)


def _text(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    words = [b"label", b"image", b"class", b"train", b"valid", b"0.5", b"cat", b"dog", b"\n"]
    return b" ".join(rng.choice(words) for _ in range(n // 4))[:n]


def _mixed() -> dict[str, bytes]:
    """Half incompressible (like JPEGs), half text, sizes across block edges."""
    files = {}
    for i in range(24):
        size = random.Random(i).randrange(100, 300_000)
        files[f"img/{i:03d}.jpg"] = os.urandom(size)
        files[f"txt/{i:03d}.txt"] = _text(size, i)
    return files


def _frames(raw: bytes) -> list[bytes]:
    """The frames of a bundle, split where zstd ends each one."""
    frames, pos = [], 0
    while pos < len(raw):
        reader = zstandard.ZstdDecompressor().decompressobj()
        reader.decompress(raw[pos:])
        length = len(raw) - pos - len(reader.unused_data)
        frames.append(raw[pos : pos + length])
        pos += length
    return frames


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_incompressible_blocks_are_stored_raw_and_text_is_compressed() -> None:
    encoder = FrameEncoder(level=1)
    noise = os.urandom(3 * BLOCK)
    text = _text(3 * BLOCK, 1)
    frames = encoder.encode(noise + text)
    assert frames[0] == RAW_FRAME_HEADER  # the noise: one frame of raw blocks
    assert encoder.raw_bytes == len(noise)
    assert encoder.compressed_bytes == len(text)
    encoded = b"".join(bytes(f) for f in frames)
    assert len(encoded) < len(noise) + len(text) // 2  # the text half shrank
    assert len(encoded) < len(noise) + 64 + len(text)  # the raw half cost a few header bytes
    decoded = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(encoded), read_across_frames=True).read()
    assert decoded == noise + text


def _tar_of(sizes: list[int], content: bytes | None = None) -> bytes:
    """A tar stream of files of these sizes: random bytes (like JPEGs) unless ``content``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i, size in enumerate(sizes):
            info = tarfile.TarInfo(f"n{i // 50:04d}/{i:06d}.jpg")
            info.size = size
            tar.addfile(info, io.BytesIO(content[:size] if content is not None else os.urandom(size)))
    return out.getvalue()


def _encoded(data: bytes) -> tuple[bytes, FrameEncoder]:
    """``data`` through one encoder, checked to decode to itself with zstd."""
    encoder = FrameEncoder(level=1)
    out = b"".join(bytes(frame) for frame in encoder.encode(data))
    assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(out), read_across_frames=True).read() == data
    return out, encoder


def test_the_tar_framing_of_incompressible_files_costs_no_zstd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "AVAILABLE", False)  # the pure rules; test_native_pack.py runs the C ones
    check_the_framing_costs_no_zstd()


def check_the_framing_costs_no_zstd() -> None:
    """Small incompressible files: no zstd, the framing's zeros in RLE blocks; tiny ones: zstd."""
    rng = random.Random(7)
    jpegs = _tar_of([int(rng.lognormvariate(9.4, 0.6)) for _ in range(400)])  # ~12 KB median: a header each
    out, encoder = _encoded(jpegs)
    # zstd would save ~5% of these blocks (the headers' zeros) for a full block's work
    assert encoder.compressed_bytes <= BLOCK and len(out) < len(jpegs) + 1024
    small = _tar_of([int(rng.lognormvariate(8.3, 0.5)) for _ in range(1500)])  # ~4 KB: headers are 14%
    out, encoder = _encoded(small)
    assert encoder.compressed_bytes == 0  # no zstd, yet the headers' and paddings' zeros are gone:
    assert len(out) < 0.92 * len(small)  # RLE blocks (zstd at level 1 on the whole: 0.86)
    thumbnails = _tar_of([rng.randrange(200, 700) for _ in range(400)])  # headers: most of the bytes
    out, encoder = _encoded(thumbnails)
    assert encoder.compressed_bytes >= len(thumbnails) // 2  # zstd rightly does the work here
    assert len(out) < 1.05 * len(zstandard.ZstdCompressor(level=1).compress(thumbnails))


def test_zero_runs_end_tar_records_and_become_rle_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "AVAILABLE", False)  # the pure rules; test_native_pack.py runs the C ones
    check_zero_runs_and_rle_blocks()


def check_zero_runs_and_rle_blocks() -> None:
    """Which zeros are runs, how they count a block, and the RLE frame zstd reads back."""
    x = b"x"
    data = (
        x * 448 + bytes(64)  # a tail just long enough
        + x * 449 + bytes(63)  # one byte short
        + bytes(512) * 2  # whole records of zeros: one run with the tail before them
        + x * 500 + bytes(12)  # too short
        + bytes(100) + x * 412  # zeros not at a record's end
    )  # fmt: skip
    assert zero_runs(memoryview(data)) == [(448, 512), (512 + 449, 4 * 512)]
    assert list(zero_tails(memoryview(data))) == [64 + 63 + 1024]
    frame = rle_frame(memoryview(data))
    assert zstandard.ZstdDecompressor().decompressobj().decompress(frame) == data
    assert len(frame) == 6 + 3 * 3 + (len(data) - 64 - 1087) + 2 * 4  # 3 raw blocks and 2 RLE blocks
    long = bytes(3 * BLOCK)  # an RLE block holds a block at most
    assert zstandard.ZstdDecompressor().decompressobj().decompress(rle_frame(memoryview(long))) == long
    assert rle_frame(memoryview(b"")) == raw_frame(b"")[0] + raw_frame(b"")[1]


def _compressed(block: bytes) -> bool:
    """Whether the encoder sends ``block`` (one block or less) through zstd."""
    encoder = FrameEncoder(level=1)
    encoder.encode(block)
    return encoder.compressed_bytes == len(block)


def test_the_verdict_follows_what_zstd_would_save_beyond_the_zero_runs() -> None:
    rng = random.Random(3)
    for share in (0.0, 0.05, 0.5, 0.9):
        block = bytearray(os.urandom(BLOCK))
        for start in range(0, BLOCK, 512):  # zeros at the start of every tar record: no RLE run
            block[start : start + int(512 * share)] = bytes(int(512 * share))
        saved = 1 - len(zstandard.ZstdCompressor(level=1).compress(bytes(block))) / BLOCK
        assert _compressed(bytes(block)) == (saved >= 0.1), (share, saved)
        moved = b"".join(
            block[start + int(512 * share) : start + 512] + bytes(int(512 * share)) for start in range(0, BLOCK, 512)
        )
        assert share == 0 or not _compressed(moved)  # the same zeros ending each record: RLE blocks take them
    assert _compressed(_text(BLOCK, rng.randrange(100)))
    assert _compressed(bytes(100)) and not _compressed(os.urandom(100_000))


@pytest.mark.parametrize("threads", [0, 2])
def test_the_frame_writer_keeps_buffers_in_order_on_any_thread_count(threads: int) -> None:
    data = b"".join(os.urandom(300_000) + _text(200_000, i) for i in range(6))
    out: list[bytes] = []
    writer = FrameWriter(out.append, level=3, threads=threads)
    buffer = bytearray(1 << 18)
    for start in range(0, len(data), len(buffer)):
        piece = data[start : start + len(buffer)]
        buffer[: len(piece)] = piece
        writer.write(memoryview(buffer)[: len(piece)])  # the buffer is reused at once, as the pack does
    writer.close()
    assert writer.raw_bytes + writer.compressed_bytes == len(data)
    assert writer.raw_bytes and writer.compressed_bytes
    stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b"".join(out)), read_across_frames=True)
    assert stream.read() == data


def test_a_frame_writer_encodes_as_many_buffers_at_once_as_it_has_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    threads = 8
    together = threading.Barrier(threads, timeout=10)  # broken unless `threads` encodes run at once
    encode = FrameEncoder.encode

    turns = iter(range(threads + 1))

    def meeting(self: FrameEncoder, data: memoryview | bytes | bytearray) -> list[bytes | memoryview]:
        if next(turns, None):  # the `threads` buffers after the first meet
            together.wait()
        return encode(self, data)

    monkeypatch.setattr(FrameEncoder, "encode", meeting)
    pieces = [_text(1 << 16, i) for i in range(2 * threads + 3)]
    out: list[bytes] = []
    writer = FrameWriter(out.append, level=1, threads=threads)
    writer.write(pieces[0])  # the first goes alone: once it went to zstd, the writer goes deep
    writer.settle()  # waited for, unless the write already handed it on, encoded (deep at once)
    assert len(out) == 1 and writer.deep
    for piece in pieces[1:]:
        writer.write(piece)
    writer.close()
    assert not together.broken
    stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b"".join(out)), read_across_frames=True)
    assert stream.read() == b"".join(pieces)


def test_where_blocks_are_stored_raw_a_frame_writer_keeps_no_more_in_hand_than_usual(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsagent.format.bundles import frames

    running, most = [0], [0]
    lock = threading.Lock()
    encode = FrameEncoder.encode

    def counted(self: FrameEncoder, data: memoryview | bytes | bytearray) -> list[bytes | memoryview]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return encode(self, data)

    monkeypatch.setattr(FrameEncoder, "encode", counted)
    out: list[bytes] = []
    writer = FrameWriter(out.append, level=1, threads=12)
    pieces = [os.urandom(1 << 16) for _ in range(20)]
    writer.write(pieces[0])
    while not writer.settle(wait=False):  # once a buffer was stored raw...
        time.sleep(0.001)
    assert not writer.deep
    most[0] = 0
    for piece in pieces[1:]:
        writer.write(piece)
    writer.close()
    assert 2 <= most[0] <= frames._AHEAD + 1  # ...four ahead and the one being handed in
    assert writer.raw_bytes == sum(map(len, pieces)) and b"".join(out).count(RAW_FRAME_HEADER) >= len(pieces)


def test_an_encoded_buffer_goes_on_without_waiting_for_a_later_write_and_none_is_waited_for_unasked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    go = threading.Event()
    encode = FrameEncoder.encode

    def held(self: FrameEncoder, data: memoryview | bytes | bytearray) -> list[bytes | memoryview]:
        assert go.wait(10)
        return encode(self, data)

    monkeypatch.setattr(FrameEncoder, "encode", held)
    out: list[bytes] = []
    writer = FrameWriter(out.append, level=1, threads=2)
    first, second = _text(5000, 1), _text(5000, 2)
    writer.write(first)
    assert not writer.settle(wait=False) and not out  # still being encoded: not waited for
    go.set()
    deadline = time.monotonic() + 10
    while not writer.settle(wait=False):  # handed on once encoded, with no write after it
        assert time.monotonic() < deadline
    assert len(out) == 1
    writer.write(second)
    writer.close()
    stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b"".join(out)), read_across_frames=True)
    assert stream.read() == first + second


@pytest.mark.parametrize("threads", [0, 2])
def test_a_lent_buffer_is_written_from_itself_and_given_back_only_once_written(threads: int) -> None:
    data = b"".join(os.urandom(300_000) + _text(200_000, i) for i in range(4))
    size = 1 << 18
    buffers = [bytearray(size) for _ in range(3)]
    free = list(range(len(buffers)))
    events: list[tuple[str, int]] = []
    out: list[bytes] = []

    def gather(pieces: list[bytes | memoryview], release: object) -> None:
        lent = {id(p.obj) for p in pieces if isinstance(p, memoryview)}
        assert lent <= {id(b) for b in buffers}  # raw blocks: views of the lent buffer, not copies
        out.append(b"".join(pieces))
        events.append(("written", len(out)))
        release()  # type: ignore[operator]

    writer = FrameWriter(lambda b: pytest.fail("a lent buffer went through the copying sink"), level=3,
                         threads=threads, gather=gather)  # fmt: skip
    written = 0
    for start in range(0, len(data), size):
        if not free:  # the lender waits for a buffer of its own: what is pending is handed on
            assert writer.settle()
        index = free.pop(0)
        piece = data[start : start + size]
        buffers[index][: len(piece)] = piece
        written += 1

        def release(index: int = index, turn: int = written) -> None:
            assert ("written", turn) in events  # never before its frames are out
            free.append(index)

        writer.write(memoryview(buffers[index])[: len(piece)], release)
    writer.close()
    assert not writer.settle()
    assert sorted(free) == [0, 1, 2]  # every buffer given back
    assert writer.raw_bytes and writer.compressed_bytes
    stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b"".join(out)), read_across_frames=True)
    assert stream.read() == data


@_TOOLS
def test_a_packed_bundle_is_read_by_the_zstd_and_gnu_tar_binaries(tmp_path: Path) -> None:
    files = _mixed()
    src = write_tree(tmp_path / "src", files)
    manifest = pack(src, tmp_path / "store", name="m")
    (ref,) = manifest.bundles
    path = bundle_path(str(tmp_path / "store"), ref.digest)
    raw = Path(path).read_bytes()
    assert len(_frames(raw)) > 1  # raw and compressed runs alternate
    assert ref.compressed_size < ref.size  # the text shrank
    out = tmp_path / "c"
    out.mkdir()
    subprocess.run(f"zstd -dc {path} | tar -x -C {out}", shell=True, check=True)
    assert _tree(out) == files
    assert subprocess.run(["zstd", "-t", "-q", path], check=False).returncode == 0


@_TOOLS
def test_a_bundle_of_small_files_with_rle_blocks_is_read_by_the_binaries_and_unpacked(tmp_path: Path) -> None:
    rng = random.Random(5)
    files = {f"n{i // 100:02d}/{i:04d}.jpg": os.urandom(int(rng.lognormvariate(8.3, 0.5))) for i in range(600)}
    src = write_tree(tmp_path / "src", files)
    manifest = pack(src, tmp_path / "store", name="s")
    (ref,) = manifest.bundles
    path = bundle_path(str(tmp_path / "store"), ref.digest)
    tar_size = sum(512 + -(-len(data) // 512) * 512 for data in files.values()) + 1024
    assert ref.compressed_size < 0.93 * tar_size  # the framing's zeros went to RLE blocks
    out = tmp_path / "c"
    out.mkdir()
    subprocess.run(f"zstd -dc {path} | tar -x -C {out}", shell=True, check=True)
    assert _tree(out) == files
    assert subprocess.run(["zstd", "-t", "-q", path], check=False).returncode == 0
    unpack(tmp_path / "store", name="s", dest=tmp_path / "ours")
    assert _tree(tmp_path / "ours") == files


def test_a_bundle_written_as_one_frame_still_unpacks(tmp_path: Path) -> None:
    files = _mixed()
    src = write_tree(tmp_path / "src", files)
    manifest = pack(src, tmp_path / "store", name="old")
    path = Path(bundle_path(str(tmp_path / "store"), manifest.bundles[0].digest))
    tar = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes()), read_across_frames=True).read()
    path.write_bytes(zstandard.ZstdCompressor(level=1, write_checksum=True).compress(tar))  # as packs used to write
    assert len(_frames(path.read_bytes())) == 1
    unpack(tmp_path / "store", name="old", dest=tmp_path / "out")
    assert _tree(tmp_path / "out") == files


def test_a_bundle_cut_between_two_frames_or_followed_by_junk_is_refused(tmp_path: Path) -> None:
    files = _mixed()
    src = write_tree(tmp_path / "src", files)
    manifest = pack(src, tmp_path / "store", name="cut")
    path = Path(bundle_path(str(tmp_path / "store"), manifest.bundles[0].digest))
    whole = path.read_bytes()
    frames = _frames(whole)
    assert len(frames) > 2
    path.write_bytes(b"".join(frames[: len(frames) // 2]))  # a clean frame edge, half the tar missing
    with pytest.raises(IntegrityError):
        unpack(tmp_path / "store", name="cut", dest=tmp_path / "out1")
    path.write_bytes(whole + b"junk after the last frame")
    with pytest.raises(IntegrityError):
        unpack(tmp_path / "store", name="cut", dest=tmp_path / "out2")
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


@_TOOLS
def test_a_repacked_bundle_is_the_same_tar_as_the_packed_one(tmp_path: Path) -> None:
    files = _mixed()
    src = write_tree(tmp_path / "src", files)
    manifest = pack(src, tmp_path / "store", name="r")
    stream = b"".join(repack(src, list(manifest.bundle_entries(manifest.bundles[0]))))
    packed = Path(bundle_path(str(tmp_path / "store"), manifest.bundles[0].digest)).read_bytes()
    decode = zstandard.ZstdDecompressor()
    assert (
        decode.stream_reader(io.BytesIO(stream), read_across_frames=True).read()
        == decode.stream_reader(io.BytesIO(packed), read_across_frames=True).read()
    )
    done = subprocess.run(["zstd", "-dc"], input=stream, capture_output=True, check=True)
    assert done.stdout.startswith(b"img/000.jpg")
