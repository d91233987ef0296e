"""One bundle read from the store as byte ranges over several links at once (docs/design.md#links).

Who calls it: :func:`dsagent.cache.fetch.fetch_bundles`, for a bundle of an ``http(s)://``
or ``s3://`` store when its version has fewer bundles than the node has links
(:func:`range_plan`), and :mod:`dsagent.cache.versions`, which reserves the disk the
ranges may take (:func:`spool_bound`). Bundles from peers stay one stream each: a peer
serves whole bundles from its cache and keys its upload limits on the fetching address.

What it owns:

- **the plan**: ``k = min(links // bundles, compressed size // DSAGENT_FETCH_RANGE_MIN)``
  equal ranges, one link each, when ``k >= 2``; else the bundle is one stream as before.
  The minimum (64 MiB by default) keeps each range long enough that its request, its
  connection's slow start and the hand-over to the next range are a small part of it (at
  1 GB/s a 64 MiB range takes 64 ms, against about 1 ms of round trips), and leaves
  small bundles alone: a dataset of one 800 MB bundle goes over 3 links as 3 ranges of
  267 MB, one of 100 MB stays one stream.
- **the reads**: each range is one GET with a ``Range`` header (S3: ``get_object`` with
  ``Range``) through the store's own filesystem bound to the range's link
  (:func:`~dsagent.cache.fetchlinks.bound_options`), so the store's timeouts, proxies and
  egress rule apply as to any read. The ranges after the first ask with ``If-Match`` (S3:
  ``IfMatch``) the ETag the first was answered with, when it is a strong one. The first
  range is asked before any other: a store that answers it with the whole object (a
  server without ``Range``), with no range or with another size is read in one stream as
  before (:class:`RangesUnsupported`), having cost one request.
- **the order**: the unpack (:func:`~dsagent.format.bundles.extract.unpack_bundle_stream`,
  every file verified by digest as always) reads the ranges in order from one stream
  (:class:`RangedStream`): the first range straight from its response, the later ones
  from spool files their links fill meanwhile, each read as soon as the unpack reaches it
  (waiting for bytes not yet arrived) and closed, its disk freed, once read.
- **failures**: a range whose read fails over its link (a reset, a stall, a truncated
  body) is asked again from where it stopped, once, over another link; when that one
  delivers the range, the first link is set aside as :meth:`~dsagent.cache.fetchlinks.Lease.attempt`
  does; when it fails too, the ranged read fails, and the caller reads the bundle in one
  stream (itself tried over two links) before the fetch fails. What each link carried is
  counted when the bundle verified: ``link_range_bytes_total`` and ``link_ranges_total``,
  and its share of the bundle's unpacked bytes in ``link_bytes_total``.

**Spooled to disk, not to memory.** The later ranges arrive while the first is being
unpacked; to keep arriving at their links' speed they need room for the whole range, so
a window in memory would either be as large as the ranges (hundreds of MB a bundle, per
fetch) or stall each link once full until the unpack reaches its range, which takes the
parallelism away. The spools are anonymous files (``O_TMPFILE`` where the filesystem has
it) in the version's staging directory: on the cache disk, whose space the version
reserved with them (:func:`spool_bound`, at most the bundle's compressed size minus its
first range), never visible under a name, gone with their descriptor on any failure or a
crash. What is held in memory is one chunk per range in flight (:data:`CHUNK`) and the
HTTP client's own read buffer.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar, cast

from dsagent.cache.fetchlinks import LINK_ERRORS, NOT_LINK_ERRORS, LinkSet, bound_options
from dsagent.errors import SourceUnavailable, local_write_error
from dsagent.format.bundles.extract import STAGING_DIR, unpack_bundle_stream
from dsagent.format.manifest import BundleRef, Manifest, Progress, bundle_path
from dsagent.format.storage import resolve, translate_errors
from dsagent.format.storageconfig import Options

log = logging.getLogger("dsagent.fetchranges")
_T = TypeVar("_T")

#: Bytes read from a range's response (and written to its spool) at a time.
CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class RangesUnsupported(SourceUnavailable):
    """The store answered a range request with something other than that range (a server
    without ``Range`` sends the whole object): the bundle is read in one stream instead."""


def range_plan(size: int, bundles: int, links: int, minimum: int) -> tuple[tuple[int, int], ...]:
    """The ``(start, stop)`` byte ranges a bundle of ``size`` compressed bytes is read as,
    in a version of ``bundles`` bundles over ``links`` links: ``links // bundles`` ranges
    (at most ``size // minimum``), of equal length; () when that is fewer than two."""
    if bundles < 1 or minimum < 1 or links <= bundles:
        return ()
    count = min(links // bundles, size // minimum)
    if count < 2:
        return ()
    step = -(-size // count)
    return tuple((start, min(start + step, size)) for start in range(0, size, step))


def spool_bound(manifest: Manifest, links: int, minimum: int) -> int:
    """The most disk the spooled ranges of ``manifest``'s bundles may take at once: every
    range after the first of every bundle split (the bundles are fetched at the same time)."""
    total = 0
    for bundle in manifest.bundles:
        plan = range_plan(bundle.compressed_size, len(manifest.bundles), links, minimum)
        if plan:
            total += bundle.compressed_size - plan[0][1]
    return total


# --------------------------------------------------------------------------- one response


class _Body(Protocol):
    """One range's response body."""

    etag: str | None
    total: int | None

    def read(self, size: int) -> bytes: ...

    def close(self, whole: bool) -> None: ...

    def abort(self) -> None: ...


def _check_range(header: str | None, start: int, stop: int, what: str) -> int | None:
    """The object's size a ``Content-Range`` answer gives, which must be ``start``-``stop``;
    else :class:`RangesUnsupported`."""
    match = _CONTENT_RANGE.fullmatch((header or "").strip())
    if match is None or int(match.group(1)) != start or int(match.group(2)) != stop - 1:
        raise RangesUnsupported(f"{what}: asked bytes {start}-{stop - 1}, answered {header or 'no range'}")
    return None if match.group(3) == "*" else int(match.group(3))


class _HttpBody:
    """A range GET through fsspec's HTTP filesystem: its aiohttp session (bound to the
    link, :func:`bound_options`) and request options (headers, proxy)."""

    def __init__(self, fs: Any, url: str, start: int, stop: int, etag: str | None) -> None:
        from fsspec.asyn import sync

        self._fs, self._sync = fs, sync
        kwargs = dict(getattr(fs, "kwargs", None) or {})
        headers = dict(kwargs.pop("headers", None) or {})
        headers["Range"] = f"bytes={start}-{stop - 1}"
        if etag:
            headers["If-Match"] = etag

        async def get() -> Any:
            session = await fs.set_session()
            response = await session.get(fs.encode_url(url), headers=headers, **kwargs)
            if response.status != 206:
                response.close()
                if response.status == 200:
                    raise RangesUnsupported(f"{url}: the server answered a range request with the whole object")
                fs._raise_not_found_for_status(response, url)
                response.raise_for_status()
                raise RangesUnsupported(f"{url}: answered {response.status} to a range request")
            return response

        self._response = sync(fs.loop, get)
        headers_in = self._response.headers
        try:
            self.total = _check_range(headers_in.get("Content-Range"), start, stop, url)
        except RangesUnsupported:
            self.abort()
            raise
        tag = headers_in.get("ETag")
        self.etag = tag if tag and not tag.upper().startswith("W/") else None

    def read(self, size: int) -> bytes:
        data: bytes = self._sync(self._fs.loop, self._response.content.read, size)
        return data

    def close(self, whole: bool) -> None:
        response = self._response

        async def close() -> None:
            response.release() if whole else response.close()  # a whole answer's connection is reused

        self._sync(self._fs.loop, close)

    def abort(self) -> None:
        self._fs.loop.call_soon_threadsafe(self._response.close)


class _S3Body:
    """A range ``get_object`` through s3fs's client (its connector bound to the link)."""

    def __init__(self, fs: Any, path: str, start: int, stop: int, etag: str | None) -> None:
        from fsspec.asyn import sync

        self._fs, self._sync = fs, sync
        bucket, key, version = fs.split_path(path)
        ask: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{stop - 1}"}
        if version:
            ask["VersionId"] = version
        if etag:
            ask["IfMatch"] = etag
        answer = sync(fs.loop, fs._call_s3, "get_object", **ask)
        self._body = answer["Body"]
        try:
            self.total = _check_range(answer.get("ContentRange"), start, stop, path)
        except RangesUnsupported:
            self.abort()
            raise
        tag = answer.get("ETag")
        self.etag = tag if tag and not str(tag).upper().startswith("W/") else None

    def read(self, size: int) -> bytes:
        data: bytes = self._sync(self._fs.loop, self._body.read, size)
        return data

    def close(self, whole: bool) -> None:
        self._fs.loop.call_soon_threadsafe(self._body.close)

    def abort(self) -> None:
        self._fs.loop.call_soon_threadsafe(self._body.close)


# --------------------------------------------------------------------------- one range


@dataclass
class _Job:
    """One bundle's ranged read: where it is, over which links, pinned to which ETag."""

    store: str
    options: Options
    bundle: BundleRef
    links: LinkSet
    etag: str | None = None
    _opened: dict[str, tuple[Any, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def what(self) -> str:
        return f"bundle {self.bundle.digest} in {self.store!r}"

    def open(self, address: str, start: int, stop: int) -> _Body:
        with self._lock:
            if address not in self._opened:
                fs, root = resolve(self.store, bound_options(self.store, self.options, address, self.links.netns))
                self._opened[address] = (fs, bundle_path(root, self.bundle.digest))
            fs, path = self._opened[address]
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        if protocols & {"http", "https"}:
            return _HttpBody(fs, path, start, stop, self.etag)
        return _S3Body(fs, path, start, stop, self.etag)


class _Range:
    """Bytes ``start``-``stop`` of the bundle, read front to back over a link (``held``: a
    lease this range took, given back when it ends); after a network or stream error asked
    again from where it stopped, once, over another link (the first link is set aside when
    that one delivers the rest)."""

    def __init__(self, job: _Job, start: int, stop: int, address: str, *, held: bool) -> None:
        self.job, self.start, self.stop, self.pos = job, start, stop, start
        self.address = address
        self._held = address if held else None
        self.carried: collections.Counter[str] = collections.Counter()  # bytes by link
        self.finished_over: str | None = None
        self._body: _Body | None = None
        self._failed: tuple[str, BaseException] | None = None
        self._closed = False
        self._lock = threading.Lock()  # the lease held: given back once, whichever thread closes

    def open(self) -> _Body:
        """The range's response (asked now when not yet): what :meth:`read` reads."""
        self._attempt(lambda: None)
        assert self._body is not None
        return self._body

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes; b"" once the range is whole."""
        if self.pos >= self.stop:
            return b""

        def one() -> bytes:
            assert self._body is not None
            data = self._body.read(min(size, self.stop - self.pos))
            if not data:
                ended = f"the answer ended at byte {self.pos} of {self.start}-{self.stop - 1}"
                raise SourceUnavailable(f"{self.job.what}: {ended}")
            return data

        data = self._attempt(one)
        self.pos += len(data)
        self.carried[self.address] += len(data)
        if self.pos >= self.stop:
            self._finish()
        return data

    def _attempt(self, call: Callable[[], _T]) -> _T:
        while True:
            try:
                with translate_errors(f"{self.job.what} (bytes {self.pos}-{self.stop - 1} over {self.address})"):
                    if self._body is None:
                        self._body = self.job.open(self.address, self.pos, self.stop)
                    return call()
            except RangesUnsupported:  # the store's answer, the same over every link
                raise
            except NOT_LINK_ERRORS:
                raise
            except LINK_ERRORS as exc:
                self._drop()
                if self._closed or self._failed is not None:
                    raise  # stopped, or failed over two links: the source is at fault
                other = self.job.links._take(exclude=(self.address,))
                if other is None:
                    raise  # no other link left
                log.info("%s: bytes %d-%d failed over %s (%s); asking again over %s", self.job.what,
                         self.pos, self.stop - 1, self.address, exc, other)  # fmt: skip
                self._failed = (self.address, exc)
                self._give()
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self.address, self._held = other, other
                if closed:
                    self.job.links._give(other)
                    raise

    def _finish(self) -> None:
        if self._body is not None:
            self._body.close(True)
            self._body = None
        self.finished_over = self.address
        if self._failed is not None:
            self.job.links._set_aside(*self._failed)
        self._give()

    def _drop(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                body.abort()
            except Exception:  # noqa: BLE001 - a connection already gone
                pass

    def _give(self) -> None:
        with self._lock:
            held, self._held = self._held, None
        if held is not None:
            self.job.links._give(held)

    def close(self) -> None:
        """Stop reading (any thread): the response is dropped and the lease given back."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._drop()
        self._give()


class _Spool:
    """A later range filled by a thread of its own into an anonymous file in ``directory``,
    read by the unpack as soon as it gets there (waiting for bytes not yet arrived)."""

    def __init__(self, part: _Range, directory: Path) -> None:
        self.part = part
        self.length = part.stop - part.start
        self.written = self._read = 0
        self.error: BaseException | None = None
        self._stopping = self._done = False
        self._cond = threading.Condition()
        self._file = _anonymous_file(directory)
        self._thread = threading.Thread(target=self._fill, name=f"dsagent-range-{part.start}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _fill(self) -> None:
        try:
            fd = self._file.fileno()
            while self.written < self.length and not self._stopping:
                data = memoryview(self.part.read(CHUNK))
                offset = self.written
                try:
                    while data:
                        done = os.pwrite(fd, data, offset)
                        data, offset = data[done:], offset + done
                except OSError as exc:
                    raise local_write_error(exc, f"spooling {self.part.job.what}") from exc
                with self._cond:
                    self.written = offset
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the reader, raised there
            with self._cond:
                self.error = exc
                self._cond.notify_all()
        finally:
            self.part.close()
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def read(self, size: int) -> bytes:
        with self._cond:
            while self._read >= self.written and self.error is None and not self._done:
                self._cond.wait()
            if self._read >= self.written:
                if self.error is not None:
                    raise self.error
                return b""
            count = min(size, self.written - self._read)
        data = os.pread(self._file.fileno(), count, self._read)
        self._read += len(data)
        return data

    def close(self) -> None:
        with self._cond:
            self._stopping = True
        self.part.close()
        self._thread.join(timeout=30)
        self._file.close()


def _anonymous_file(directory: Path) -> IO[bytes]:
    """A file with no name under ``directory``'s private staging area (``O_TMPFILE``, else
    created and unlinked at once), which a peer's finished delivery may remove meanwhile."""
    place = directory / STAGING_DIR
    for _ in range(100):
        try:
            place.mkdir(exist_ok=True)
            return tempfile.TemporaryFile(dir=place, prefix="range-")
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise local_write_error(exc, f"spooling a byte range into {place}") from exc
    raise local_write_error(OSError(f"{place} keeps disappearing"), "spooling a byte range")


class RangedStream:
    """The bundle's bytes in order, as the unpack reads them: the first range from its
    response, then each spool. ``peak_spooled``: the most bytes its spools held at once."""

    def __init__(self, first: _Range, spools: Sequence[_Spool]) -> None:
        self._first, self._spools = first, list(spools)
        self._index = 0  # 0: the first range; i: spool i - 1
        self.peak_spooled = 0
        self._lock = threading.Lock()

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        while self._index <= len(self._spools):
            self._note_peak()
            for spool in self._spools[self._index :]:
                if spool.error is not None:
                    raise spool.error  # a later range failed: no need to unpack up to it first
            data = self._first.read(size) if self._index == 0 else self._spools[self._index - 1].read(size)
            if data:
                return data
            if self._index > 0:
                self._spools[self._index - 1].close()  # read whole: its disk is free again
            self._index += 1
        return b""

    def _note_peak(self) -> None:
        held = sum(s.written for s in self._spools[max(0, self._index - 1) :])
        if held > self.peak_spooled:
            self.peak_spooled = held

    def close(self) -> None:
        self._first.close()
        for spool in self._spools:
            spool.close()

    def __enter__(self) -> RangedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Ranged:
    """What a ranged read did: the compressed bytes each link carried, the links each
    range finished over, and the most disk its spools held at once."""

    carried: dict[str, int]
    finished: tuple[str, ...]
    peak_spooled: int


def unpack_ranged(
    store: str,
    storage_options: Options,
    manifest: Manifest,
    bundle: BundleRef,
    staging: Path,
    plan: Sequence[tuple[int, int]],
    links: LinkSet,
    address: str,
    *,
    progress: Progress | None = None,
    writers: int = 1,
) -> Ranged:
    """Unpack ``bundle`` (in place, every file verified) into ``staging``, reading it as
    the byte ranges ``plan`` over ``links``: the first over ``address`` (the bundle's own
    lease), each other over a link of its own. Raises :class:`RangesUnsupported` before
    anything is unpacked when the store does not answer ranges; what the unpack raises
    otherwise (a range failed over two links, a digest mismatch, a full disk). ``writers``:
    the threads writing its files (:func:`~dsagent.format.bundles.extract.member_writers`)."""
    job = _Job(store, storage_options, bundle, links)
    first = _Range(job, *plan[0], address, held=False)
    parts: list[_Range] = [first]
    spools: list[_Spool] = []
    try:
        body = first.open()
        if body.total is not None and body.total != bundle.compressed_size:
            raise RangesUnsupported(f"{job.what}: {body.total} bytes in the store, {bundle.compressed_size} listed")
        job.etag = body.etag
        taken = {address}
        for start, stop in plan[1:]:
            other = links._take(exclude=taken) or links._take()
            if other is None:
                raise RangesUnsupported(f"{job.what}: no link left for bytes {start}-{stop - 1}")
            taken.add(other)
            part = _Range(job, start, stop, other, held=True)
            parts.append(part)
            spools.append(_Spool(part, staging))
        for spool in spools:
            spool.start()
        with RangedStream(first, spools) as stream:
            unpack_bundle_stream(
                cast(IO[bytes], stream), manifest, bundle, staging, progress=progress, in_place=True, writers=writers
            )
            peak = stream.peak_spooled
    finally:
        for part in parts:
            part.close()
        for spool in spools:
            spool.close()
    carried: collections.Counter[str] = collections.Counter()
    for part in parts:
        carried.update(part.carried)
    _count(links, bundle, carried, [p.finished_over for p in parts if p.finished_over is not None])
    return Ranged(dict(carried), tuple(p.finished_over or "" for p in parts), peak)


def _count(links: LinkSet, bundle: BundleRef, carried: collections.Counter[str], finished: list[str]) -> None:
    """What each link carried of a verified bundle: its compressed bytes and the ranges
    it finished, and its share of the bundle's unpacked bytes (the shares add up to the
    bundle's size; the link that finished the first range counts the bundle)."""
    total = sum(carried.values()) or 1
    shares = {a: bundle.size * n // total for a, n in carried.items()}
    if shares:
        largest = max(shares, key=lambda a: carried[a])
        shares[largest] += bundle.size - sum(shares.values())
    ranges = collections.Counter(finished)
    for address in carried.keys() | ranges.keys():
        links._ranged(address, carried.get(address, 0), ranges=ranges.get(address, 0))
    for address, share in shares.items():
        links._delivered(address, "store", share, bundles=int(bool(finished) and address == finished[0]))


__all__ = ["CHUNK", "Ranged", "RangedStream", "RangesUnsupported", "range_plan", "spool_bound", "unpack_ranged"]
