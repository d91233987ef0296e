"""The thin adapter between dsagent and fsspec: every dataset source and bundle store.

Who calls it: manifest building, bundle packing and unpacking, and the agent's fetches.
What it owns: turning a URL or local path into an ``(AbstractFileSystem, path)`` pair, and
translating what the filesystems raise into dsagent's error tree where it enters. Which
foreign error means what (unreachable, credentials, permission, not found) lives in
:mod:`dsagent.format.storage_errors`; the URL form check in :mod:`dsagent.format.sources`;
the object stores' time bounds, which the edges pass down inside the storage options, in
:mod:`dsagent.format.storageconfig`. What
the *agent* may open is decided before
this module is reached, from the URL's text: :mod:`dsagent.format.sources`.

It also tells observers of every object it opens for a whole read (:func:`open_whole`: each
manifest, bundle and per-file copy): the protocol, the seconds the open took (the request
up to its first byte or metadata) and the error code it failed with. This layer imports no
metrics library; the agent registers its metrics with :func:`add_store_observer`
(docs/design.md#metrics). Observers are process-wide: one agent runs per process.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from dsagent.errors import (
    DsagentError,
    IntegrityError,
    InvalidInput,
    StorageCredentials,
    StorageForbidden,
    is_full_disk,
    local_write_error,
)
from dsagent.format import storage_errors
from dsagent.format.storageconfig import Options, store_options

if TYPE_CHECKING:
    from fsspec.spec import AbstractFileSystem


def resolve(url: str | os.PathLike[str], storage_options: Options = None) -> tuple[AbstractFileSystem, str]:
    """The filesystem and the path inside it for ``url`` (a local path or any fsspec URL)."""
    import fsspec
    from fsspec.core import url_to_fs

    from dsagent.format.sources import ALIASES, check_option_values, check_url, is_chain  # here: see protocol_label

    text = os.fspath(url)
    if not text or "\x00" in text:
        raise InvalidInput(f"invalid dataset location {text!r}", hint="give a local path or an fsspec URL")
    check_url(text)
    protocol = text.split("://", 1)[0].lower() if "://" in text else "file"
    local = ALIASES.get(protocol, protocol) == "file"
    given = store_options(storage_options)
    values = check_option_values(dict(given.values))
    if local and values:
        key = sorted(values)[0]  # fsspec's local filesystem takes any keyword and ignores it
        raise InvalidInput(
            f"storage option {key!r} does nothing for the local path {text!r}",
            hint="storage options are for object stores and HTTP URLs; a local path takes none",
        )
    # the bounds the edge decided travel beside the options (dsagent.format.storageconfig)
    options = values if local else given.resolved_config().bounded(protocol, values)
    if given.egress is not None and not local:  # a request's store: every connection checked where it is made
        options = given.egress.bounded(protocol, options)
    try:
        with translate_errors(f"cannot open {text!r}"):  # some filesystems open files or connect here
            if is_chain(text):
                fs, path = url_to_fs(text, **options)  # dsctl only: the agent refuses chains
            else:
                fs, path = _single(text, options)
    except (ValueError, ImportError, TypeError) as exc:
        protocol = text.split("://", 1)[0] if "://" in text else "file"
        known = protocol in fsspec.available_protocols()
        extra = {
            "s3": "s3",
            "s3a": "s3",
            "gs": "gcs",
            "gcs": "gcs",
            "az": "azure",
            "abfs": "azure",
            "abfss": "azure",
            "http": "http",
            "https": "http",
        }.get(protocol, "all")
        if not known:
            hint = f"'{protocol}://' is not a known fsspec protocol"
        elif isinstance(exc, ImportError):
            hint = f"install the backend for '{protocol}://': pip install \"dsplatform[{extra}]\""
        else:
            hint = "check the URL and the storage options"
        raise InvalidInput(f"cannot open {text!r}: {exc}", hint=hint) from exc
    if not local and not str(path).strip("/"):
        raise InvalidInput(f"{text!r} names no bucket or path", hint=f"write {protocol}://bucket/path")
    return fs, path


def local_path(url: str | os.PathLike[str], storage_options: Options = None) -> str | None:
    """``url`` as an absolute local path when it is a plain one (no scheme, no chain, no ``~``,
    no storage options), else None: such a location can be opened with ``open``.

    ``dsctl unpack / verify`` read local stores through this and so never import fsspec,
    whose import (asyncio, ssl, importlib.metadata) was ~150 ms of their start-up. A path
    with a colon anywhere still goes through :func:`resolve` (it may be a URL, or a typo of
    one that :func:`dsagent.format.storage_errors.check_url` refuses).
    """
    text = os.fspath(url)
    if store_options(storage_options).values or not text or "\x00" in text or ":" in text or text.startswith("~"):
        return None
    return os.path.abspath(text)


class LocalFiles:
    """The local disk, answering the few filesystem calls that digesting and packing a
    plain local path make, without importing fsspec.

    ``dsctl digest`` and ``dsctl pack`` of a local tree into a local store read and write
    with ``os`` directly (:func:`dsagent.format.digester.is_local` branches); the fsspec
    filesystem was only asked whether the root exists, whether it is a directory, to make
    the store's directories and for an object's size, and its import (asyncio, ssl,
    importlib.metadata, ~150 ms on a quiet machine) was most of ``dsctl digest``'s
    start-up. The methods keep fsspec's ``LocalFileSystem`` meaning for these calls.
    """

    protocol = ("file", "local")

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def size(self, path: str) -> int:
        return os.stat(path).st_size  # FileNotFoundError when absent, as fsspec raises

    def info(self, path: str) -> dict[str, Any]:
        st = os.stat(path)
        return {"name": path, "size": st.st_size, "type": "directory" if os.path.isdir(path) else "file"}

    def open(self, path: str, mode: str = "rb", **_: Any) -> IO[bytes]:
        return open(path, mode)  # noqa: SIM115  # the caller closes it

    def cat_file(self, path: str) -> bytes:
        with open(path, "rb") as stream:
            return stream.read()

    def mv(self, source: str, dest: str) -> None:
        os.replace(source, dest)

    def rm(self, path: str) -> None:
        os.unlink(path)

    @staticmethod
    def _strip_protocol(path: str) -> str:
        return path


LOCAL_FILES = LocalFiles()


def resolve_local_first(url: str | os.PathLike[str], storage_options: Options = None) -> tuple[AbstractFileSystem, str]:
    """:func:`resolve`, except that a plain local path (:func:`local_path`) is answered with
    :data:`LOCAL_FILES` and never imports fsspec. For the callers whose local branches read
    and write with ``os`` (digesting and packing)."""
    path = local_path(url, storage_options)
    if path is None:
        return resolve(url, storage_options)
    return LOCAL_FILES, path  # the calls these callers make (fsspec is untyped: no cast needed)


def _single(text: str, storage_options: Mapping[str, Any]) -> tuple[AbstractFileSystem, str]:
    """What ``url_to_fs`` does for one URL, without its chain split (which cuts IPv6 hosts)."""
    import fsspec
    from fsspec.core import split_protocol

    protocol, _ = split_protocol(text)
    cls = fsspec.get_filesystem_class(protocol or "file")
    options = {**cls._get_kwargs_from_urls(text), **storage_options}
    return cls(**options), cls._strip_protocol(text)


def open_whole(fs: AbstractFileSystem, path: str, *, size: int | None = None) -> IO[bytes]:
    """``path`` opened for one front-to-back read of the whole object (a bundle, a
    manifest, a file being copied or hashed), every byte of it from one version of the
    object; ``size``: what a listing said it holds.

    One version (docs/design.md#one-version-per-file): the object's version is taken when
    it is opened (:func:`version_of` its ``info``: ETag, Last-Modified, S3 VersionId, GCS
    generation, Azure ETag) and every request after that is pinned to it where the
    protocol can say so: HTTP(S) range GETs carry ``If-Match`` (else
    ``If-Unmodified-Since``), s3fs sends ``IfMatch`` with the ETag on each range GET by
    itself; a server that answers 412 fails the read as :class:`IntegrityError`
    (:func:`dsagent.format.storage_errors.classify`). An HTTP(S) object without either
    header is read in one request. A read that took more than one request is checked
    once more at its end: the version must not have moved (GCS and Azure, whose fsspec
    files send no condition, rely on this; so do servers that ignore the condition).

    fsspec's HTTP files are built for random access: a HEAD for the size, then a range
    GET per 5 MB block through a cache that copies every block again. Read straight
    through, that cost 4.0-4.9 s and 2.4-2.5 CPU-s for a 991 MB bundle set from a loopback
    server, against 1.1-1.6 s and 1.0-1.2 CPU-s for one streamed GET (``block_size=0``),
    which is what a big or unknown-size HTTP(S) object gets here. A small one keeps the
    random-access file: fsspec closes a streamed response's connection instead of
    returning it to the pool, and a new connection per ~110 kB file cost more than the
    HEAD (800 files on 8 threads: 1.1 s streamed, 0.78 s not). An S3 object of any size is
    one streamed ``get_object`` pinned by the ``info`` above (:mod:`dsagent.format.s3stream`):
    s3fs's file asked the object's HEAD a second time when it opened, three requests for a
    manifest where two do. Other backends keep their defaults.
    """
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    with _observed(fs):
        if protocols & _LOCAL:
            return fs.open(path, "rb")  # type: ignore[no-any-return]
        info = fs.info(path)
        version = version_of(info)
        if protocols & _STREAMED:
            headers = dict((getattr(fs, "kwargs", None) or {}).get("headers") or {})
            if version.get("ETag") and not version["ETag"].startswith("W/"):  # a weak tag never in If-Match
                headers["If-Match"] = version["ETag"]
            elif version.get("Last-Modified"):
                headers["If-Unmodified-Since"] = version["Last-Modified"]
            known = info.get("size")
            if not version or known is None or (size if size is not None else known) >= _STREAM_FROM:
                stream = fs.open(path, "rb", block_size=0, size=known, headers=headers)
                return stream  # type: ignore[no-any-return]  # one request: one version
            opened = fs.open(path, "rb", size=known, headers=headers)
        elif protocols & _S3:
            from dsagent.format.s3stream import S3Stream

            recheck = functools.partial(check_version, fs, path, version)
            return S3Stream(fs, path, info, recheck=recheck)  # type: ignore[return-value]  # one GET, pinned by IfMatch
        else:
            opened = fs.open(path, "rb")
        blocks = getattr(opened, "blocksize", 0) or 0
        whole = opened.size if isinstance(getattr(opened, "size", None), int) else info.get("size") or 0
        if not version or whole <= blocks:
            return opened  # type: ignore[no-any-return]  # one request (or nothing to pin to)
        return _OneVersion(opened, fs, path, version)  # type: ignore[return-value]


def forget_listings(fs: AbstractFileSystem, root: str) -> None:
    """Drop what ``fs`` remembers of ``root`` and everything under it. fsspec keeps the
    listings (sizes, ETags) of a filesystem instance for as long as the instance lives,
    and instances are shared per storage options: a listing from an earlier request names
    older versions, and reading by it fails (or, unpinned, mixes versions)."""
    top = str(fs._strip_protocol(root)).rstrip("/")
    cache = getattr(fs, "dircache", None)
    for key in list(cache or ()):
        if key == top or str(key).startswith(top + "/"):
            cache.pop(key, None)  # type: ignore[union-attr]
    fs.invalidate_cache(root)


#: ``info`` keys that name an object's version, by backend: S3 (s3fs), GCS (gcsfs),
#: Azure (adlfs), HTTP(S) (fsspec's response headers).
_VERSION_KEYS = ("VersionId", "ETag", "generation", "etag", "version_id", "Last-Modified")


def version_of(info: Mapping[str, Any]) -> dict[str, str]:
    """The version an object's ``info`` names (empty when it names none): what must not
    change while the object is read (docs/design.md#one-version-per-file)."""
    return {key: str(info[key]) for key in _VERSION_KEYS if info.get(key) not in (None, "", "null")}


class CheckedAtEnd:
    """A file read front to back whose object is checked once when the read reaches its end
    (:meth:`check`, a subclass's); :meth:`saw` hears every chunk read before that."""

    def __init__(self, stream: Any, fs: Any, path: str) -> None:
        self._stream, self._fs, self._path = stream, fs, path
        self._checked = False

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._stream.read(size)
        self.saw(data)
        if (not data or size < 0) and not self._checked:
            self._checked = True
            self.check()
        return data

    def saw(self, data: bytes) -> None:
        """A chunk read (nothing to do, unless a subclass counts)."""

    def check(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> CheckedAtEnd:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._stream, attr)


class _OneVersion(CheckedAtEnd):
    """A file read in several requests, whose object's version is asked again when the
    read reaches its end: a different one fails the read as :class:`IntegrityError`."""

    def __init__(self, stream: Any, fs: AbstractFileSystem, path: str, version: dict[str, str]) -> None:
        super().__init__(stream, fs, path)
        self._version = version

    def check(self) -> None:
        check_version(self._fs, self._path, self._version)


def check_version(fs: AbstractFileSystem, path: str, version: Mapping[str, str]) -> None:
    """After a read of ``path`` made of several requests: the object, asked again (the
    filesystem's listings of it dropped first), still has ``version`` (:func:`version_of`),
    else :class:`IntegrityError`."""
    fs.invalidate_cache(path)
    now = version_of(fs.info(path))
    if now != version:
        raise IntegrityError(
            f"{path!r} changed while it was read (version {dict(version)} -> {now})", hint=storage_errors.CHANGED_HINT
        )


#: Hears of one store request: ``(protocol, seconds, None or the error code it failed with)``.
StoreObserver = Callable[[str, float, "str | None"], None]
_OBSERVERS: list[StoreObserver] = []


def add_store_observer(observer: StoreObserver) -> Callable[[], None]:
    """Tell ``observer`` of every store request from now on; returns the call that stops it."""
    _OBSERVERS.append(observer)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            _OBSERVERS.remove(observer)

    return remove


def protocol_label(name: str) -> str:
    """The one name a protocol is counted under: the allowlist's aliases folded
    (:data:`dsagent.format.sources.ALIASES`) and ``https`` counted as ``http``."""
    # imported here: the URL rules (and the egress checks they import) are not needed by a
    # plain local path's digest or pack, which never reach this module's remote branches
    from dsagent.format.sources import ALIASES

    return "http" if name == "https" else ALIASES.get(name, name)


def _fs_label(fs: AbstractFileSystem) -> str:
    return protocol_label(fs.protocol if isinstance(fs.protocol, str) else (fs.protocol[0] if fs.protocol else "file"))


@contextmanager
def _observed(fs: AbstractFileSystem) -> Iterator[None]:
    if not _OBSERVERS:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    except Exception as exc:
        error = storage_errors.classify(exc, "store")
        _notify(_fs_label(fs), time.perf_counter() - started, error.code if error is not None else "internal")
        raise
    _notify(_fs_label(fs), time.perf_counter() - started, None)


def _notify(protocol: str, seconds: float, code: str | None) -> None:
    for observer in list(_OBSERVERS):
        observer(protocol, seconds, code)


#: Protocols whose whole-object reads are one streamed request (see :func:`open_whole`).
_STREAMED = frozenset({"http", "https"})
#: S3's protocols: every object is one streamed GET (:mod:`dsagent.format.s3stream`).
_S3 = frozenset({"s3", "s3a"})
#: Protocols of the local disk: nothing to pin (a file changed under a copy fails its digest).
_LOCAL = frozenset({"file", "local"})
#: HTTP(S) objects from this size up are streamed (see :func:`open_whole`).
_STREAM_FROM = 8 << 20


def resolves_within(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]]) -> bool:
    """Whether local ``path``, symlinks resolved, lies inside one of ``roots`` (also resolved)."""
    real = os.path.realpath(path)
    for root in roots:
        top = os.path.realpath(root)
        if real == top or real.startswith(top.rstrip(os.sep) + os.sep):
            return True
    return False


@contextmanager
def translate_errors(what: str, *, fs: AbstractFileSystem | None = None, path: str | None = None) -> Iterator[None]:
    """Map storage errors raised inside the block to dsagent errors naming ``what``
    (:func:`dsagent.format.storage_errors.classify`); anything it does not know passes.

    With the block's ``fs`` and ``path`` (the first request of a command), a 403 without a
    body is settled by a second question (:func:`_settle_forbidden`): S3 answers HEAD
    requests without one, so refused credentials and a denied permission look alike there.
    """
    try:
        yield
    except OSError as exc:
        if is_full_disk(exc):  # a full disk is never "retry the source"
            raise local_write_error(exc, what) from exc
        if exc.errno == errno.ENOTDIR:  # a path through a regular file: the input's shape, not the store's health
            raise InvalidInput(
                f"{what}: a part of {exc.filename or 'the path'} is a file, not a directory",
                hint="give a directory or a URL there",
            ) from exc
        error = _settle_forbidden(storage_errors.classify(exc, what), exc, what, fs, path)
        if error is None or id(error) == id(exc):
            raise
        raise error from exc
    except Exception as exc:
        error = _settle_forbidden(storage_errors.classify(exc, what), exc, what, fs, path)
        if error is None or error is exc:
            raise
        raise error from exc


def _settle_forbidden(
    error: DsagentError | None, exc: BaseException, what: str, fs: AbstractFileSystem | None, path: str | None
) -> DsagentError | None:
    """A bodiless 403 read as "permission denied" becomes "credentials refused" when a listing
    of ``path``'s folder, whose answer carries the store's own code, says the credentials are
    the problem. The listing is asked only on this failure path; if it is allowed (or fails
    otherwise) the first reading stands."""
    if fs is None or path is None or not isinstance(error, StorageForbidden) or not storage_errors.bodiless(exc):
        return error
    folder = path.rstrip("/").rsplit("/", 1)[0] if "/" in path.rstrip("/") else path
    try:
        forget_listings(fs, folder)
        fs.ls(folder, detail=False)
    except Exception as second:  # the probe's own failure is only evidence, never raised
        settled = storage_errors.classify(second, what)
        if isinstance(settled, StorageCredentials):
            return settled
    return error
