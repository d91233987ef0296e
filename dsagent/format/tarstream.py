"""Reading a bundle's byte stream: one zstd frame, then tar headers and member data.

Who calls it: :mod:`dsagent.format.extract` only. What it owns: turning the compressed object
into ``(header, data chunks)`` with as few copies as possible, and reporting every
malformation as :class:`IntegrityError`:

- :class:`FrameReader` decompresses exactly one zstd frame and fails when the input ends
  inside it or has bytes after it (zstandard's stream reader ends cleanly inside a cut
  frame, so a bundle cut at its checksum would otherwise pass). Chunks come out as
  memoryviews of the decompressor's output: no copy between zstd and ``os.write``.

**Bounds** (issue 10, finding 5: a 65 KB bundle of 2 GiB of zeros took the agent to
2.1 GB). This module is the one place decompression is bounded, for bundles and
manifests alike: each decompress call yields at most :data:`CHUNK_SIZE` bytes
(``compression.zstd``'s ``max_length``; python-zstandard's ``decompressobj`` has none, and
one 1 MB chunk of zeros decompresses to 32 GB), and a frame yields at most its ``limit``
(:func:`tar_bound` for a bundle: what its manifest declares plus tar headers; anything
after the tar's end other than the writer's zero padding is an :class:`IntegrityError`).
A pax or GNU long-name header is at most :data:`MAX_EXTENDED_HEADER` bytes.
- :func:`iter_members` parses POSIX ustar headers (checksums checked by
  ``tarfile.TarInfo.frombuf``), pax extended headers (``path``, ``size``) and GNU long
  names, and yields each member's header; the caller must then consume exactly
  ``size`` bytes with :func:`read_data` before asking for the next one.

The standard ``tarfile`` streaming reader does the same job with several extra copies
per chunk, which made it the hot spot of unpacking.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable, Iterator
from typing import IO

try:  # Python 3.14+
    from compression import zstd as _zstd
except ImportError:  # pragma: no cover - depends on the Python version
    from backports import zstd as _zstd

from dsagent.errors import IntegrityError, UnsafeArchive
from dsagent.format.hashing import CHUNK_SIZE

BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(BLOCK)

#: Zero bytes a tar writer may add after the end-of-archive block (ours: two records).
MAX_TAIL = 2 * tarfile.RECORDSIZE
#: The largest pax or GNU long-name header accepted (a path is at most a few KB).
MAX_EXTENDED_HEADER = 1 << 20


def tar_bound(members: Iterable[tuple[int, int]]) -> int:
    """The most bytes a tar of ``(size, name bytes)`` members may hold: each member's data
    padded, its header and a pax header carrying its name, then the end blocks."""
    total = MAX_TAIL + 2 * BLOCK
    for size, name_bytes in members:
        total += _padded(size) + 3 * BLOCK + _padded(3 * name_bytes + 256)
    return total


class FrameReader:
    """Decompressed bytes of exactly one zstd frame read from ``raw``."""

    def __init__(self, raw: IO[bytes], what: str, *, limit: int | None = None) -> None:
        self._raw = raw
        self._what = what
        self._limit = limit  # the most decompressed bytes this frame may yield
        self._decompressor = _zstd.ZstdDecompressor()
        self._current = memoryview(b"")
        self._offset = 0
        self._done = False
        self.produced = 0

    def _refill(self) -> bool:
        decompressor = self._decompressor
        while not self._done:
            if decompressor.eof:
                self._done = True
                if decompressor.unused_data or self._raw.read(1):
                    raise IntegrityError(f"{self._what} has data after its end", hint="re-fetch or re-pack it")
                break
            compressed = b""
            if decompressor.needs_input:
                compressed = self._raw.read(CHUNK_SIZE)
                if not compressed:
                    raise IntegrityError(f"{self._what} is truncated", hint="re-fetch or re-pack it")
            try:
                out = decompressor.decompress(compressed, max_length=CHUNK_SIZE)
            except _zstd.ZstdError as exc:
                raise IntegrityError(f"{self._what} is corrupt: {exc}", hint="re-fetch or re-pack it") from exc
            if out:
                self.produced += len(out)
                if self._limit is not None and self.produced > self._limit:
                    raise IntegrityError(
                        f"{self._what} decompresses to more than the {self._limit} bytes its manifest allows",
                        hint="the object is corrupt or hostile; re-pack it",
                    )
                self._current, self._offset = memoryview(out), 0
                return True
        return False

    def read(self, size: int) -> memoryview:
        """Up to ``size`` bytes (fewer at a chunk edge); empty only at the end of the frame."""
        if self._offset >= len(self._current) and not self._refill():
            return memoryview(b"")
        end = min(len(self._current), self._offset + size)
        view = self._current[self._offset : end]
        self._offset = end
        return view

    def read_exact(self, size: int) -> bytes:
        parts = []
        left = size
        while left:
            view = self.read(left)
            if not view:
                raise IntegrityError(f"{self._what} ends in the middle of a tar record", hint="re-fetch or re-pack it")
            parts.append(view)
            left -= len(view)
        return b"".join(parts)

    def skip(self, size: int) -> None:
        while size:
            view = self.read(size)
            if not view:
                raise IntegrityError(f"{self._what} ends in the middle of a tar record", hint="re-fetch or re-pack it")
            size -= len(view)

    def drain(self, max_tail: int = MAX_TAIL) -> None:
        """Read to the end of the frame, where zstd checks the frame's checksum; what is left
        must be zero padding of at most ``max_tail`` bytes (nothing hides after a tar's end)."""
        seen = 0
        while view := self.read(CHUNK_SIZE):
            seen += len(view)
            if seen > max_tail or any(view):
                raise IntegrityError(f"{self._what} has data after the end of its tar", hint="the bundle is corrupt or hostile; re-pack it")


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _pax_records(data: bytes, what: str) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        try:
            length_text, _, _ = data[pos : pos + 24].partition(b" ")
            length = int(length_text)
            record = data[pos + len(length_text) + 1 : pos + length]
            key, _, value = record.rstrip(b"\n").partition(b"=")
        except ValueError as exc:
            raise IntegrityError(f"{what} has a malformed pax header") from exc
        if length <= 0:
            raise IntegrityError(f"{what} has a malformed pax header")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _header(reader: FrameReader, block: bytes, what: str) -> tarfile.TarInfo:
    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as exc:
        raise IntegrityError(f"{what} has a corrupt tar header: {exc}", hint="re-fetch or re-pack it") from exc


def iter_members(reader: FrameReader, what: str) -> Iterator[tarfile.TarInfo]:
    """Each member's header, with pax and GNU long-name overrides applied."""
    overrides: dict[str, str] = {}
    while True:
        block = reader.read_exact(BLOCK)
        if block == _ZERO_BLOCK:
            return
        info = _header(reader, block, what)
        if info.type in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME) and info.size > MAX_EXTENDED_HEADER:
            raise IntegrityError(f"{what} has a {info.size}-byte extended header", hint="the bundle is corrupt or hostile; re-pack it")
        if info.type == tarfile.XHDTYPE:
            overrides.update(_pax_records(reader.read_exact(_padded(info.size)), what))
            continue
        if info.type == tarfile.GNUTYPE_LONGNAME:
            overrides["path"] = reader.read_exact(_padded(info.size)).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        if info.type in (tarfile.XGLTYPE, tarfile.GNUTYPE_LONGLINK):
            raise UnsafeArchive(f"{what} uses a tar feature bundles never contain (type {info.type!r})")
        if "path" in overrides:
            info.name = overrides["path"]
        if "size" in overrides:
            try:
                info.size = int(overrides["size"])
            except ValueError as exc:
                raise IntegrityError(f"{what} has a malformed pax size") from exc
        overrides = {}
        yield info


def read_data(reader: FrameReader, size: int, what: str) -> Iterator[memoryview]:
    """The ``size`` data bytes of the current member in chunks, then its padding skipped."""
    left = size
    while left:
        view = reader.read(min(left, CHUNK_SIZE))
        if not view:
            raise IntegrityError(f"{what} is truncated inside a member", hint="re-fetch or re-pack it")
        left -= len(view)
        yield view
    reader.skip(_padded(size) - size)
