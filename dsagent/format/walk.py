"""Walking a dataset source: the files (and empty directories) to digest or pack.

Who calls it: :mod:`dsagent.format.digester` (which hashes what the walk finds) and the
one-pass pack (:func:`list_files`). What it owns: local trees walked with ``os.scandir``
(lazily, a directory at a time, by ``d_type``, following symlinks, refusing loops, FIFOs,
sockets and devices), other filesystems listed with ``fs.find``, and which filesystems
count as local.
"""

from __future__ import annotations

import operator
import os
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

from dsagent.errors import InvalidInput, NotFound
from dsagent.format import native
from dsagent.format.storage import LocalFiles, resolves_within, translate_errors

if TYPE_CHECKING:
    from fsspec.spec import AbstractFileSystem


class Found(NamedTuple):
    """A file found by the walk, before hashing (a tuple: the walk makes millions)."""

    path: str  # relative to the source root
    location: str  # where to read it (absolute local path or fsspec path)
    size: int
    mtime_ns: int
    inode: int = 0
    ctime_ns: int = 0


def is_local(fs: AbstractFileSystem) -> bool:
    if isinstance(fs, LocalFiles):
        return True
    local = sys.modules.get("fsspec.implementations.local")  # loaded already when fs is fsspec's
    return local is not None and isinstance(fs, local.LocalFileSystem)


#: inode of a local file the walk listed but did not stat yet
UNSTATED = -1

#: Directories the native listing reads at once, at most (one a core).
LIST_THREADS = 8

#: The walk hands out a directory's files in groups of at most this many names.
_GROUP = 256


class Dir(NamedTuple):
    """Some regular files of one local directory, as the walk lists them (unstat'ed)."""

    rel: str  # the directory relative to the source root ("" for the root itself)
    path: str  # where to open it
    names: list[str]


def _check_link(path: str, confine: Sequence[str] | None) -> None:
    """Refuse a symlink that resolves outside ``confine`` (when given)."""
    if confine is not None and not resolves_within(path, confine):
        raise InvalidInput(
            f"symlink in source points outside the allowed directories: {path!r} -> {os.path.realpath(path)!r}",
            hint="replace the link with the file, or add its target's directory to DSAGENT_LOCAL_SOURCES",
        )


def iter_local_dirs(root: str, empty: list[str], confine: Sequence[str] | None = None) -> Iterator[Dir]:
    """Files under a local ``root`` in groups per directory (empty directories go to ``empty``).

    Follows symlinks (a linked file is packed as a regular file) and refuses loops; with
    ``confine``, a symlink must resolve inside one of those directories: the agent reads
    with more rights than the pods it caches for, so a link planted in a shared source
    must not make it copy other host files into a pod's mount.
    Groups come as the walk goes, at most :data:`_GROUP` names each, so that hashing
    starts at once even on one flat directory of a million files. Names are sorted within
    a group and directories are visited in name order, so the entries arrive nearly in
    path order and the manifest's final sort is mostly a merge of sorted runs.
    """
    seen: set[tuple[int, int]] = set()
    stack = [("", root)]
    while stack:
        rel, directory = stack.pop()
        _enter(directory, seen)
        has_child = False
        names: list[str] = []
        subdirs: list[tuple[str, str]] = []
        with os.scandir(directory) as it:
            for item in it:
                has_child = True
                # d_type answers without a syscall (except through symlinks), and a plain file
                # in one call; the stat that sizes and dates a file happens where it is hashed
                if not item.is_file(follow_symlinks=False) and _is_directory(item.path, confine):
                    subdirs.append((f"{rel}/{item.name}" if rel else item.name, item.path))
                    continue
                names.append(item.name)
                if len(names) >= _GROUP:
                    names.sort()
                    yield Dir(rel, directory, names)
                    names = []
        if names:
            names.sort()
            yield Dir(rel, directory, names)
        stack.extend(sorted(subdirs, reverse=True))  # popped in name order
        if not has_child and rel:
            empty.append(rel)


def _enter(directory: str, seen: set[tuple[int, int]]) -> None:
    """Note ``directory`` as walked, refusing it when a symlink led back to one walked before."""
    st = os.stat(directory)
    if (st.st_dev, st.st_ino) in seen:
        raise InvalidInput(f"directory loop through symlinks at {directory!r}", hint="remove the looping link")
    seen.add((st.st_dev, st.st_ino))


def _is_directory(path: str, confine: Sequence[str] | None) -> bool:
    """An entry that is not a plain regular file: True for a directory (a linked one too),
    False for a regular file reached through a symlink; anything else is refused."""
    if os.path.islink(path):
        _check_link(path, confine)
    if os.path.isdir(path):
        return True
    if os.path.isfile(path):
        return False
    if os.path.islink(path) and not os.path.exists(path):
        raise InvalidInput(f"broken symlink in source: {path!r}", hint="fix or remove the link")
    raise InvalidInput(f"not a regular file: {path!r}", hint="datasets hold regular files only")


def list_local(root: str, empty: list[str], confine: Sequence[str] | None = None) -> list[Found]:
    """The files under a local ``root``, stat'ed, as :func:`iter_local_dirs` walks them
    (the same rules: links followed and confined, loops refused), each directory read and
    its files stat'ed by the native :func:`~dsagent.format.native.list_dir` in one call
    without the GIL, several directories at once (the kernel's lookups and stats are most
    of a listing's time, and they run on every core). Not in path order (the caller sorts)."""
    seen: set[tuple[int, int]] = set()
    files: list[Found] = []
    pending: deque[tuple[str, str, Future[tuple[list[Found], list[str], int]]]] = deque()
    with ThreadPoolExecutor(min(LIST_THREADS, os.cpu_count() or 1), thread_name_prefix="dsagent-list") as pool:

        def read(rel: str, directory: str) -> None:
            _enter(directory, seen)
            prefix = f"{rel}/" if rel else ""
            base = directory if directory.endswith("/") else f"{directory}/"
            pending.append((rel, base, pool.submit(native.list_dir, directory, prefix, base, Found)))

        read("", root)
        while pending:
            rel, base, future = pending.popleft()
            listed, others, entries = future.result()
            files += listed
            for name in sorted(others):
                prefix = f"{rel}/" if rel else ""
                with translate_errors(f"source file {base + name!r}"):
                    if _is_directory(base + name, confine):
                        read(prefix + name, base + name)
                    else:
                        files.append(found_stat(prefix + name, base + name, os.stat(base + name)))
            if not entries and rel:
                empty.append(rel)
    return files


def found_in(groups: Iterable[Dir]) -> Iterator[Found]:
    """The files of ``groups`` one by one, for the thread path."""
    join = os.path.join
    for rel, directory, names in groups:
        prefix = f"{rel}/" if rel else ""
        for name in names:
            yield Found(prefix + name, join(directory, name), -1, 0, UNSTATED, 0)


class LocalWalk:
    """The lazy walk of a local tree: taken file by file (threads) or by groups (processes);
    ``root``, ``empty`` and ``confine`` are the walk's own (for :func:`list_files`)."""

    def __init__(
        self, groups: Iterator[Dir], root: str = "", empty: list[str] | None = None,
        confine: Sequence[str] | None = None,
    ) -> None:  # fmt: skip
        self.groups = groups
        self.root, self.empty, self.confine = root, empty if empty is not None else [], confine

    def __iter__(self) -> Iterator[Found]:
        return found_in(self.groups)


def mtime_ns(info: Mapping[str, Any]) -> int:
    """Modification time in ns from an fsspec ``info`` dict, whatever the backend calls it (0 if none)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created", "modified"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1_000_000_000)
        try:
            return int(float(value) * 1_000_000_000)
        except (TypeError, ValueError):
            continue
    return 0


def walk_remote(fs: AbstractFileSystem, root: str) -> tuple[list[Found], list[str]]:
    listing = fs.find(root, withdirs=True, detail=True)
    prefix = root.rstrip("/") + "/"
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    quoted = any(p in ("http", "https") for p in protocols)  # URLs name files percent-encoded
    found: list[Found] = []
    dirs: list[str] = []
    for full, info in listing.items():
        full = full.rstrip("/")
        if not full.startswith(prefix):
            continue
        rel = unquote(full[len(prefix) :]) if quoted else full[len(prefix) :]
        if info.get("type") == "directory":
            dirs.append(rel)
        else:
            size = info.get("size")  # http listings give none: -1, taken from the read
            found.append(Found(rel, full, int(size) if size is not None else -1, mtime_ns(info)))
    parents = {f.path.rsplit("/", 1)[0] for f in found if "/" in f.path}
    parents |= {d.rsplit("/", 1)[0] for d in dirs if "/" in d}
    return found, [d for d in dirs if d not in parents]


def walk_source(
    fs: AbstractFileSystem, root: str, empty: list[str], *, confine: Sequence[str] | None = None
) -> Iterable[Found]:
    """Every file of the dataset at ``root`` (empty directories go to ``empty``); a lone file is a dataset of one.

    Local trees are walked lazily, so hashing starts while the walk goes on; ``confine``
    (local only) refuses symlinks resolving outside those directories.
    """
    with translate_errors(f"source {root!r}", fs=fs, path=root):
        if not fs.exists(root):
            raise NotFound(f"dataset source {root!r} does not exist", hint="check the path or URL")
        if not fs.isdir(root):
            name = root.rstrip("/").rsplit("/", 1)[-1]
            if is_local(fs):
                st = os.stat(root)
                return [Found(name, root, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)]
            info = fs.info(root)
            size = info.get("size")
            return [Found(name, root, int(size) if size is not None else -1, mtime_ns(info))]
        if is_local(fs):
            return LocalWalk(iter_local_dirs(root, empty, confine), root, empty, confine)
        found, dirs = walk_remote(fs, root)
        empty.extend(dirs)
        return found


def list_files(
    fs: AbstractFileSystem, root: str, empty: list[str], *, confine: Sequence[str] | None = None
) -> list[Found] | None:
    """Every file of the dataset at ``root`` with its size and mtime, in path order, none of them read.

    Local files are stat'ed (each once, following links as the walk does); the listing of
    another filesystem already carries sizes. None when a size is unknown (an http
    listing gives none): a caller that plans bundles from sizes must digest first.
    Used by the one-pass pack (:func:`dsagent.format.bundle.pack_dataset`), which reads
    each file only while packing it.
    """
    files: list[Found] = []
    found = walk_source(fs, root, empty, confine=confine)
    if isinstance(found, LocalWalk) and native.AVAILABLE:
        files = list_local(found.root, found.empty, found.confine)
    elif isinstance(found, LocalWalk):
        for group in found.groups:
            files += _stat_group(group)
    else:
        for item in found:
            if item.size < 0:
                return None
            files.append(item)
    files.sort(key=_found_path)
    return files


def _stat_group(group: Dir) -> list[Found]:
    """The files of one walk group, stat'ed relative to their directory (one open of it, no
    per-file path lookup of its ancestors): ~40% of the one-pass pack's listing otherwise."""
    rel, directory, names = group
    prefix = f"{rel}/" if rel else ""
    base = directory if directory.endswith("/") else f"{directory}/"
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            stats = [os.stat(name, dir_fd=fd) for name in names]
        finally:
            os.close(fd)
    except OSError as exc:  # which file: said as the per-file stat says it
        for name in names:
            with translate_errors(f"source file {base + name!r}"):
                os.stat(base + name)
        with translate_errors(f"source directory {directory!r}"):  # the directory itself, or gone since
            raise exc
    return [found_stat(prefix + name, base + name, st) for name, st in zip(names, stats, strict=True)]


_found_path = operator.attrgetter("path")


def found_stat(path: str, location: str, st: os.stat_result) -> Found:
    """The file at ``location`` (``path`` in the dataset) with the size, mtime, inode and ctime of ``st``."""
    return Found(path, location, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def stated(item: Found, st: os.stat_result) -> Found:
    """``item`` with the size, mtime, inode and ctime of ``st``."""
    return found_stat(item.path, item.location, st)
