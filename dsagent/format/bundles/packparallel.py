"""Encoding one bundle: its tar stream through the frame encoder into the store object,
on several processes when the bundle is large.

Who calls it: :mod:`dsagent.format.bundles.bundle` (:func:`compress_into` gives the ``fill`` that
:func:`dsagent.format.bundles.storeobjects.store_object` writes an object with). What it owns: the
stages after the reader (:class:`~dsagent.format.bundles.packwriter.BundleWriter`): the frame
encoder (:mod:`dsagent.format.bundles.frames`), the write-behind thread, and cutting a large
bundle of a local source into segments packed by forked processes (:class:`_Segment`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from dsagent.errors import SourceUnavailable
from dsagent.format.bundles.frames import FrameWriter
from dsagent.format.bundles.packwriter import BundleWriter, WriteBehind
from dsagent.format.bundles.storeobjects import CountingWriter
from dsagent.format.manifest import CHUNK_SIZE, FileEntry

#: A bundle this large (and with this many files) is packed in segments by forked processes.
SEGMENT_MIN_BYTES = 64 << 20
SEGMENT_MIN_FILES = 512


def _segments(members: Sequence[FileEntry], count: int) -> list[Sequence[FileEntry]]:
    """``members`` cut into ``count`` contiguous runs of about equal bytes."""
    total = sum(e.size for e in members) or 1
    cuts, running, k = [0], 0, 1
    for i, entry in enumerate(members):
        running += entry.size
        if k < count and running * count >= total * k:
            cuts.append(i + 1)
            k += 1
    cuts.append(len(members))
    return [members[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


def _append_file(source: Any, out: CountingWriter) -> None:
    """``source``'s bytes at the end of ``out``: copied by the kernel where ``out`` is a
    local file (no trip through this process), else read and written."""
    size = os.fstat(source.fileno()).st_size
    fileno = getattr(out.raw, "fileno", None)
    if fileno is not None and hasattr(os, "copy_file_range"):
        out.flush()
        target, offset = fileno(), 0
        while offset < size:
            copied = os.copy_file_range(source.fileno(), target, size - offset, offset)
            if copied == 0:
                raise OSError(f"scratch file ended after {offset} of {size} bytes")
            offset += copied
        out.written += size
        out.raw.seek(0, os.SEEK_END)
        return
    source.seek(0)
    while chunk := source.read(CHUNK_SIZE):
        out.write(chunk)


class _Segment:
    """One segment of a bundle packed by a forked process into a scratch file: its frames
    are complete, so the parent appends the file to the bundle as it is."""

    def __init__(
        self, writer: BundleWriter, members: Sequence[FileEntry], level: int, scratch: str | None, last: bool
    ) -> None:
        import multiprocessing
        import tempfile

        self.members = members
        self.file = tempfile.TemporaryFile(dir=scratch)  # noqa: SIM115 - closed by append()
        context = multiprocessing.get_context("fork")
        self._conn, theirs = context.Pipe(duplex=False)
        self._process = context.Process(
            target=self._run, args=(writer, level, last, theirs), name="dsagent-pack-segment", daemon=True
        )
        self._process.start()
        theirs.close()

    def _run(self, writer: BundleWriter, level: int, last: bool, conn: Any) -> None:
        try:
            frames = FrameWriter(self.file.write, level=level)
            digests = writer.write(self.members, frames, end=last)
            frames.close()
            self.file.flush()
            conn.send(("ok", digests))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
            conn.send(("error", exc))

    def append(self, out: Any) -> bytes:
        """Wait for the segment, write its frames into ``out``; its members' digests."""
        try:
            try:
                kind, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise SourceUnavailable(
                    "a packing process died", hint="see the system log (out of memory?) and retry"
                ) from exc
            if kind == "error":
                raise value
            _append_file(self.file, out)
            return bytes(value)
        finally:
            self.close()

    def close(self) -> None:
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._conn.close()
        self.file.close()


def compress_into(
    members: Sequence[FileEntry],
    writer: BundleWriter,
    level: int,
    threads: int,
    *,
    processes: int = 1,
    scratch: str | None = None,
) -> Any:
    """``fill(raw)``: the bundle of ``members`` encoded as zstd frames into ``raw``
    (:class:`~dsagent.format.bundles.frames.FrameWriter`: raw where compressing would not pay);
    returns their digests (16 raw bytes each). ``threads`` > 1 encodes buffers on that many
    threads.

    With ``processes`` > 1, a large bundle of a local source is cut into that many runs
    of members: this process packs the first while forked processes pack the others into
    scratch files (in ``scratch``, best on the store's filesystem), appended in order
    once it is done. Frames are independent, so the bundle is the same tar stream; the
    per-file work, which holds the GIL, then uses every core. Progress of a segment is
    counted when it is appended."""

    def fill(raw: CountingWriter) -> bytes:
        segments: list[_Segment] = []
        head: Sequence[FileEntry] = members
        if processes > 1 and writer.local and len(members) >= SEGMENT_MIN_FILES:
            if sum(e.size for e in members) >= SEGMENT_MIN_BYTES:
                runs = _segments(members, processes)
                head = runs[0]
                try:  # forked before this process starts any thread of its own
                    segments = [
                        _Segment(writer.quiet(), run, level, scratch, i == len(runs) - 1)
                        for i, run in enumerate(runs) if i > 0
                    ]  # fmt: skip
                except BaseException:
                    for segment in segments:
                        segment.close()
                    raise
        behind = WriteBehind(raw)
        frames = FrameWriter(behind.write, level=level, threads=threads if not segments else 0, gather=behind.gather)
        try:
            digests = writer.write(head, frames, end=not segments)
            frames.close()
            behind.close()  # the head is written: segments are appended straight to raw
            for segment in segments:
                digests += segment.append(raw)
                writer.count(segment.members)
        except BaseException:
            frames.abort()
            behind.close_quietly()
            for segment in segments:
                segment.close()
            raise
        return digests

    return fill
