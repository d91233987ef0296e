"""zstd frames as bytes (RFC 8878): where a frame ends, read from its headers, and one
whole frame decoded in calls of a bounded size.

Who calls it: :class:`dsagent.format.framereader.FrameReader`, whose read-ahead cuts a
bundle's run of frames whole and has those holding compressed blocks decoded on threads
of their own (its module docstring says when, and what goes to its one-thread path
instead), and :mod:`dsagent.format.manifest`, which puts back the bytes it peeked at
(:class:`Prefixed`). What it owns: the frame layout as this project reads it, with no
decompression, and the bound on one frame decoded whole (:data:`FRAME_DECODE_MAX`).
Anything else there (a skippable frame, a dictionary, reserved bits, a block type or size
the format does not allow, a frame longer than :data:`FRAME_CUT_MAX`) is not cut: the
caller decodes it, and everything after it, as a plain stream.
"""

from __future__ import annotations

import io
import threading
from collections import deque
from typing import IO, TYPE_CHECKING

from dsagent.format.hashing import CHUNK_SIZE

if TYPE_CHECKING:
    import zstandard

#: zstd's frame magic, and the largest block a frame may hold (RFC 8878, 3.1.1.2)
ZSTD_MAGIC = 0xFD2FB528
_MAGIC_BYTES = ZSTD_MAGIC.to_bytes(4, "little")
ZSTD_BLOCK_MAX = 128 << 10
#: The longest frame cut whole: a longer one (not written by this project's packer, which
#: starts a frame every 1 MiB of tar) is left to the caller's plain stream rather than held whole.
FRAME_CUT_MAX = 4 * CHUNK_SIZE
#: The most a frame decoded whole may yield (a packer's frame holds at most
#: :data:`CHUNK_SIZE`; the rest lets zstd reach the frame's end and check its checksum).
FRAME_DECODE_MAX = 2 * CHUNK_SIZE


class FrameInput:
    """An object's bytes as the reads returned them, held until taken: the frame cutter's
    view of its input (no read is joined to the next)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._chunks: deque[memoryview] = deque()
        self._held = 0  # bytes in ``_chunks``
        self._ended = False

    def left(self) -> int:
        return self._held

    def _fill(self, size: int) -> bool:
        """At least ``size`` bytes held, reading more as needed; False at the object's end."""
        while self._held < size:
            if self._ended:
                return False
            data = self._raw.read(CHUNK_SIZE)
            if not data:
                self._ended = True
                return False
            self._chunks.append(memoryview(data))
            self._held += len(data)
        return True

    def _bytes(self, offset: int, size: int) -> bytes:
        """``size`` held bytes from ``offset`` (held: :meth:`_fill` first)."""
        out = bytearray()
        for chunk in self._chunks:
            if offset >= len(chunk):
                offset -= len(chunk)
                continue
            out += chunk[offset : offset + size - len(out)]
            offset = 0
            if len(out) == size:
                break
        return bytes(out)

    def frame_end(self) -> tuple[int | None, bool]:
        """The length of the zstd frame held next, read from its header and its blocks'
        headers (RFC 8878), and whether any block of it is compressed: None at the object's
        end (nothing left, or a frame cut short), -1 where what comes next is not a plain
        frame of at most :data:`FRAME_CUT_MAX` bytes (a skippable frame, a dictionary,
        reserved bits, a block type or size the format does not allow)."""
        if not self._fill(6):
            return (None if self._bytes(0, self._held) == _MAGIC_BYTES[: self._held] else -1), False
        head = self._bytes(0, 6)
        if head[:4] != _MAGIC_BYTES or head[4] & 0x0B:  # reserved bit, dictionary id
            return -1, False
        descriptor = head[4]
        single = descriptor & 0x20
        pos = 5 + (0 if single else 1) + (1 if single else 0, 2, 4, 8)[descriptor >> 6]
        compressed = False
        while True:
            if pos > FRAME_CUT_MAX:
                return -1, False
            if not self._fill(pos + 3):
                return None, False
            header = int.from_bytes(self._bytes(pos, 3), "little")
            kind, length = (header >> 1) & 3, header >> 3
            if kind == 3 or length > ZSTD_BLOCK_MAX:
                return -1, False
            compressed = compressed or kind == 2
            pos += 3 + (1 if kind == 1 else length)
            if header & 1:
                break
        pos += 4 if descriptor & 0x04 else 0
        if pos > FRAME_CUT_MAX:
            return -1, False
        return (pos, compressed) if self._fill(pos) else (None, False)

    def take(self, size: int) -> list[memoryview]:
        """The next ``size`` held bytes, as views of the reads that hold them."""
        out: list[memoryview] = []
        while size:
            chunk = self._chunks[0]
            if len(chunk) <= size:
                out.append(self._chunks.popleft())
            else:
                out.append(chunk[:size])
                self._chunks[0] = chunk[size:]
            size -= len(out[-1])
            self._held -= len(out[-1])
        return out

    def rest(self) -> list[memoryview]:
        """Every byte held and not taken."""
        out, self._chunks, self._held = list(self._chunks), deque(), 0
        return out


_contexts = threading.local()


def decoder() -> zstandard.ZstdDecompressor:
    """This thread's python-zstandard decompression context, made once and kept: a context
    per frame (``compression.zstd``'s decompressor reads one frame) costs its allocation
    and its window's first-touch page faults each time, a quarter of the CPU of decoding a
    bundle of text written as 170 frames (module docstring of
    :mod:`dsagent.format.framereader`). A context serves one thread at a time."""
    import zstandard  # here: the digest, which reads no zstd, imports this module

    context = getattr(_contexts, "context", None)
    if context is None:
        context = _contexts.context = zstandard.ZstdDecompressor()
    return context


def decode_whole(frame: list[memoryview]) -> bytes | None:
    """One whole frame (its bytes in pieces) decoded to at most :data:`FRAME_DECODE_MAX`
    bytes, or None when it does not end within that, or where its bytes are not exactly one
    frame (cut, or followed by more). libzstd's own walk of its headers (``get_frame_size``,
    the one the one-thread path takes: a frame either path refuses, both do) comes first,
    so zstd, which ends cleanly where its input ends inside a frame, is only handed a
    frame whole; it checks the blocks and the checksum."""
    from dsagent.format.zstdlib import zstd as _zstd  # here: the digest imports this module

    data = frame[0] if len(frame) == 1 else b"".join(frame)
    try:
        if _zstd.get_frame_size(data) != len(data):
            return None
    except _zstd.ZstdError:
        return None
    reader = decoder().stream_reader(data)
    out = reader.read(FRAME_DECODE_MAX)
    if len(out) == FRAME_DECODE_MAX and reader.read(1):
        return None
    return out


class Prefixed(io.RawIOBase):
    """``stream`` with ``head`` read first: bytes taken from it to look at, put back (the
    frame cutter's, a manifest's first read)."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        super().__init__()
        self._head, self._stream = memoryview(head), stream

    def read(self, size: int = -1) -> bytes:
        if self._head:
            take = len(self._head) if size < 0 else size
            head, self._head = self._head[:take], self._head[take:]
            return bytes(head)
        return self._stream.read(size)

    def readable(self) -> bool:
        return True


__all__ = [
    "FRAME_CUT_MAX",
    "FRAME_DECODE_MAX",
    "ZSTD_BLOCK_MAX",
    "ZSTD_MAGIC",
    "FrameInput",
    "Prefixed",
    "decode_whole",
    "decoder",
]
