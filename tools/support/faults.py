"""Fault injection for the agent's data path, the way SQLite tests I/O errors.

Who uses it: ``tests/dsagent/cache/test_fault_injection.py`` and
``tests/dsagent/cache/test_fault_injection_per_file.py`` (a sample of points, in the suite)
and ``tools/faults/sweep.py`` (every point). What it owns:

- :class:`Injector`: counts the filesystem operations under one cache root (``open``,
  ``write``, ``fsync`` and ``syncfs``, ``rename`` / ``replace`` / ``link``, ``mkdir``) and the
  catalog's commits, and makes the Nth fail with an ``OSError`` (ENOSPC, EIO, EDQUOT; a
  commit fails as SQLite reports it), once or from N on (a full disk stays full), or
  kills the process there (``SIGKILL``). It wraps the ``os`` / ``io`` functions the agent
  calls, so the agent's code is the real one; where the native loops run, the C unpack
  loop's creates and writes are counted and failed too, through its I/O hook
  (:func:`dsagent.format.native.set_io_hook`), so a sweep covers the loops that run in
  production. Operations outside the root (the bundle store, pytest's own files) are not
  counted.
- :func:`run_point`: one in-process agent (a real :class:`CacheService`, a real tar+zstd
  multi-bundle store in a local directory) serving one task with the fault armed, then
  the same request with the fault gone, checking after each: the task failed with a
  clear code (not ``internal``) or is ready with a copy that ``dsctl verify``'s check
  (:func:`verify_tree`) accepts; every version the catalog calls ready verifies; no
  reservation, pin, progress or flight is left; no staging without an unfinished
  version that owns it, nothing left in the trash; after the retry, ready and verified.
- :func:`run_kill_point`: the same with ``kill -9`` at operation N of a real
  ``dsagent serve`` process, then a plain restart and the same request.
- ``python -m tools.support.faults --kill-at N -- <dsagent args>``: runs ``dsagent`` with
  the killer armed from the first task's creation on (used by :func:`run_kill_point`).

Determinism: one fetch at a time, one worker, background writeback off: the Nth
operation is the same one in every run.
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import contextlib
import errno
import io
import os
import signal
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("open", "write", "fsync", "rename", "mkdir", "commit")
ERRNOS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO, "EDQUOT": errno.EDQUOT}
#: a source's read failing: the network or the source's disk, never the cache disk's space
READ_ERRNOS = {"EIO": errno.EIO, "ECONNRESET": errno.ECONNRESET}
#: the error codes a failed task may carry: clear ones, never ``internal``, and never
#: ``source_unavailable``: every fault is injected on the cache disk, which is not the
#: source (a failing disk is ``cache_disk``, never "source unavailable")
CLEAR_CODES = {"insufficient_space", "integrity", "cache_disk", "catalog", "not_found", "conflict"}


class Injector:
    """Counts operations under ``root`` and fails (or kills at) number ``at``."""

    def __init__(
        self,
        root: Path,
        *,
        at: int | None = None,
        code: int = errno.ENOSPC,
        persist: bool = False,
        kill: bool = False,
        armed: bool = True,
        kinds: tuple[str, ...] = (),
    ) -> None:
        self.root = os.path.realpath(root) + "/"
        self.counted = frozenset(kinds or KINDS)  # the kinds numbered (and failed)
        self.on_fire: Callable[[], None] | None = None  # done at ``at`` instead of failing
        self.at, self.code, self.persist, self.kill = at, code, persist, kill
        self.armed = armed  # counting at all
        self.active = True  # failing at ``at`` (off for the retry)
        self.count = 0
        self.fired = 0
        self.kinds: Counter[str] = Counter()
        self.ops: list[tuple[str, str]] = []  # (kind, path) of each counted operation, in order
        self.failed_op: tuple[str, str] | None = None
        self.native_ops = 0  # of the operations counted, those of the C unpack loop (its I/O hook)
        self._lock = threading.Lock()
        self._undo: list[Callable[[], None]] = []

    # -- counting -------------------------------------------------------------------

    def under(self, path: Any) -> str | None:
        if isinstance(path, int):
            try:
                name = os.readlink(f"/proc/thread-self/fd/{path}")  # this thread's table: a C writer's own
            except OSError:
                return None
        elif isinstance(path, (str, bytes, os.PathLike)):
            name = os.path.abspath(os.fsdecode(path))
        else:
            return None
        return name if (name + "/").startswith(self.root) else None

    def hit(self, kind: str, path: Any, *, reading: bool = False) -> None:
        """One operation of ``kind`` on ``path``: counted when under the root; failed when it
        is the one (``reading``: an open for reading, which a full disk never refuses)."""
        if not self.armed or kind not in self.counted:
            return
        name = "catalog.db" if kind == "commit" else str(path) if kind == "read" else self.under(path)
        if name is None:
            return
        with self._lock:
            self.count += 1
            self.kinds[kind] += 1
            self.ops.append((kind, name))
            n = self.count
            fail = self.active and self.at is not None and (n == self.at or (self.persist and n > self.at))
            if fail:
                self.fired += 1
                if self.failed_op is None:
                    self.failed_op = (kind, name)
        if not fail:
            return
        if self.on_fire is not None:
            self.on_fire()
            return
        if reading and not self.kill and self.code in (errno.ENOSPC, errno.EDQUOT):
            return
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "commit":
            message = "database or disk is full" if self.code in (errno.ENOSPC, errno.EDQUOT) else "disk I/O error"
            raise sqlite3.OperationalError(message)
        if kind in ("write", "fsync") and isinstance(path, int):
            # a descriptor's error names no file: os.write's, the C loop's, fsync(2)'s, syncfs(2)'s
            raise OSError(self.code, os.strerror(self.code))
        raise OSError(self.code, os.strerror(self.code), name)

    # -- installing -----------------------------------------------------------------

    def _patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        real = getattr(owner, attr)
        setattr(owner, attr, make(real))
        self._undo.append(lambda: setattr(owner, attr, real))

    def install(self) -> Injector:
        from dsagent.cache import catalog as catalog_module
        from dsagent.cache import fetch as fetch_module
        from dsagent.format import durable, native

        hit, under = self.hit, self.under
        if native.AVAILABLE:
            # the C unpack loop writes files without passing through os: its hook counts
            # (and fails, or kills at) each create and write as the wrappers below do
            def c_io(kind: str, fd: int, name: bytes | None) -> None:
                if self.armed and kind in self.counted:
                    with self._lock:  # the C loop's writers call it from several threads
                        self.native_ops += 1
                # a writer of the C loop has a descriptor table of its own: this thread's is read
                where = fd if name is None else os.readlink(f"/proc/thread-self/fd/{fd}")
                hit(kind, where if name is None else os.path.join(where, os.fsdecode(name)))

            native.set_io_hook(c_io)
            self._undo.append(lambda: native.set_io_hook(None))

        def path_op(kind: str) -> Callable[[Any], Any]:
            def make(real: Any) -> Any:
                def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
                    if kwargs.get("dir_fd") is None:
                        hit(kind, path)
                    return real(path, *args, **kwargs)

                return wrapper

            return make

        def two_path_op(kind: str) -> Callable[[Any], Any]:
            def make(real: Any) -> Any:
                def wrapper(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
                    hit(kind, dst if under(dst) else src)
                    return real(src, dst, *args, **kwargs)

                return wrapper

            return make

        def io_open(real: Any) -> Any:
            def wrapper(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
                name = under(file)
                if name is not None and not isinstance(file, int):  # os.fdopen of a descriptor: opened already
                    hit("open", file, reading=not any(c in mode for c in "wax+"))
                handle = real(file, mode, *args, **kwargs)
                if name is not None and any(c in mode for c in "wax+"):
                    return _CountingFile(handle, name, hit)
                return handle

            return wrapper

        def os_open(real: Any) -> Any:
            def wrapper(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
                if kwargs.get("dir_fd") is None:
                    hit("open", path, reading=not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
                return real(path, flags, *args, **kwargs)

            return wrapper

        self._patch(os, "open", os_open)
        self._patch(os, "mkdir", path_op("mkdir"))
        self._patch(os, "rename", two_path_op("rename"))
        self._patch(os, "replace", two_path_op("rename"))
        self._patch(os, "link", two_path_op("rename"))
        self._patch(os, "write", path_op("write"))
        self._patch(os, "fsync", path_op("fsync"))
        self._patch(os, "fdatasync", path_op("fsync"))
        self._patch(io, "open", io_open)
        self._patch(builtins, "open", io_open)
        self._patch(durable, "_syncfs_fd", path_op("fsync"))
        self._patch(durable, "WRITEBACK_STEP", lambda real: 0)  # deterministic: no background flush

        def source_reads(real: Any) -> Any:  # each read of a per-file copy's source file
            def wrapper(fs: Any, path: str, *args: Any, **kwargs: Any) -> Any:
                return _CountingReads(real(fs, path, *args, **kwargs), path, hit)

            return wrapper

        self._patch(fetch_module, "open_one_version", source_reads)

        real_tx = catalog_module.Catalog._tx

        @contextlib.contextmanager
        def tx(catalog: Any) -> Iterator[Any]:
            with real_tx(catalog) as db:
                yield db
                hit("commit", None)  # raised inside: the transaction rolls back, as a failed COMMIT does

        self._patch(catalog_module.Catalog, "_tx", lambda real: tx)
        return self

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Injector:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


class _CountingFile:
    """A file object whose writes count as operations (Python's own file writes bypass ``os.write``)."""

    def __init__(self, handle: Any, name: str, hit: Callable[[str, Any], None]) -> None:
        self._handle, self._name, self._hit = handle, name, hit

    def write(self, data: Any) -> int:
        self._hit("write", self._name)
        return int(self._handle.write(data))

    def __enter__(self) -> _CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._handle)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._handle, attr)


class _CountingReads:
    """A source file being copied whose reads count as operations (kind ``read``)."""

    def __init__(self, handle: Any, name: str, hit: Callable[[str, Any], None]) -> None:
        self._handle, self._name, self._hit = handle, name, hit

    def read(self, *args: Any) -> Any:
        self._hit("read", self._name)
        return self._handle.read(*args)

    def __enter__(self) -> _CountingReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._handle, attr)


# --------------------------------------------------------------------------- the scenario


@dataclass
class Dataset:
    """A multi-bundle tar+zstd dataset in a local store, with an empty directory."""

    source: Path
    store: Path
    name: str = "images"

    @classmethod
    def make(cls, base: Path, *, files: int = 12, size: int = 3000, per_bundle: int = 3) -> Dataset:
        from dsagent.format.bundles.bundle import pack

        source = base / "src" / "images"
        for i in range(files):
            path = source / f"class{i % 3}" / f"img{i:03d}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes([i % 251]) * (size + i))
        (source / "empty-class").mkdir(parents=True, exist_ok=True)
        store = base / "src" / "store"
        pack(source, store, name="images", max_files=per_bundle)
        return cls(source, store)

    def manifest(self) -> Any:
        from dsagent.format.manifest import read_manifest

        return read_manifest(str(self.store), self.name)

    def request(self) -> Any:
        from dsagent.cache.service import DatasetRequest

        return DatasetRequest(self.name, str(self.source), str(self.store))

    @property
    def allowed(self) -> Path:
        """The local directory the agent may read (``DSAGENT_LOCAL_SOURCES``)."""
        return self.source.parent

    def check_copy(self, path: Path) -> str | None:
        """Why the copy at ``path`` does not verify against the packed manifest, else None."""
        return _verified(path, self.manifest())

    def change(self) -> None:
        raise NotImplementedError("a packed dataset's source does not change in the sweep")

    def settle(self) -> None:
        pass


#: The per-file dataset: small files in two directories and one read in two HTTP range GETs
#: (fsspec's 5 MiB blocks, its first read ahead of a 1 MiB chunk: 6 MiB; this is 6.5 MiB).
PER_FILE_FILES = {
    **{f"class{i % 2}/img{i:03d}.bin": bytes([i]) * (3000 + i) for i in range(6)},
    "big/weights.bin": bytes(range(256)) * (13 << 11),
}


def _changed(data: bytes) -> bytes:
    """Another version of a file, the same size: what a rewrite in place leaves."""
    return bytes(b ^ 0x5A for b in data)


@dataclass
class PerFileSource:
    """A dataset the agent copies file by file (no bundle store), served from ``kind``:
    ``local`` (a directory), ``http`` (:class:`tools.support.versioned_http.VersionedServer`
    on 127.0.0.1, with ETags it honours) or ``s3`` (``moto`` in server mode). ``change()``
    rewrites every file at its source (same sizes, other bytes); ``settle()`` makes the
    source quiet again at the new version."""

    kind: str
    base: Path
    url: str
    storage_options: dict[str, Any] | None = None
    name: str = "perfile"
    server: Any = None
    changed: bool = False

    @classmethod
    def make(cls, kind: str, base: Path, *, s3: Any = None) -> PerFileSource:
        tree = base / "tree" / "perfile"  # the files as they are, for the manifests a copy must match
        for path, data in PER_FILE_FILES.items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_bytes(data)
        if kind == "local":
            return cls(kind, base, str(tree))
        if kind == "http":
            from tools.support.versioned_http import VersionedServer

            server = VersionedServer({p: [d] for p, d in PER_FILE_FILES.items()}, validators="etag", flip_after=None)
            return cls(kind, base, server.url, server=server)
        if kind == "s3":
            bucket = f"perfile-{base.name.lower()}"[:60].rstrip("-")
            s3.create_bucket(bucket)
            source = cls(kind, base, f"s3://{bucket}/perfile", s3.options(), server=s3)
            source._put(PER_FILE_FILES)
            return source
        raise ValueError(kind)

    def _client(self) -> Any:
        import boto3

        from tools.support.s3server import KEY, SECRET

        return boto3.client(
            "s3",
            endpoint_url=self.server.endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def _put(self, files: dict[str, bytes]) -> None:
        bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        client = self._client()
        for path, data in files.items():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{path}", Body=data)

    def request(self) -> Any:
        from dsagent.cache.service import DatasetRequest

        return DatasetRequest(self.name, self.url, None, self.storage_options)

    @property
    def allowed(self) -> Path:
        return self.base / "tree"

    def files(self) -> dict[str, bytes]:
        if not self.changed:
            return dict(PER_FILE_FILES)
        return {p: _changed(d) for p, d in PER_FILE_FILES.items()}

    def check_copy(self, path: Path) -> str | None:
        """Why the copy at ``path`` is not this source, else None: every file must be
        exactly one version of its source file (as it was, or as it is after ``change``;
        one file of each is fine), and nothing else may be there."""
        found = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
        if found != set(PER_FILE_FILES):
            return f"files {sorted(found ^ set(PER_FILE_FILES))[:5]} differ from the source's"
        for relative, data in PER_FILE_FILES.items():
            copied = (path / relative).read_bytes()
            if copied != data and copied != _changed(data):
                return f"{relative} is no version of its source file ({len(copied)} bytes)"
        return None

    def change(self) -> None:
        """Every file rewritten in place at the source, the same size."""
        self.changed = True
        new = self.files()
        if self.kind == "local":
            for path, data in new.items():
                with open(Path(self.url) / path, "r+b") as out:  # in place: the same inode
                    out.write(data)
        elif self.kind == "http":
            with self.server._server.lock:
                self.server._server.files = {p: [d] for p, d in new.items()}
        else:
            self._put(new)

    def settle(self) -> None:
        pass  # the source stays at its new version

    def close(self) -> None:
        if self.kind == "http":
            self.server.close()


@dataclass
class Outcome:
    """What one injection point gave."""

    at: int
    first: str  # ready | failed:<code> | refused:<code> | killed | ...
    retry: str = ""
    op: tuple[str, str] | None = None
    violations: list[str] = field(default_factory=list)


def _settings(root: Path, data: Path) -> Any:
    from dsagent.cache.settings import Settings

    # the sweep's HTTP and S3 servers listen on loopback: allowed as an operator would (DSAGENT_EGRESS_ALLOW)
    return Settings(
        root=root,
        sweep_interval=3600,
        max_fetches=1,
        fetch_workers=1,
        local_sources=(data,),
        egress_allow=("127.0.0.0/8", "::1"),
    )


def _verified(path: Path, manifest: Any) -> str | None:
    from dsagent.errors import DsagentError
    from dsagent.format.bundles.bundle import verify_tree

    try:
        verify_tree(path, manifest, workers=1)
    except DsagentError as exc:
        return str(exc)[:300]
    return None


def check_root(root: Path, data: Any, *, after_retry: bool) -> list[str]:
    """The on-disk and catalog invariants of a cache root at rest (no agent running on it)."""
    problems: list[str] = []
    db = sqlite3.connect(f"file:{root / 'catalog.db'}?mode=ro", uri=True)  # read as it is, by SQL
    try:
        rows = db.execute("SELECT name, digest, state FROM versions").fetchall()
        done = set(db.execute("SELECT DISTINCT name, digest FROM bundles_done").fetchall())
    finally:
        db.close()
    unfinished = {(name, digest) for name, digest, state in rows if state != "ready"}
    for name, digest, state in rows:
        if state == "ready":
            bad = data.check_copy(root / "datasets" / name / digest)
            if bad:
                problems.append(f"ready in the catalog but does not verify: {bad}")
    for entry in (root / "staging").iterdir() if (root / "staging").is_dir() else ():
        name, _, digest = entry.name.rpartition("@")
        if after_retry or (name, digest) not in unfinished:
            problems.append(f"staging left: {entry.name}")
    for key in done:  # their files are in staging, or renamed into place before a lost commit
        staged, published = root / "staging" / f"{key[0]}@{key[1]}", root / "datasets" / key[0] / key[1]
        if not staged.is_dir() and not (key in unfinished and published.is_dir()):
            problems.append(f"bundle records without their files: {key[0]}@{key[1][:12]}")
    if (root / "trash").is_dir() and any((root / "trash").iterdir()):
        problems.append("trash not emptied")
    leftovers = [p.name for p in (root / "manifests").rglob(".*.tmp")] if (root / "manifests").is_dir() else []
    if leftovers:
        problems.append(f"temporary manifest files left: {leftovers}")
    if after_retry and done:
        problems.append("bundle records left after the version became ready")
    return problems


async def _submit(service: Any, request: Any) -> Any:
    """Submit the task and wait: its record, or the exception that refused it."""
    try:
        return await service.submit_task("pod-a", [request], wait=60)
    except Exception as exc:  # noqa: BLE001 - judged by _judge
        return exc


def _judge(record: Any, data: Any, clear: set[str] = CLEAR_CODES) -> tuple[str, list[str]]:
    """``(outcome, problems)`` of one answer (checked with the injector disarmed)."""
    from dsagent.errors import DsagentError

    if isinstance(record, DsagentError):
        problems = [] if record.code in clear else [f"refused with an unclear error {record.code}: {record}"]
        return f"refused:{record.code}", problems
    if isinstance(record, Exception):
        return f"raised:{type(record).__name__}", [f"request raised {type(record).__name__}: {record}"]
    status = record.datasets[0]
    if record.state == "ready":
        bad = data.check_copy(Path(str(status.path)))
        return "ready", [f"reported ready but does not verify: {bad}"] if bad else []
    if record.state == "failed":
        code = (status.error or {}).get("code", "?")
        unclear = code not in clear
        return f"failed:{code}", [f"failed with an unclear code {code}: {status.error}"] if unclear else []
    return f"stuck:{record.state}", [f"task still {record.state} after its wait"]


def _service_leaks(service: Any) -> list[str]:
    problems = []
    space = service._space
    if space.reservations:
        problems.append(f"reservations left: {sorted(space.reservations)}")
    if +space._pins:
        problems.append(f"pins left: {dict(space._pins)}")
    if service._progress._by_key:
        problems.append(f"progress left: {sorted(service._progress._by_key)}")
    if any(not f.done() for f in service._flights.futures()):
        problems.append("a flight is still running")
    return problems


def run_point(
    base: Path,
    data: Any,
    at: int | None,
    *,
    code: int = errno.ENOSPC,
    persist: bool = False,
    kinds: tuple[str, ...] = KINDS,
    change: bool = False,
) -> tuple[Outcome, Injector]:
    """One injection point in process (``at=None``: count only). ``base`` must be fresh.

    ``data``: a packed :class:`Dataset` or a :class:`PerFileSource`. ``kinds``: the
    operations counted (:data:`KINDS` on the cache disk; ``read``: each read of a source
    file). ``change``: at operation ``at`` the source is rewritten instead of failing
    (the retry then asks for the source as it is now)."""
    from dsagent.cache.service import CacheService

    request = data.request()
    root = base / "cache"
    root.mkdir(parents=True)
    injector = Injector(root, at=at, code=code, persist=persist, armed=False, kinds=kinds)
    if change:
        injector.on_fire = data.change
    clear = CLEAR_CODES | ({"source_unavailable"} if "read" in kinds and not change else set())

    async def scenario() -> Outcome:
        service = CacheService(_settings(root, data.allowed))
        await service.start()
        try:
            injector.armed = True
            answer = await _submit(service, request)
            injector.armed = injector.active = False  # the fault is gone; checks are not counted
            first, problems = _judge(answer, data, clear)
            problems += _service_leaks(service)
            outcome = Outcome(at or 0, first, op=injector.failed_op, violations=problems)
            retry, more = _judge(await _submit(service, request), data)
            outcome.retry = retry
            if retry != "ready":
                more.append(f"the retry did not make it ready: {retry}")
            outcome.violations += more + _service_leaks(service)
        finally:
            await service.stop()
        return outcome

    with injector:
        outcome = asyncio.run(scenario())
    outcome.violations += check_root(root, data, after_retry=True)
    return outcome, injector


def _left_by_a_kill(problem: str) -> bool:
    """What a kill may leave until the next start cleans it (checked after the restart)."""
    if problem.startswith("staging left: ") and "@pending-" in problem:
        return True  # a per-file copy owned by no record yet: the start removes it
    return problem.startswith(("trash not emptied", "temporary manifest files left"))


def _killed_child(root: str, data: Any, at: int, kinds: tuple[str, ...]) -> None:
    """In a forked child: the agent's service serving the task, killed at operation ``at``."""
    from dsagent.cache.service import CacheService

    injector = Injector(Path(root), at=at, kill=True, armed=False, kinds=kinds).install()

    async def scenario() -> None:
        service = CacheService(_settings(Path(root), data.allowed))
        await service.start()
        injector.armed = True
        await service.submit_task("pod-a", [data.request()], wait=60)
        await service.stop()

    asyncio.run(scenario())


_FORKSERVER: Any = None


def _forkserver() -> Any:
    """A forkserver with the agent imported once: each kill point forks a ready child in
    milliseconds (an agent process starts in seconds on a loaded machine), from a process
    with no threads."""
    global _FORKSERVER
    if _FORKSERVER is None:
        import multiprocessing

        _FORKSERVER = multiprocessing.get_context("forkserver")
        _FORKSERVER.set_forkserver_preload(["dsagent.cache.service", "tools.support.faults"])
    return _FORKSERVER


def run_forked_kill_point(base: Path, data: Any, at: int, *, kinds: tuple[str, ...] = KINDS) -> Outcome:
    """``kill -9`` at operation ``at`` of the agent's service in a child process, then a
    restart (recovery) in this process and the same request; ``first`` is ``killed``, or
    ``survived`` when ``at`` lies past the last operation."""
    from dsagent.cache.service import CacheService

    root = base / "cache"
    root.mkdir(parents=True)
    child = _forkserver().Process(target=_killed_child, args=(str(root), _portable(data), at, kinds))
    child.start()
    child.join(120)
    if child.exitcode is None:
        child.kill()
        child.join()
        return Outcome(at, "hung", violations=["the child neither finished nor died"])
    outcome = Outcome(at, "killed" if child.exitcode == -signal.SIGKILL else f"exit:{child.exitcode}")
    if child.exitcode not in (0, -signal.SIGKILL):
        outcome.violations.append(f"the child exited with {child.exitcode}")
    if child.exitcode == 0:
        outcome.first = "survived"
    outcome.violations += [p for p in check_root(root, data, after_retry=False) if not _left_by_a_kill(p)]

    async def restart() -> None:
        service = CacheService(_settings(root, data.allowed))
        await service.start()  # recovery, and the interrupted fetch resumes
        try:
            outcome.retry, problems = _judge(await _submit(service, data.request()), data)
            if outcome.retry != "ready":
                problems.append(f"after the restart the task is {outcome.retry}")
            outcome.violations += problems + _service_leaks(service)
        finally:
            await service.stop()

    asyncio.run(restart())
    outcome.violations += check_root(root, data, after_retry=True)
    return outcome


def _portable(data: Any) -> Any:
    """``data`` without what cannot go to another process (a server's threads)."""
    if isinstance(data, PerFileSource):
        return PerFileSource(data.kind, data.base, data.url, data.storage_options, data.name)
    return data


def run_kill_point(base: Path, data: Dataset, at: int) -> Outcome:
    """``kill -9`` at operation ``at`` of a real ``dsagent serve``, then a plain restart and
    the same request; ``first`` is ``killed`` or, past the last operation, the outcome."""
    from tools.support.harness import AgentProcess

    dataset = {"name": data.name, "source": str(data.source), "bundles": str(data.store)}
    env = {"DSAGENT_MAX_FETCHES": "1", "DSAGENT_FETCH_WORKERS": "1", "DSAGENT_EGRESS_ALLOW": "127.0.0.0/8,::1"}
    root = base / "cache"
    base.mkdir(parents=True, exist_ok=True)
    # fresh: its own command line (the fault injector's), not a fork of the preloaded agent
    agent = AgentProcess(root, env=env, local_sources=(data.source.parent,), fresh=True)
    plain = list(agent.args)
    agent.args = [
        sys.executable,
        "-m",
        "tools.support.faults",
        "--kill-at",
        str(at),
        "--root",
        str(root),
        "--",
        *agent.args[3:],
    ]
    outcome = Outcome(at, "")
    agent.start()
    try:
        with agent.client(timeout=60) as client:
            try:
                client.submit_task("pod-a", [dataset], wait=60)
            except Exception:  # noqa: BLE001 - the agent died under the request
                pass
        assert agent.proc is not None
        try:
            agent.proc.wait(timeout=10)
            outcome.first = "killed" if agent.proc.returncode == -signal.SIGKILL else f"exit:{agent.proc.returncode}"
        except Exception:  # noqa: BLE001 - past the last operation: it lives
            outcome.first = "survived"
    finally:
        agent.stop()
    outcome.violations += [p for p in check_root(root, data, after_retry=False) if not _left_by_a_kill(p)]
    agent.args = plain
    agent.start()
    try:
        with agent.client(timeout=60) as client:
            record = client.submit_task("pod-a", [dataset], wait=60)
            deadline = time.monotonic() + 60
            while record["state"] == "pending" and time.monotonic() < deadline:
                time.sleep(0.05)
                record = client.get_task("pod-a")
        outcome.retry = record["state"]
        if record["state"] != "ready":
            outcome.violations.append(f"after the restart the task is {record['state']}: {record}")
        else:
            bad = data.check_copy(Path(record["datasets"][0]["path"]))
            if bad:
                outcome.violations.append(f"reported ready after the restart but does not verify: {bad}")
    finally:
        agent.stop()
    outcome.violations += check_root(root, data, after_retry=True)
    return outcome


def _main() -> None:
    """``--kill-at N --root R -- <dsagent args>``: dsagent, killed at its Nth operation under R
    counted from the first task's creation on."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-at", type=int, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    injector = Injector(args.root, at=args.kill_at, kill=True, armed=False).install()
    from dsagent.cache.catalog import Catalog

    real_create = Catalog.create_task

    def create_task(self: Any, *a: Any, **k: Any) -> None:
        injector.armed = True  # count from the request on, the task's own commit included
        real_create(self, *a, **k)

    Catalog.create_task = create_task  # type: ignore[method-assign]
    from dsagent.cli.agent import main

    main([a for a in args.rest if a != "--"])


if __name__ == "__main__":
    _main()
