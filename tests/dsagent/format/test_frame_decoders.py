"""A bundle's frames decoded on threads (dsagent.format.framereader, ``decoders``; the frame
layout in dsagent.format.zstdframes): the same bytes, the same errors and the same bounds
as the one reading thread, on sound, foreign, cut, corrupt and hostile streams, and no
thread left behind."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from dsagent.errors import IntegrityError
from dsagent.format import zstdframes
from dsagent.format.bundles import extract
from dsagent.format.bundles.bundle import pack, unpack_bundle
from dsagent.format.framereader import FrameReader
from dsagent.format.manifest import bundle_path
from dsplatform import cores
from tests.dsagent.conftest import write_tree

DECODE_THREAD = "dsagent-unpack-decode"


def _text(rng: random.Random, size: int) -> bytes:
    words = [b"alpha", b"beta", b"gamma", b"delta", b"tensor", b"epoch", b"\n"]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + b" "
    return bytes(out[:size])


def _files(seed: int = 3) -> dict[str, bytes]:
    """Text (compressed frames) and random bytes (frames of raw blocks), over several 1 MiB frames."""
    rng = random.Random(seed)
    files = {f"a-text/t{i:03d}.txt": _text(rng, rng.randrange(1, 60_000)) for i in range(120)}
    files |= {f"b-raw/r{i:03d}.bin": rng.randbytes(rng.randrange(0, 40_000)) for i in range(60)}
    files |= {"b-raw/empty.bin": b"", "c-text/big.txt": _text(rng, 1_500_000)}
    return files  # packed in path order: compressed frames first, then raw ones, then compressed


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    root = tmp_path_factory.mktemp("frames")
    manifest = pack(write_tree(root / "src", _files()), root / "store", name="p", max_bytes=10**9)
    assert len(manifest.bundles) == 1
    return Path(bundle_path(str(root / "store"), manifest.bundles[0].digest)).read_bytes()


class _Reads:
    """A stream returning at most ``step`` bytes a read, as a network stream does."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._step, self._at = data, step, 0

    def read(self, size: int = -1) -> bytes:
        size = self._step if size < 0 else min(size, self._step)
        out = self._data[self._at : self._at + size]
        self._at += len(out)
        return out


def _read_all(data: bytes, decoders: int, *, limit: int | None = None, step: int = 1 << 20) -> bytes | str:
    """What the reader yields, or the error it raises as ``Type: message``."""
    out = bytearray()
    try:
        with FrameReader(_Reads(data, step), "bundle x", limit=limit, ahead=2, frames=True, decoders=decoders) as r:  # type: ignore[arg-type]
            while view := r.read(1 << 20):
                out += view
    except IntegrityError as exc:
        return f"{type(exc).__name__}: {exc}"
    return bytes(out)


def _kind(result: bytes | str) -> bytes | str:
    """A result with libzstd's reason for a corrupt frame left out: the reason depends on the
    room left in the output zstd writes into, which differs between the paths' chunkings (one
    corrupt frame read 2 MiB or 64 KiB at a time: "Data corruption detected" or "Destination
    buffer is too small" at 42 of 300 corrupt bytes)."""
    if isinstance(result, str) and " is corrupt: " in result:
        return result.partition(" is corrupt: ")[0] + " is corrupt"
    return result


def _same(data: bytes, **kw: object) -> bytes | str:
    one = _read_all(data, 0, **kw)  # type: ignore[arg-type]
    many = _read_all(data, 3, **kw)  # type: ignore[arg-type]
    assert _kind(many) == _kind(one)
    return one


def _decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(DECODE_THREAD) and t.is_alive()]


def test_a_bundle_reads_the_same_on_decoding_threads_and_uses_them(bundle: bytes) -> None:
    expected = zstandard.ZstdDecompressor().stream_reader(bundle, read_across_frames=True).read()
    assert _same(bundle) == expected
    assert _same(bundle, step=4096) == expected  # frames cut across many small reads
    seen: list[str] = []
    real = zstdframes.decode_whole

    def watched(frame: list[memoryview]) -> bytes | None:
        seen.append(threading.current_thread().name)
        return real(frame)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zstdframes, "decode_whole", watched)
        assert _read_all(bundle, 3) == expected
    assert any(name.startswith(DECODE_THREAD) for name in seen)  # the text's frames went to the threads
    assert any(not name.startswith(DECODE_THREAD) for name in seen)  # raw-block frames stayed
    assert _decode_threads() == []


def test_a_bundle_that_starts_with_raw_blocks_is_decoded_on_the_reading_thread(tmp_path: Path) -> None:
    rng = random.Random(4)
    files = {f"a/r{i:03d}.bin": rng.randbytes(30_000) for i in range(80)} | {"b/t.txt": _text(rng, 900_000)}
    manifest = pack(write_tree(tmp_path / "src", files), tmp_path / "store", name="p", max_bytes=10**9)
    data = Path(bundle_path(str(tmp_path / "store"), manifest.bundles[0].digest)).read_bytes()
    cut: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zstdframes, "decode_whole", lambda frame: cut.append(1))  # a frame cut: a bug here
        assert _read_all(data, 3) == _read_all(data, 0)
    assert cut == []


def test_frames_this_path_does_not_cut_go_to_the_one_thread_path_in_order(bundle: bytes) -> None:
    rng = random.Random(5)
    big_text = _text(rng, 3 << 20)  # one frame that decodes past a thread's bound
    long_raw = rng.randbytes(5 << 20)  # one frame longer than the cutter holds
    skippable = (0x184D2A50).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    for stream in (
        zstandard.compress(big_text) + bundle,
        bundle + zstandard.compress(long_raw) + bundle,
        bundle + skippable + bundle,
        zstandard.ZstdCompressor(write_checksum=False, write_content_size=False).compress(big_text),
    ):
        result = _same(stream)
        assert isinstance(result, bytes) and len(result) > 0


@pytest.mark.parametrize("step", [1 << 20, 777])
def test_a_cut_stream_fails_the_same_way_wherever_it_is_cut(bundle: bytes, step: int) -> None:
    results = {_same(bundle[:cut], step=step) for cut in range(0, len(bundle), len(bundle) // 97 + 1)}
    assert any(isinstance(r, str) and "truncated" in r for r in results)  # inside a frame
    assert str(_same(b"")).startswith("IntegrityError: bundle x is truncated")


def test_a_corrupt_byte_fails_the_same_way_wherever_it_is(bundle: bytes) -> None:
    rng = random.Random(11)
    failed = 0
    for at in sorted(rng.sample(range(len(bundle)), 60)):
        broken = bytearray(bundle)
        broken[at] ^= 0x5A
        result = _same(bytes(broken))
        failed += isinstance(result, str)
    assert failed  # a byte in a compressed block, a frame or block header, or a checksum


def test_the_manifest_bound_holds_on_decoding_threads_too(bundle: bytes) -> None:
    total = len(_same(bundle))  # type: ignore[arg-type]
    assert _same(bundle, limit=total) != f"IntegrityError: bundle x decompresses to more than the {total} bytes"
    message = _same(bundle, limit=total // 2)
    assert isinstance(message, str) and f"more than the {total // 2} bytes its manifest allows" in message


def test_a_frame_of_zeros_decodes_no_further_than_a_thread_may_hold() -> None:
    bomb = zstandard.compress(bytes(512 << 20))  # half a GiB of zeros in a few hundred KB
    result = _same(bomb, limit=8 << 20)
    assert isinstance(result, str) and "more than the 8388608 bytes" in result


def test_a_reader_stopped_early_ends_its_decoding_threads(bundle: bytes) -> None:
    reader = FrameReader(_Reads(bundle, 1 << 20), "bundle x", ahead=2, frames=True, decoders=3)  # type: ignore[arg-type]
    assert reader.read(1000)
    reader.close()
    assert _decode_threads() == []


@pytest.mark.parametrize("native", [False, None])
def test_unpacking_with_decoders_writes_the_same_verified_files(tmp_path: Path, native: bool | None) -> None:
    files = _files(9)
    manifest = pack(write_tree(tmp_path / "src", files), tmp_path / "store", name="p", max_bytes=10**9)
    for decoders in (0, 3):
        out = tmp_path / f"out{decoders}"
        out.mkdir()
        unpack_bundle(tmp_path / "store", manifest, manifest.bundles[0], out, native=native, decoders=decoders)
        assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    assert _decode_threads() == []


@pytest.mark.parametrize(
    ("cpus", "at_once", "decoders"), [(1, 1, 0), (2, 1, 0), (4, 1, 2), (16, 1, 8), (64, 1, 8), (16, 4, 2), (16, 8, 0)]
)
def test_decoders_are_the_cores_left_beside_the_member_loops(
    monkeypatch: pytest.MonkeyPatch, cpus: int, at_once: int, decoders: int
) -> None:
    monkeypatch.setattr(cores, "usable", lambda: cpus)
    assert extract.frame_decoders(at_once) == decoders


def test_unpack_of_one_bundle_gives_it_the_spare_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsagent.format.bundles.bundle import unpack

    given: list[int] = []
    real: Callable[..., None] = extract.unpack_bundle

    def spy(*args: object, decoders: int = 0, **kwargs: object) -> None:
        given.append(decoders)
        real(*args, decoders=decoders, **kwargs)

    files = _files(2)
    pack(write_tree(tmp_path / "src", files), tmp_path / "store", name="p", max_bytes=10**9)
    monkeypatch.setattr(cores, "usable", lambda: 16)
    monkeypatch.setattr(extract, "unpack_bundle", spy)
    unpack(tmp_path / "store", name="p", dest=tmp_path / "out")
    assert given == [8]


def test_a_thread_decodes_one_frame_no_further_than_its_bound_in_pieces_or_whole() -> None:
    rng = random.Random(8)
    small, large = _text(rng, 1 << 20), _text(rng, zstdframes.FRAME_DECODE_MAX + 1)
    for data, whole in ((small, True), (large, False)):
        frame = memoryview(zstandard.compress(data))
        third = len(frame) // 3
        for pieces in ([frame], [frame[:third], frame[third : 2 * third], frame[2 * third :]]):
            assert zstdframes.decode_whole(pieces) == (data if whole else None)
    two = memoryview(zstandard.compress(small) + zstandard.compress(small))
    assert zstdframes.decode_whole([two]) is None  # bytes after the frame: not one whole frame
    assert zstdframes.decode_whole([memoryview(zstandard.compress(small))[:-3]]) is None  # cut


@pytest.mark.parametrize("step", [1 << 20, 5000])
@pytest.mark.parametrize("size", [3 << 19, zstdframes.FRAME_CUT_MAX])
def test_the_one_thread_path_hands_zstd_whole_frames_from_a_buffer_it_reads_into_again(
    bundle: bytes, step: int, size: int
) -> None:
    """Every run handed on is whole frames, in order, and the frame the buffer's end cuts is
    read on from the buffer's front: together they are the object, byte for byte."""
    from backports import zstd as bz

    from dsagent.format.framereader import _WholeFrames

    source = _WholeFrames(_Reads(bundle, step), size=size)  # type: ignore[arg-type]
    runs = []
    while run := source.read(131_075):
        run = bytes(run)
        at = 0
        while at < len(run):
            at += bz.get_frame_size(run[at:])
        assert at == len(run)  # whole frames only
        runs.append(run)
    assert b"".join(runs) == bundle and source.rest is None
    assert len(runs) > 1 and max(map(len, runs)) <= size


def test_the_one_thread_path_leaves_what_is_not_whole_frames_to_the_one_frame_path(bundle: bytes) -> None:
    """A cut last frame, and a frame longer than the buffer, are held for the path that
    refuses or decodes them, not handed to zstd."""
    from dsagent.format.framereader import _WholeFrames

    cut = _WholeFrames(_Reads(bundle[:-3], 1 << 20))  # type: ignore[arg-type]
    handed = b""
    while run := cut.read():
        handed += bytes(run)
    assert cut.rest is not None and handed + cut.rest == bundle[:-3]
    long_raw = zstandard.ZstdCompressor(level=1).compress(random.Random(9).randbytes(600_000))
    small = _WholeFrames(_Reads(long_raw + bundle, 1 << 20), size=300_000)  # type: ignore[arg-type]
    assert small.read() == b"" and small.rest is not None and long_raw.startswith(small.rest)
    for data in (b"", b"not a frame at all"):
        assert str(_same(data)).startswith("IntegrityError: bundle x is")


def test_the_one_thread_path_takes_streams_that_read_only_by_read_and_give_more_than_asked(bundle: bytes) -> None:
    """A body with no ``readinto`` (a peer's, a ranged fetch's) and one whose ``read(n)``
    returns more than ``n``: the same bytes as a file's."""

    class Generous:
        def __init__(self, data: bytes) -> None:
            self._data, self._at = data, 0

        def read(self, size: int = -1) -> bytes:
            out = self._data[self._at : self._at + max(size, 0) + 777_777]
            self._at += len(out)
            return out

    from dsagent.format.framereader import _WholeFrames

    assert len(bundle) > 3 << 19
    source = _WholeFrames(Generous(bundle), size=3 << 19)  # type: ignore[arg-type]
    runs = []
    while run := source.read():
        runs.append(bytes(run))
    assert b"".join(runs) == bundle and source.rest is None and len(runs) > 1
    long_raw = zstandard.ZstdCompressor(level=1).compress(random.Random(9).randbytes(2 << 20))
    held = _WholeFrames(Generous(bundle[:1000] + long_raw), size=3 << 19)  # type: ignore[arg-type]
    assert held.read() == b"" and held.rest == bundle[:1000] + long_raw  # what it read past its buffer too
    expected = _read_all(bundle, 0)
    assert isinstance(expected, bytes) and expected
    with FrameReader(Generous(bundle), "bundle x", ahead=2, frames=True) as r:  # type: ignore[arg-type]
        out = bytearray()
        while view := r.read(1 << 20):
            out += view
    assert bytes(out) == expected


def test_a_bundles_frames_are_decoded_by_one_context_on_the_reading_thread(
    bundle: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A context a frame cost a quarter of the decoding's CPU (docs/design-native.md#start-up):
    the one-thread path makes one for all of the bundle's frames."""
    made = []
    real = zstandard.ZstdDecompressor

    def counted(*args: object, **kwargs: object) -> zstandard.ZstdDecompressor:
        made.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(zstandard, "ZstdDecompressor", counted)
    frames, at = 0, 0
    from backports import zstd as bz

    while at < len(bundle):
        at += bz.get_frame_size(bundle[at:])
        frames += 1
    assert frames > 3
    assert isinstance(_read_all(bundle, 0), bytes)
    assert len(made) == 1
