"""The compressed side of a bundle: its tar stream as a sequence of zstd frames, raw where
compressing would not pay.

Who calls it: the bundle writer (:mod:`dsagent.format.bundles.packwriter`) and the peer server's
re-packing (:mod:`dsagent.format.bundles.repack`). What it owns: deciding, per 128 KiB block of the
tar stream, whether zstd is worth its CPU, and writing the frames.

Training data is mostly JPEG, PNG, video and compressed arrays: zstd cannot shrink them,
yet at level 1 it still spends most of a pack's CPU looking for matches. So each block is
probed first: a 2 KiB sample of it (64 pieces of 32 bytes spread evenly over the block)
is compressed at level 1, and unless that shrinks it by a tenth of the block beyond the
block's zero runs (below), the block is stored raw. The pieces are small and many so that
the sample holds as much of the tar headers and padding as the block does: a sample of
four 1 KiB pieces, one of them landing on a header with fair odds, judged a fifth of the
blocks of a tree of JPEG-like files worth zstd's time, which then saved 1% of their bytes
for a tenth of the pack's time; the spread sample judges 10 blocks in 5,600 so. Where the
native extension is built, the samples of a whole buffer are cut in C in one call
(:func:`dsagent.format.native.block_samples`, byte for byte the Python cut).

A run of raw blocks becomes one zstd frame of *raw blocks* (block type 0: a 3-byte header,
then the bytes as they are), built here without calling zstd at all; a run of
compressible blocks becomes one ordinary frame from libzstd at the pack's level, with its
content checksum. What zstd would still find in incompressible files is the tar framing:
each member's header ends in zeros and its data is padded with zeros to 512 bytes, 14% of
the stream for 4 KB files. Those zero runs (:func:`zero_runs`: zeros ending a 512-byte
record, at least :data:`RLE_MIN` long) are *RLE blocks* in a raw run's frame (block type 1:
a 3-byte header and the one byte, repeated) when they are at least a sixteenth of the run
(:func:`rle_frame`; below that the raw blocks are written from the pipeline's buffer with
no copy). At 200,000 files of 4 KB that stores 986 MB where zstd on the blocks the framing
made look compressible stored 1,005 MB for 0.33 CPU-s, and the tar stream is 1,083 MB.
Zero runs and RLE frames are made in C where the extension is built
(:func:`dsagent.format.native.zero_tails`, :func:`dsagent.format.native.rle_frame`), byte
for byte what the Python rule makes. Raw frames carry no checksum: every member's bytes are
checked against their xxh3-128 digest by whoever unpacks them, and tar headers carry their
own checksum.

The result is still a tar stream compressed by zstd: ``zstd -d`` decodes concatenated
frames, so ``zstd -dc bundle.tar.zst | tar -x`` reads it (tested with the real binaries).
Readers of this project accept several frames (:class:`dsagent.format.framereader.FrameReader`
with ``frames=True``); a bundle written as one frame by earlier versions is just the
one-frame case.

With ``threads`` > 1, buffers are encoded on a small thread pool (zstd releases the GIL)
and written in order, so compressible data uses every core.

A caller that lends its buffer (``write(data, release)``) gets it back through
``release`` once the frames are written: raw blocks are then handed to the sink as views
of that buffer (``gather``, e.g. :meth:`dsagent.format.bundles.packwriter.WriteBehind.gather`,
which writes them with one ``writev``), so incompressible data is copied once on its way
out (into the kernel) instead of three times (for the pool, a join, the write).
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import zstandard

from dsagent.format import native
from dsagent.format.zstdframes import ZSTD_BLOCK_MAX, ZSTD_MAGIC

#: Block size of the decision and of a raw block (zstd's largest block).
BLOCK = ZSTD_BLOCK_MAX
#: A block is stored raw unless zstd would shrink it below this share of its size, its
#: zero runs aside (in tenths: the verdict is integer arithmetic).
_RAW_TENTHS = 9
RAW_RATIO = _RAW_TENTHS / 10
#: The sample a block is judged by: this many pieces of this many bytes, spread evenly.
_PIECES = 64
_PIECE = 32
#: zstd frame magic, then a frame header descriptor with no content size, no checksum,
#: no dictionary, not single-segment, then a window descriptor of 128 KiB (2**(10+7)).
RAW_FRAME_HEADER = struct.pack("<IBB", ZSTD_MAGIC, 0x00, 7 << 3)
_RAW = 0
_RLE = 1
_LAST = 1
#: A run of zeros at least this long that ends a 512-byte tar record is an RLE block.
RLE_MIN = 64
_RECORD = 512
#: A raw run takes RLE blocks when its zero runs are at least this share of it (else its
#: raw blocks are written straight from the buffer, with no copy).
RLE_SHARE = 16
#: Buffers being encoded at once ahead of the writer (threaded mode). Where zstd is the pack's
#: slowest stage (more bytes so far went to it than were stored raw: text), a writer with more
#: threads is ``deep``: it keeps one buffer in hand per thread (:attr:`FrameWriter.extra_held`
#: more) and hands each on as soon as it is encoded, so that they are compressed on every core
#: it was given. Where blocks are stored raw, the reader is the slow stage and more in hand only
#: adds threads taking turns at the GIL: on a 16-core node, in process, 12,000 text files packed
#: in 0.147 s deep against 0.237 s four ahead, while 6,000 random files of 65 KB took 0.274 s
#: deep against 0.241 s, so a writer starts four ahead and goes deep once zstd has the bytes.
_AHEAD = 4


def _block_header(size: int, last: bool, kind: int = _RAW) -> bytes:
    return (size << 3 | kind << 1 | (_LAST if last else 0)).to_bytes(3, "little")


def raw_frame(data: memoryview | bytes | bytearray) -> list[bytes | memoryview]:
    """``data`` as one zstd frame of raw blocks: a header, then each block behind its own."""
    view = memoryview(data)
    pieces: list[bytes | memoryview] = [RAW_FRAME_HEADER]
    if not view:
        pieces.append(_block_header(0, True))
        return pieces
    for start in range(0, len(view), BLOCK):
        block = view[start : start + BLOCK]
        pieces.append(_block_header(len(block), start + BLOCK >= len(view)))
        pieces.append(block)
    return pieces


def zero_runs(view: memoryview) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of zero bytes of ``view`` that ends where a 512-byte tar
    record ends (records counted from its start: a header's unused tail, a member's
    padding, the end of the archive), merged where a whole record of zeros goes on from
    the run before it, kept when at least :data:`RLE_MIN` long."""
    runs: list[tuple[int, int]] = []
    last_bytes = bytes(view[_RECORD - 1 :: _RECORD][: len(view) // _RECORD])
    k = last_bytes.find(0)
    while k >= 0:
        end = (k + 1) * _RECORD
        start = end - (_RECORD - len(bytes(view[end - _RECORD : end]).rstrip(b"\0")))
        if runs and runs[-1][1] == start == end - _RECORD:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
        k = last_bytes.find(0, k + 1)
    return [run for run in runs if run[1] - run[0] >= RLE_MIN]


def zero_tails(view: memoryview) -> Sequence[int]:
    """The bytes of :func:`zero_runs` in each :data:`BLOCK` of ``view`` (counted in C where
    the extension is built)."""
    if native.AVAILABLE:
        return native.zero_tails(view, BLOCK, RLE_MIN)
    totals = [0] * -(-len(view) // BLOCK)
    for start, end in zero_runs(view):
        while start < end:  # a run over a block's end counts in both
            stop = min((start // BLOCK + 1) * BLOCK, end)
            totals[start // BLOCK] += stop - start
            start = stop
    return totals


def rle_frame(view: memoryview) -> bytes:
    """``view`` as one zstd frame (:data:`RAW_FRAME_HEADER`): its :func:`zero_runs` as RLE
    blocks (block type 1: a 3-byte header and the one byte repeated), the rest as raw
    blocks, each at most :data:`BLOCK`; built in C where the extension is built."""
    if native.AVAILABLE:
        return native.rle_frame(view, RLE_MIN)
    blocks: list[tuple[int, int, int]] = []  # (kind, start, end)
    done = 0
    for start, end in [*zero_runs(view), (len(view), len(view))]:
        for kind, upto in ((_RAW, start), (_RLE, end)):
            while done < upto:
                stop = min(done + BLOCK, upto)
                blocks.append((kind, done, stop))
                done = stop
    if not blocks:
        blocks.append((_RAW, 0, 0))
    pieces = [RAW_FRAME_HEADER]
    for i, (kind, start, end) in enumerate(blocks):
        pieces.append(_block_header(end - start, i == len(blocks) - 1, kind))
        pieces.append(b"\0" if kind == _RLE else bytes(view[start:end]))
    return b"".join(pieces)


def _cut(block: memoryview, pieces: int = _PIECES, piece: int = _PIECE) -> bytes:
    """The sample of ``block``: ``pieces`` pieces of ``piece`` bytes spread evenly, the first
    at its start and the last at its end (the whole block when it is no longer)."""
    if len(block) <= piece * pieces:
        return bytes(block)
    step = (len(block) - piece) // (pieces - 1)
    return b"".join(block[i * step : i * step + piece] for i in range(pieces))


def samples(view: memoryview) -> list[memoryview | bytes]:
    """The sample of each :data:`BLOCK` of ``view`` (cut in C where the extension is built)."""
    if not native.AVAILABLE:
        return [_cut(view[start : start + BLOCK]) for start in range(0, len(view), BLOCK)]
    cut = memoryview(native.block_samples(view, BLOCK, _PIECES, _PIECE))
    most = _PIECES * _PIECE
    return [cut[start : start + most] for start in range(0, len(cut), most)]


class FrameEncoder:
    """Turns buffers of a tar stream into frames (see the module docstring); one per thread."""

    def __init__(self, level: int) -> None:
        self._probe = zstandard.ZstdCompressor(level=1)
        self._compressor = zstandard.ZstdCompressor(level=level, write_checksum=True)
        self.raw_bytes = 0
        self.compressed_bytes = 0

    def compressible(self, sample: memoryview | bytes, size: int, zeros: int) -> bool:
        """Whether a block of ``size`` bytes, ``zeros`` of them in :func:`zero_runs`, is worth
        zstd's time: its ``sample`` shrinks by a tenth of its size more than the zero runs,
        which RLE blocks store at no cost, make up of the block (integers only)."""
        kept = len(self._probe.compress(sample))
        saved = (len(sample) - kept) * size - zeros * len(sample)  # times len(sample) * size
        return 10 * saved >= (10 - _RAW_TENTHS) * len(sample) * size

    def encode(self, data: memoryview | bytes | bytearray) -> list[bytes | memoryview]:
        """The frames of ``data``: consecutive blocks with the same verdict share a frame."""
        view = memoryview(data)
        out: list[bytes | memoryview] = []
        tails = zero_tails(view)
        run_start, run_packed = 0, None
        for index, sample in enumerate(samples(view)):
            start = index * BLOCK
            packed = self.compressible(sample, min(BLOCK, len(view) - start), tails[index])
            if run_packed is not None and packed != run_packed:
                self._emit(view[run_start:start], run_packed, sum(tails[run_start // BLOCK : index]), out)
                run_start = start
            run_packed = packed
        if run_packed is not None:
            self._emit(view[run_start:], run_packed, sum(tails[run_start // BLOCK :]), out)
        return out

    def _emit(self, run: memoryview, packed: bool, zeros: int, out: list[bytes | memoryview]) -> None:
        if packed:
            self.compressed_bytes += len(run)
            out.append(self._compressor.compress(run))
        elif zeros * RLE_SHARE >= len(run):
            self.raw_bytes += len(run)
            out.append(rle_frame(run))
        else:
            self.raw_bytes += len(run)
            out.extend(raw_frame(run))


class FrameWriter:
    """A file-like ``write`` target that encodes what it is given into ``sink`` as frames.

    ``write`` takes whole buffers (the pack pipeline hands over 1 MiB at a time); the
    caller may reuse a buffer once ``write`` returns, or, when it passes ``release``, once
    ``release`` is called: then, with a ``gather`` sink, nothing is copied on the way (see
    the module docstring). :meth:`close` writes what is still being encoded; nothing is
    written after an error.
    """

    def __init__(
        self,
        sink: Callable[[bytes], object],
        *,
        level: int,
        threads: int = 0,
        gather: Callable[[Sequence[bytes | memoryview], Callable[[], object] | None], object] | None = None,
    ) -> None:
        self._sink = sink
        self._gather = gather
        self._level = level
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dsagent-zstd") if threads > 1 else None
        self._most = max(_AHEAD, threads)
        #: lent buffers this writer may hold beyond :data:`_AHEAD` (a lender sizes its pool by it)
        self.extra_held = self._most - _AHEAD if self._pool is not None else 0
        self._pending: deque[tuple[Future[list[bytes | memoryview]], Callable[[], object] | None]] = deque()
        self._encoders: list[FrameEncoder] = []
        self._lock = threading.Lock()

    def _encoder(self) -> FrameEncoder:
        encoder: FrameEncoder | None = getattr(self._local, "encoder", None)
        if encoder is None:
            encoder = self._local.encoder = FrameEncoder(self._level)
            with self._lock:
                self._encoders.append(encoder)
        return encoder

    def _encode(self, data: memoryview | bytes) -> list[bytes | memoryview]:
        return self._encoder().encode(data)

    def _put(self, pieces: list[bytes | memoryview], release: Callable[[], object] | None) -> None:
        if self._gather is not None:
            self._gather(pieces, release)  # views of a lent buffer, written before it is released
            return
        # one copy out of the caller's buffer, one object for the write-behind queue
        self._sink(pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(pieces))
        if release is not None:
            release()

    def write(self, data: memoryview | bytes, release: Callable[[], object] | None = None) -> int:
        """Encode ``data``; with ``release``, ``data`` stays the caller's buffer until it is called."""
        size = len(data)
        if self._pool is None:
            self._put(self._encode(data), release)
            return size
        lent = data if release is not None else bytes(data)
        self._pending.append((self._pool.submit(self._encode, lent), release))
        deep = self.deep
        ahead = self._most if deep else _AHEAD
        while self._pending and (len(self._pending) > ahead or (deep and self._pending[0][0].done())):
            future, done = self._pending.popleft()  # encoded buffers go on at once, in order
            self._put(future.result(), done)
        return size

    @property
    def deep(self) -> bool:
        """Whether this writer keeps a buffer in hand per thread: it has more than
        :data:`_AHEAD` and, of the buffers encoded so far, more bytes went to zstd than were
        stored raw."""
        return self.extra_held > 0 and self.compressed_bytes > self.raw_bytes

    def settle(self, wait: bool = True) -> bool:
        """Hand the oldest buffer still being encoded on to the sink, waiting for it (with
        ``wait``) or only if it is encoded; False when none was. A lender waiting for a
        buffer of its own back calls it, since a lent buffer is otherwise only handed on by
        a later ``write``."""
        if not self._pending or not (wait or self._pending[0][0].done()):
            return False
        future, done = self._pending.popleft()
        self._put(future.result(), done)
        return True

    def close(self) -> None:
        """Write every buffer still being encoded, in order; then stop the pool."""
        try:
            while self._pending:
                future, done = self._pending.popleft()
                self._put(future.result(), done)
        finally:
            self.abort()

    def abort(self) -> None:
        """Stop without writing what is pending (after a failure elsewhere)."""
        for future, _ in self._pending:
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    @property
    def raw_bytes(self) -> int:
        """Tar bytes stored raw so far (a figure for benchmarks and tests)."""
        return sum(e.raw_bytes for e in self._encoders)

    @property
    def compressed_bytes(self) -> int:
        """Tar bytes handed to zstd so far."""
        return sum(e.compressed_bytes for e in self._encoders)


__all__ = [
    "BLOCK", "RAW_FRAME_HEADER", "RAW_RATIO", "RLE_MIN", "FrameEncoder", "FrameWriter", "raw_frame", "rle_frame",
    "samples", "zero_runs", "zero_tails",
]  # fmt: skip
