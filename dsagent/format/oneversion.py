"""Reading one version of a store object whole: which validators may pin a read made of
several requests, and the one-request read where none can (docs/design.md#one-version-per-file).

Who calls it: every whole-object read of a source or a store: the per-file copy
(:mod:`dsagent.cache.fetch`), the digest of a remote source (:mod:`dsagent.format.digester`),
packing (:mod:`dsagent.format.bundles.packwriter`), bundles and manifests
(:mod:`dsagent.format.bundles.extract`, :mod:`dsagent.format.manifest`). It decides how an
HTTP(S) object may be read and leaves the reading to :func:`dsagent.format.storage.open_whole`
(which times each open for the agent's store metrics); every other backend goes there as
it is (S3 ETags and VersionIds, GCS generations and Azure ETags change with every write).

The decision (:func:`identifies_content`): an HTTP(S) validator may pin ranged reads only
when it changes whenever the bytes do: a strong ETag that is not made of the file's
modification time and size. Static web servers make theirs from those (nginx
``"<mtime>-<size>"``, Apache ``"<inode>-<size>-<mtime>"``, in hex): a file rewritten within one
second at the same size keeps its ETag, as it keeps its ``Last-Modified`` (one-second
resolution), so a range GET after the rewrite still "matches" and the copy would be one
version's head and the next one's tail. A weak ETag (``W/"..."``) pins nothing either, and is
never sent in ``If-Match``: that header compares strongly, so a server that honours it
answers 412 to every read pinned to a weak ETag.

Where the validators do not identify the content, the object is read in one GET with no
condition (no ranges: one response is one version as the server read it), then checked at
its end: every byte its size promised arrived, the GET's own validators are those seen
when it was opened, and asked once more (fsspec's listings dropped first) the object still
has them and the same size; else :class:`~dsagent.errors.IntegrityError` ("changed while it
was read"). What that cannot see is a rewrite within one second at the same size that
leaves the validators as they were: the copy is then one of the two versions, whole, never
a mix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import IO, Any

from dsagent.errors import IntegrityError
from dsagent.format.storage import CheckedAtEnd, open_whole, version_of
from dsagent.format.storage_errors import CHANGED_HINT

#: Protocols whose validators are HTTP's: ``ETag`` and ``Last-Modified``.
_HTTP = frozenset({"http", "https"})
_HEX = r"[0-9a-f]+"  # compiled on first use: only HTTP(S) objects are asked


def identifies_content(info: Mapping[str, Any]) -> bool:
    """Whether an HTTP(S) object's ``info`` (fsspec's: its response headers and ``size``)
    carries a validator that changes whenever its bytes do: a strong ETag that is not made
    of the modification time and the size. ``Last-Modified`` alone never does (one-second
    resolution), nor does a weak ETag."""
    etag = info.get("ETag")
    if not isinstance(etag, str) or not etag.strip() or etag.lstrip().upper().startswith("W/"):
        return False
    return not _from_mtime_and_size(etag.strip().strip('"'), info.get("size"))


def _from_mtime_and_size(tag: str, size: Any) -> bool:
    """Whether ``tag`` has the form static servers derive from a file's times and size: two
    or three hex fields (nginx, Apache), one of them the size when the size is known. An
    S3 multipart ETag (``<md5>-<parts>``) has two hex fields too, but neither is the size."""
    fields = tag.lower().split("-")
    if not 2 <= len(fields) <= 3 or not all(re.fullmatch(_HEX, f) for f in fields):
        return False
    if isinstance(size, int) and not isinstance(size, bool):
        return format(size, "x") in fields
    return True  # no size to tell by: read in one request, which is right for either


def open_one_version(fs: Any, path: str, *, size: int | None = None) -> IO[bytes]:
    """``path`` opened for one front-to-back read, every byte of it from one version of the
    object (the module's docstring says how); ``size``: what a listing said it holds.
    Raises what :func:`~dsagent.format.storage.open_whole` raises; a read whose object
    changed raises :class:`~dsagent.errors.IntegrityError` when it reaches its end."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if not protocols & _HTTP:
        return open_whole(fs, path, size=size)
    view = _ContentValidatorsOnly(fs)
    stream = open_whole(view, path, size=size)
    if view.seen is None or identifies_content(view.seen):
        return stream  # pinned to an ETag that names the content (ranges with If-Match, and an end check)
    return _WholeGet(stream, fs, path, view.seen)  # type: ignore[return-value]


class _ContentValidatorsOnly:
    """``fs`` as :func:`open_whole` is given it for an HTTP(S) object: the first ``info`` it
    asks keeps the object's validators only when they identify its content; else they are
    left out, so that it reads the object in one GET with no condition (never ``If-Match``
    with a weak ETag). That first answer, whole, is kept in :attr:`seen` for the end check;
    every other call is ``fs``'s own."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self.seen: dict[str, Any] | None = None

    def info(self, path: str, **kwargs: Any) -> Any:
        info = self._fs.info(path, **kwargs)
        if self.seen is not None:
            return info
        self.seen = dict(info)
        if identifies_content(info):
            return info
        validators = version_of(info)
        return {key: value for key, value in info.items() if key not in validators}

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._fs, attr)


class _WholeGet(CheckedAtEnd):
    """An object read in one GET under validators that do not identify its content: at the
    end of the read, every byte its size promised arrived, and its validators and size are
    those seen when it was opened (the GET's own answer, then the object asked again)."""

    def __init__(self, stream: Any, fs: Any, path: str, seen: Mapping[str, Any]) -> None:
        super().__init__(stream, fs, path)
        self._version = version_of(seen)
        given = seen.get("size")
        self._size = given if isinstance(given, int) and not isinstance(given, bool) else None
        self._read = 0

    def saw(self, data: bytes) -> None:
        self._read += len(data)

    def check(self) -> None:
        if self._size is not None and self._read != self._size:
            raise self._changed(f"{self._size} bytes announced, {self._read} read")
        answered = _answer_validators(self._stream)
        moved = {key: value for key, value in answered.items() if self._version.get(key, value) != value}
        if moved:
            raise self._changed(f"version {self._version} when opened, {answered} in the GET's answer")
        self._fs.invalidate_cache(self._path)
        now = self._fs.info(self._path)
        if version_of(now) != self._version or (self._size is not None and now.get("size") != self._size):
            raise self._changed(f"version {self._version}, {self._size} bytes -> {version_of(now)}, {now.get('size')}")

    def _changed(self, how: str) -> IntegrityError:
        return IntegrityError(f"{self._path!r} changed while it was read ({how})", hint=CHANGED_HINT)


def _answer_validators(stream: Any) -> dict[str, str]:
    """The validators of the response a streamed fsspec HTTP file read (its ``r``), as
    :func:`version_of` names them; empty where the file does not show its response."""
    headers = getattr(getattr(stream, "r", None), "headers", None)
    if headers is None:
        return {}
    try:
        return version_of({key: headers.get(key) for key in ("ETag", "Last-Modified")})
    except Exception:  # a file object of another shape: nothing to compare
        return {}


__all__ = ["identifies_content", "open_one_version"]
