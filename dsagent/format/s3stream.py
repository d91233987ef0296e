"""A whole S3 object read front to back as one streamed GET: how the agent reads bundles.

Who calls it: :func:`dsagent.format.storage.open_whole`, for every S3 object read whole
(bundles, manifests, per-file copies), after the object's HEAD (its ``info``).

Why not s3fs's file: it is built for random access. It reads a 50 MiB block per range GET
into its read-ahead cache, and every ``read`` of the unpack copies a slice out of that
cache; the blocks arrive through aiohttp in 64-256 KiB pieces that are joined again. Read
straight through from a loopback S3-compatible store, on the 2-CPU build machine, a 944 MB
object cost 0.69-1.28 CPU-s through ``fs.open(...).read(1 MiB)``, against 0.17-0.31 CPU-s
through this module (the same GET's body gathered on the event loop in 1 MiB pieces, the
filesystem's set-up and HEAD included) and 0.08 CPU-s for ``http.client`` reading into one
buffer (measured in one process, the store in another). On a node whose cores also unpack,
that CPU is time to ready. The body is still botocore's: the request is s3fs's
``get_object`` (its credentials, region, requester-pays and additional arguments, the
client's timeouts and retries, the egress rule's checked connector,
:mod:`dsagent.format.egress`), so nothing about who may be reached, or how, is decided
here; only how the answer's bytes are read. A hand-written HTTP client would save the rest
of the CPU but would own TLS trust, proxies and signing: not worth 0.1-0.2 CPU-s a gigabyte.

What it owns:

- **one version**: the GET carries ``IfMatch`` with the ETag the object's ``info`` gave
  (and its ``VersionId`` where the path or the listing names one), so a store answers
  412 (:class:`~dsagent.errors.IntegrityError`, "changed while it was read") rather than
  another version's bytes;
- **resuming**: a body that breaks off (a reset, a read timeout, fewer bytes than its
  ``Content-Length``) is asked again from the first byte not yet read (``Range``, the
  same ``IfMatch``), at most :data:`RESUMES` times per object; the last failure passes
  to the caller as the backend raised it. A resumed read checks at its end, as a read
  in several requests always does, that the object's version did not move;
- **bounds**: each ``read`` waits at most the client's read timeout per socket read
  (botocore's ``read_timeout``, which the edge sets: :mod:`dsagent.format.storageconfig`);
  at most one chunk (:data:`PIECE`) is held per stream beyond what the caller holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from dsagent.errors import SourceUnavailable

#: Bytes one ``read`` gathers from the body at most (the unpack reads 1 MiB at a time).
PIECE = 1 << 20
#: Times one object's body is asked again after it broke off.
RESUMES = 2


class S3Stream:
    """An S3 object's bytes in order, from one GET (plus a resumed one per break)."""

    def __init__(self, fs: Any, path: str, info: dict[str, Any], *, recheck: Callable[[], None]) -> None:
        """``recheck``: asks the object's version again at the end of a read made of several
        requests, raising when it moved (:func:`dsagent.format.storage.check_version`)."""
        from s3fs.core import version_id_kw

        bucket, key, path_version = fs.split_path(path)
        self._fs, self._path = fs, path
        version = path_version or (info.get("VersionId") if getattr(fs, "version_aware", False) else None)
        self._ask: dict[str, Any] = {"Bucket": bucket, "Key": key, **version_id_kw(version), **fs.req_kw}
        etag = info.get("ETag")
        if isinstance(etag, str) and etag and not etag.startswith("W/"):
            self._ask["IfMatch"] = etag
        self._recheck = recheck
        size = info.get("size")
        self.size: int | None = size if isinstance(size, int) and not isinstance(size, bool) else None
        self._at = 0
        self._resumed = 0
        self._ended = False
        self._closed = False
        self._body: Any = None
        self._open()

    # ------------------------------------------------------------------ requests

    def _open(self) -> None:
        ask = dict(self._ask)
        if self._at:
            ask["Range"] = f"bytes={self._at}-"
        answer = self._fs.call_s3("get_object", **ask)
        self._body = answer["Body"]
        if self._at == 0 and self.size is None:
            length = answer.get("ContentLength")
            self.size = length if isinstance(length, int) else None

    async def _gather(self, body: Any, want: int) -> bytes:
        """Up to ``want`` bytes of ``body``, fewer only at its end: one crossing to the event
        loop a read, where aiohttp hands out 64-256 KiB at a time."""
        pieces, got = [], 0
        while got < want:
            piece = await body.read(want - got)
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    # ------------------------------------------------------------------ reading

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left when negative); b"" at the end."""
        from fsspec.asyn import sync

        if self._ended:
            return b""
        if size < 0:
            return b"".join(iter(lambda: self.read(PIECE), b""))
        want = min(size, PIECE) if size else 0
        if want == 0:
            return b""
        while True:
            try:
                data: bytes = sync(self._fs.loop, self._gather, self._body, want)
            except Exception:
                if not self._resume():
                    raise
                continue
            if data or self.size is None or self._at >= self.size:
                break
            if not self._resume():  # the body ended early: the answer said more was coming
                raise SourceUnavailable(
                    f"{self._path!r}: the store's answer ended after {self._at} of {self.size} bytes",
                    hint="the store broke off the read; request the dataset again",
                )
        self._at += len(data)
        if not data:
            self._end()
        return data

    def _resume(self) -> bool:
        """Ask the rest again after a break; False when the resumes are spent."""
        if self._resumed >= RESUMES or self.size is None or self._at >= self.size:
            return False
        self._resumed += 1
        self._close_body()
        self._open()
        return True

    def _end(self) -> None:
        self._ended = True
        self._close_body()
        if self._resumed:  # a read in several requests: its version asked again
            self._recheck()

    # ------------------------------------------------------------------ file protocol

    def _close_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            with contextlib.suppress(Exception):
                body.close()

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._ended = self._closed = True
        self._close_body()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> S3Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["PIECE", "RESUMES", "S3Stream"]
