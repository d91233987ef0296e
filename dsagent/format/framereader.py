"""Reading a zstd object: exactly one frame (a manifest's body), or a bundle's run of frames.

Who calls it: :mod:`dsagent.format.bundles.extract` (a bundle, whose tar stream
:mod:`dsagent.format.tarstream` parses from it) and :mod:`dsagent.format.manifest` (a
manifest's body). What it owns: the decompression, bounded, with as few copies as possible,
and every malformation of the compressed object reported as :class:`IntegrityError`.

:class:`FrameReader` decompresses exactly one zstd frame or, with ``frames=True``, a run of
frames (a bundle: :mod:`dsagent.format.bundles.frames` stores incompressible blocks as
frames of raw blocks), and fails when the input ends inside a frame or, in one-frame mode,
has bytes after it (zstandard's stream reader ends cleanly inside a cut frame, so a bundle
cut at its checksum would otherwise pass). A bundle cut between two frames decodes to a
short tar stream, which :func:`dsagent.format.tarstream.iter_members` reports. Chunks come
out as memoryviews of the decompressor's output: no copy between zstd and ``os.write``.

A bundle's frames are decoded by one python-zstandard context kept from frame to frame
(``FrameReader._across_frames``), handed only runs of whole frames as libzstd's own walk
of their headers finds them (:class:`_WholeFrames`, read into one buffer again and
again). ``compression.zstd``'s decompressor reads one frame, and a new one a frame (a
bundle holds a frame every 1 MiB of tar) cost a context, its window and fresh pages each
time: decoding alone (in process, tmpfs) took 178 ms for 12,000 text files against 133
ms now, 159 against 99 ms for 50,000 random files of 4 KB, 388 against 220 ms for
50,000 of 12 KB. What the walk does not take whole goes to the one-frame path.

**Bounds** (a 65 KB bundle of 2 GiB of zeros took the agent to
2.1 GB). This module is the one place decompression is bounded, for bundles and
manifests alike: each decompress call yields at most :data:`CHUNK_SIZE` bytes, a whole
frame on a decoding thread at most :data:`~dsagent.format.zstdframes.FRAME_DECODE_MAX`
(``compression.zstd``'s ``max_length``, python-zstandard's stream reader's ``read(size)``;
its ``decompressobj`` has no bound, and one 1 MB chunk of zeros decompresses to 32 GB, nor
has its one-shot ``decompress`` where a frame's header states a size), and a frame yields at most its ``limit``
(:func:`~dsagent.format.tarstream.tar_bound` for a bundle: what its manifest declares plus
tar headers; anything after the tar's end other than the writer's zero padding is an
:class:`IntegrityError`).

**Read-ahead** (the unpack pipeline): optionally a thread reads and decompresses ahead.
With ``decoders`` (a bundle's run of frames, on a node with cores to spare) that thread
cuts the stream into whole frames by their headers and their blocks' headers (no
decompression) and has each frame holding compressed blocks decoded on one of
``decoders`` threads (frames of raw blocks, which are copies, it decodes itself), handing
the outputs on in order: zstd decodes a frame on one core, and a bundle holds a frame
every 1 MiB of its tar stream. A bundle that starts with a frame of raw blocks
(incompressible data) is decoded by that one thread, as without ``decoders``: on 16 cores
the cutting cost random 12 KB files more than it gained. A frame is decoded in calls of at most
:data:`~dsagent.format.zstdframes.FRAME_DECODE_MAX` bytes in all and must end within them; one that does not (larger,
cut or corrupt), a frame longer than :data:`~dsagent.format.zstdframes.FRAME_CUT_MAX`, anything that is not a plain
zstd frame, and all that follows go through the one-thread path (``FrameReader._across_frames``),
so the errors are its. The frame's ``limit`` is counted in one place on both paths.
"""

from __future__ import annotations

import mmap
import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, cast

from dsagent.errors import IntegrityError
from dsagent.format import zstdframes
from dsagent.format.hashing import CHUNK_SIZE
from dsagent.format.zstdlib import zstd as _zstd

if TYPE_CHECKING:
    from concurrent.futures import Future

#: zstd is handed what is read from an object this much at a time: at the end of a frame
#: it copies the input it did not use (``unused_data``), and a bundle of mixed data is a
#: frame every few blocks, so handing it whole 1 MiB reads copied each read several times
#: (decompressing a 623 MB bundle of 20,000 files cost 1.3-1.4 CPU-s against 0.5 for
#: ``zstd -dc``).
INPUT_PIECE = 64 << 10
#: Frames cut ahead of the one being handed on, per decoder: each yields at most
#: :data:`~dsagent.format.zstdframes.FRAME_DECODE_MAX` bytes, so the decoders hold at most
#: that many times as much.
FRAMES_AHEAD = 2


class FrameReader:
    """Decompressed bytes of exactly one zstd frame read from ``raw`` (with ``frames``: of
    the frames that follow one another until ``raw`` ends).

    With ``ahead`` > 0 a thread reads and decompresses up to that many chunks ahead of the
    caller (zstd releases the GIL, so decompression overlaps the caller's parsing, hashing
    and writing); use it as a context manager so the thread is always ended. Either way
    every decompressed byte is counted against ``limit`` in one place (:meth:`_count`).
    """

    def __init__(
        self,
        raw: IO[bytes],
        what: str,
        *,
        limit: int | None = None,
        ahead: int = 0,
        frames: bool = False,
        decoders: int = 0,
    ) -> None:
        self._raw = raw
        self._frames = frames  # several frames, one after the other (bundles: dsagent.format.bundles.frames)
        self._what = what
        self._limit = limit  # the most decompressed bytes this frame may yield
        self._decompressor = _zstd.ZstdDecompressor()
        self._current = memoryview(b"")
        self._offset = 0
        self.produced = 0
        # frames decoded on threads of their own: only ahead of the caller, across frames
        parallel = frames and ahead > 0 and decoders > 1
        if parallel:
            chunks = self._in_parallel(decoders)
        else:
            chunks = self._across_frames() if frames else _joined(self._decompressed())
        self._chunks: Iterator[bytes] = _ReadAhead(chunks, ahead) if ahead > 0 else chunks

    def __enter__(self) -> FrameReader:  # noqa: PYI034 - typing.Self needs Python 3.11; the project supports 3.10
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the read-ahead thread (if any); the frame is not read any further."""
        if isinstance(self._chunks, _ReadAhead):
            self._chunks.close()

    def _decompressed(self) -> Iterator[bytes]:
        """The frame's decompressed bytes, at most :data:`CHUNK_SIZE` per step and ``limit`` in
        all, checking its end and its checksum: one frame (a manifest), or what the other paths
        leave (module docstring)."""
        decompressor = self._decompressor
        pending = memoryview(b"")  # read from the object, not yet handed to zstd
        carried: bytes | memoryview = b""  # input zstd had not used when its frame ended
        while True:
            if decompressor.eof:
                carried = decompressor.unused_data
                if not carried:
                    if not pending:
                        pending = memoryview(self._raw.read(CHUNK_SIZE if self._frames else 1))
                    carried, pending = pending[:INPUT_PIECE], pending[INPUT_PIECE:]
                if not carried:
                    return
                if not self._frames:
                    raise IntegrityError(f"{self._what} has data after its end", hint="re-fetch or re-pack it")
                decompressor = self._decompressor = _zstd.ZstdDecompressor()
            compressed: bytes | memoryview = b""
            if carried:
                compressed, carried = carried, b""
            elif decompressor.needs_input:
                if not pending:
                    pending = memoryview(self._raw.read(CHUNK_SIZE))
                    if not pending:
                        raise IntegrityError(f"{self._what} is truncated", hint="re-fetch or re-pack it")
                compressed, pending = pending[:INPUT_PIECE], pending[INPUT_PIECE:]
            try:
                out = decompressor.decompress(compressed, max_length=CHUNK_SIZE)
            except _zstd.ZstdError as exc:
                raise self._corrupt(exc) from exc
            if out:
                self._count(len(out))
                yield out

    def _across_frames(self) -> Iterator[bytes]:
        """The run of frames on this one thread, by one python-zstandard context kept from
        frame to frame, read :data:`CHUNK_SIZE` at a time, its input handed whole frames
        only (:class:`_WholeFrames`): zstandard's reader ends cleanly where its input ends
        inside a frame. What is not a whole frame (a cut one, a frame longer than
        :data:`~dsagent.format.zstdframes.FRAME_CUT_MAX`, anything that is not a frame) and
        all that follows go through :meth:`_decompressed`, so the errors are the one-frame
        path's (module docstring: why one context)."""
        import zstandard  # here: manifests, read one frame at a time, need only compression.zstd

        source = _WholeFrames(self._raw)
        # a context of its own (not zstdframes.decoder()): it is held between the chunks it yields
        reader = zstandard.ZstdDecompressor().stream_reader(cast(IO[bytes], source), read_across_frames=True)
        try:
            while out := reader.read(CHUNK_SIZE):
                self._count(len(out))
                yield out
        except zstandard.ZstdError as exc:
            raise self._corrupt(exc) from exc
        if source.rest is None and source.handed:
            return
        self._raw = cast(IO[bytes], zstdframes.Prefixed(source.rest or b"", self._raw))
        yield from _joined(self._decompressed())

    def _in_parallel(self, decoders: int) -> Iterator[bytes]:
        """The run of frames, cut whole by their headers and decoded in order: frames with
        compressed blocks on ``decoders`` threads, frames of raw blocks here (they are
        copies). A run that starts with a frame of raw blocks (incompressible data: the
        threads would only add copies), a frame longer than :data:`~dsagent.format.zstdframes.FRAME_CUT_MAX`, anything
        that is not a plain frame and all that follows go through :meth:`_across_frames`,
        and so does a frame that does not decode whole within :data:`~dsagent.format.zstdframes.FRAME_DECODE_MAX`
        (module docstring)."""
        from concurrent.futures import ThreadPoolExecutor  # here: a bundle read on one thread starts no pool

        import zstandard  # zstdframes.decode_whole's

        pool = ThreadPoolExecutor(decoders, thread_name_prefix="dsagent-unpack-decode")
        ahead: deque[tuple[Future[bytes | None], list[memoryview]]] = deque()
        source = zstdframes.FrameInput(self._raw)
        cut_any = False
        try:
            while True:
                rest = False
                while len(ahead) < decoders * FRAMES_AHEAD:
                    end, compressed = source.frame_end()
                    if end is None or end < 0:  # the end, or not a frame this path cuts
                        rest = end is not None or source.left() > 0 or not cut_any
                        break
                    if not compressed and not cut_any:  # raw data: one thread copies it as fast
                        rest = True
                        break
                    frame = source.take(end)
                    cut_any = True
                    decode = zstdframes.decode_whole
                    future = pool.submit(decode, frame) if compressed else _done(decode(frame))
                    ahead.append((future, frame))
                if not ahead:
                    break
                future, frame = ahead.popleft()
                try:
                    out = future.result()
                except zstandard.ZstdError as exc:
                    raise self._corrupt(exc) from exc
                if out is None:  # not whole within a decode's bound: this frame on, on one thread
                    ahead.appendleft((future, frame))
                    rest = True
                    break
                self._count(len(out))
                yield out
            if rest:
                pieces = [view for _, frame in ahead for view in frame]
                ahead.clear()
                self._raw = cast(IO[bytes], zstdframes.Prefixed(b"".join([*pieces, *source.rest()]), self._raw))
                yield from self._across_frames()
        finally:
            for future, _ in ahead:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def _corrupt(self, exc: Exception) -> IntegrityError:
        """libzstd's reason, without the words each binding puts before it (the paths use
        two bindings)."""
        reason = str(exc).rpartition(": ")[2] or str(exc)
        return IntegrityError(f"{self._what} is corrupt: {reason}", hint="re-fetch or re-pack it")

    def _count(self, size: int) -> None:
        self.produced += size
        if self._limit is not None and self.produced > self._limit:
            raise IntegrityError(
                f"{self._what} decompresses to more than the {self._limit} bytes its manifest allows",
                hint="the object is corrupt or hostile; re-pack it",
            )

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

    def unread(self, data: bytes | memoryview) -> None:
        """Put ``data`` back in front of what is left unread (the native member loop hands
        back a header it leaves to the Python parser, or the bytes after the tar's end)."""
        if not data:
            return
        rest = self._current[self._offset :]
        self._current, self._offset = memoryview(bytes(data) + bytes(rest) if rest else bytes(data)), 0

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

    def drain(self, max_tail: int) -> None:
        """Read to the end of the frame, where zstd checks the frame's checksum; what is left
        must be zero padding of at most ``max_tail`` bytes (nothing hides after a tar's end)."""
        seen = 0
        while view := self.read(CHUNK_SIZE):
            seen += len(view)
            if seen > max_tail or any(view):
                raise IntegrityError(
                    f"{self._what} has data after the end of its tar",
                    hint="the bundle is corrupt or hostile; re-pack it",
                )


class _WholeFrames:
    """A bundle's object handed on in runs of whole frames, from one buffer read into again
    and again: the input of :meth:`FrameReader._across_frames`.

    A run ends where the last frame read whole ends (libzstd's own walk of the frame's
    headers, ``get_frame_size``, in C); the bytes of the frame cut by the buffer's end are
    moved to its front and read on from there. zstandard's reader asks for more only once
    it has decoded all it was handed, so the buffer is free again at every :meth:`read`.
    It ends where the object ends after a frame; where the object ends inside a frame, or
    where what comes next is not a frame that fits the buffer
    (:data:`~dsagent.format.zstdframes.FRAME_CUT_MAX`), the bytes held are left in ``rest``
    (and read no further), for the one-frame path to decode or refuse."""

    def __init__(self, raw: IO[bytes], size: int = zstdframes.FRAME_CUT_MAX) -> None:
        self._raw = raw
        self._readinto = getattr(raw, "readinto", None)
        self._over: bytes | memoryview = b""
        # an anonymous mapping: its pages are touched as reads fill them (a bytearray zeroes
        # all 4 MiB first: 1,000 page faults for a bundle of one file)
        self._view = memoryview(mmap.mmap(-1, size))
        self._start = self._end = 0  # held, not yet handed on: [_start, _end)
        self._ended = False
        self.handed = 0
        self.rest: bytes | None = None

    def _fill(self) -> None:
        view, end = self._view, self._end
        got = None
        if self._readinto is not None:
            try:
                got = self._readinto(view[end:]) or 0
            except NotImplementedError:  # an io.RawIOBase that reads only by read()
                self._readinto = None
        if got is None:
            data = self._over or self._raw.read(len(view) - end)
            got = min(len(data), len(view) - end)
            view[end : end + got] = data[:got]
            self._over = data[got:]  # a stream that gave more than it was asked for
        self._end += got
        self._ended = got == 0

    def read(self, size: int = -1) -> memoryview | bytes:
        """The next run of whole frames (``size`` is not heeded: zstandard takes any run)."""
        if self.rest is not None:
            return b""
        view = self._view
        if self._start:
            held = self._end - self._start
            view[:held] = view[self._start : self._end]
            self._start, self._end = 0, held
        while True:
            pos = 0
            while pos < self._end:
                try:
                    pos += _zstd.get_frame_size(view[pos : self._end])
                except _zstd.ZstdError:
                    break
            if pos:
                self._start = pos
                self.handed += pos
                return view[:pos]
            if self._ended or self._end == len(view):
                if self._end or self._over:
                    self.rest = bytes(view[: self._end]) + bytes(self._over)
                return b""
            self._fill()


def _done(result: bytes | None) -> Future[bytes | None]:
    """A frame decoded here, in the read-ahead's order beside those decoded on threads."""
    from concurrent.futures import Future

    future: Future[bytes | None] = Future()
    future.set_result(result)
    return future


def _joined(outputs: Iterator[bytes]) -> Iterator[bytes]:
    """``outputs`` joined into chunks of at least half :data:`CHUNK_SIZE` (the last may be
    less): zstd, handed :data:`INPUT_PIECE` bytes at a time, yields pieces of about that
    size, and each chunk costs its consumer a queue hand-over and a few Python calls."""
    parts: list[bytes] = []
    size = 0
    for out in outputs:
        parts.append(out)
        size += len(out)
        if size >= CHUNK_SIZE // 2:
            yield parts[0] if len(parts) == 1 else b"".join(parts)
            parts, size = [], 0
    if parts:
        yield parts[0] if len(parts) == 1 else b"".join(parts)


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
        finally:  # a generator stopped early ends here, on its own thread (its threads, its files)
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

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


__all__ = ["FRAMES_AHEAD", "INPUT_PIECE", "FrameReader"]
