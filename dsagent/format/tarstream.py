"""Reading a bundle's byte stream: one zstd frame, then tar headers and member data.

Who calls it: :mod:`dsagent.format.extract` only. What it owns: turning the compressed object
into ``(header, data chunks)`` with as few copies as possible, and reporting every
malformation as :class:`IntegrityError`:

- :class:`FrameReader` decompresses exactly one zstd frame and fails when the input ends
  inside it or has bytes after it (zstandard's stream reader ends cleanly inside a cut
  frame, so a bundle cut at its checksum would otherwise pass). Chunks come out as
  memoryviews of the decompressor's output: no copy between zstd and ``os.write``.
  Optionally a thread reads and decompresses ahead (the unpack pipeline); every
  decompressed byte still comes from ``FrameReader._decompressed``.
- :func:`iter_members` parses POSIX ustar headers (checksums checked by
  ``tarfile.TarInfo.frombuf``), pax extended headers (``path``, ``size``) and GNU long
  names, and yields each member's header; the caller must then consume exactly
  ``size`` bytes with :func:`read_data` before asking for the next one.

The standard ``tarfile`` streaming reader does the same job with several extra copies
per chunk, which made it the hot spot of unpacking.
"""

from __future__ import annotations

import queue
import tarfile
import threading
from collections.abc import Iterator
from typing import IO

import zstandard

from dsagent.errors import IntegrityError, UnsafeArchive
from dsagent.format.hashing import CHUNK_SIZE

BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(BLOCK)


class FrameReader:
    """Decompressed bytes of exactly one zstd frame read from ``raw``.

    With ``ahead`` > 0 a thread reads and decompresses up to that many chunks ahead of the
    caller (zstd releases the GIL, so decompression overlaps the caller's parsing, hashing
    and writing); use it as a context manager so the thread is always ended. Either way
    every decompressed byte comes from :meth:`_decompressed`, the one place to bound them.
    """

    def __init__(self, raw: IO[bytes], what: str, *, ahead: int = 0) -> None:
        self._raw = raw
        self._what = what
        self._decompressor = zstandard.ZstdDecompressor().decompressobj()
        self._current = memoryview(b"")
        self._offset = 0
        self._chunks: Iterator[bytes] = _ReadAhead(self._decompressed(), ahead) if ahead > 0 else self._decompressed()

    def __enter__(self) -> FrameReader:  # noqa: PYI034 - typing.Self needs Python 3.11; the project supports 3.10
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the read-ahead thread (if any); the frame is not read any further."""
        if isinstance(self._chunks, _ReadAhead):
            self._chunks.close()

    def _decompressed(self) -> Iterator[bytes]:
        """The frame's decompressed bytes, chunk by chunk, checking its end and its checksum."""
        while True:
            compressed = self._raw.read(CHUNK_SIZE)
            if not compressed:
                if not self._decompressor.eof:
                    raise IntegrityError(f"{self._what} is truncated", hint="re-fetch or re-pack it")
                return
            try:
                out = self._decompressor.decompress(compressed)
            except zstandard.ZstdError as exc:
                raise IntegrityError(f"{self._what} is corrupt: {exc}", hint="re-fetch or re-pack it") from exc
            if self._decompressor.eof and (self._decompressor.unused_data or self._raw.read(1)):
                raise IntegrityError(f"{self._what} has data after its end", hint="re-fetch or re-pack it")
            if out:
                yield out

    def _refill(self) -> bool:
        out = next(self._chunks, None)
        if out is None:
            return False
        self._current, self._offset = memoryview(out), 0
        return True

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

    def drain(self) -> None:
        """Read to the end of the frame, where zstd checks the frame's checksum."""
        while self.read(CHUNK_SIZE):
            pass


class _ReadAhead:
    """Runs an iterator on its own thread, at most ``depth`` items ahead of its consumer.

    Items and the iterator's exception arrive in order; :meth:`close` stops the thread
    (it finishes the item it is producing) and waits for it.
    """

    _END = object()

    def __init__(self, source: Iterator[bytes], depth: int) -> None:
        self._source = source
        self._items: queue.Queue[object] = queue.Queue(depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="dsagent-unpack-read", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._source:
                if self._stop.is_set():
                    return
                self._items.put(item)
            self._items.put(self._END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self._items.put(exc)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._done:
            raise StopIteration
        item = self._items.get()
        if item is self._END or isinstance(item, BaseException):
            self._done = True
            self._thread.join()
            if item is self._END:
                raise StopIteration
            raise item  # type: ignore[misc]
        return item  # type: ignore[return-value]

    def close(self) -> None:
        self._stop.set()
        self._done = True
        while self._thread.is_alive():  # make room for an item being put
            try:
                self._items.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()


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
