"""Walking a dataset source: the files (and empty directories) to digest or pack.

Who calls it: :mod:`dsagent.format.digester` (which hashes what the walk finds) and the
one-pass pack (:func:`list_files`). What it owns: local trees walked with ``os.scandir``
(lazily, a directory at a time, by ``d_type``, following symlinks, refusing loops, FIFOs,
sockets and devices), other filesystems listed with ``fs.find``, and which filesystems
count as local.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from dsagent.errors import InvalidInput, NotFound
from dsagent.format import native
from dsagent.format.storage import LocalFiles, resolves_within, translate_errors
from dsplatform import cores

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


#: a Found from a tuple of its fields, in C (the named tuple's own ``__new__`` is Python)
_new_found = functools.partial(tuple.__new__, Found)


class Listing(Sequence[Found]):
    """The files of a listing held as columns; a :class:`Found` is made only when one is asked for.

    What :func:`list_files` returns: the one-pass pack reads the columns (``paths``,
    ``sizes``, ``mtimes``) and makes no object a file; a caller that iterates gets the
    same ``Found`` tuples a list would hold. A file's location is ``base + path`` (a local
    walk) or its own (``locations``, another filesystem's listing).
    """

    def __init__(
        self, paths: list[str], sizes: list[int], mtimes: list[int], inodes: Sequence[int], ctimes: Sequence[int],
        *, base: str = "", locations: list[str] | None = None,
    ) -> None:  # fmt: skip
        self.paths, self.sizes, self.mtimes, self.inodes, self.ctimes = paths, sizes, mtimes, inodes, ctimes
        self._base, self._locations = base, locations

    @classmethod
    def of(cls, found: Sequence[Found]) -> Listing:
        """The columns of ``found``."""
        columns = [list(map(operator.itemgetter(k), found)) for k in range(6)]
        return cls(columns[0], *columns[2:], locations=columns[1])

    def locations(self) -> Iterable[str]:
        """Where each file is read from, in order."""
        return self._locations if self._locations is not None else map(self._base.__add__, self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self) -> Iterator[Found]:
        columns = zip(self.paths, self.locations(), self.sizes, self.mtimes, self.inodes, self.ctimes)
        return map(_new_found, columns)

    @overload
    def __getitem__(self, index: int) -> Found: ...
    @overload
    def __getitem__(self, index: slice) -> list[Found]: ...
    def __getitem__(self, index: int | slice) -> Found | list[Found]:
        if isinstance(index, slice):
            paths = self.paths[index]
            locations = self._locations[index] if self._locations is not None else map(self._base.__add__, paths)
            columns = (self.sizes[index], self.mtimes[index], self.inodes[index], self.ctimes[index])
            return list(map(_new_found, zip(paths, locations, *columns)))
        location = self._locations[index] if self._locations is not None else self._base + self.paths[index]
        return Found(self.paths[index], location, self.sizes[index], self.mtimes[index], self.inodes[index],
                     self.ctimes[index])  # fmt: skip

    def in_path_order(self) -> Listing:
        """This listing sorted by path (itself when it already is: a walk of sorted
        directories a level at a time often is, and checking costs a fifth of sorting)."""
        paths = self.paths
        if all(map(operator.le, paths, itertools.islice(paths, 1, None))):
            return self
        order = sorted(range(len(paths)), key=paths.__getitem__)

        def permuted(column: Sequence[Any]) -> list[Any]:
            return list(map(column.__getitem__, order))

        locations = None if self._locations is None else permuted(self._locations)
        return Listing(
            permuted(self.paths), permuted(self.sizes), permuted(self.mtimes), permuted(self.inodes),
            permuted(self.ctimes), base=self._base, locations=locations,
        )  # fmt: skip


def is_local(fs: AbstractFileSystem) -> bool:
    if isinstance(fs, LocalFiles):
        return True
    local = sys.modules.get("fsspec.implementations.local")  # loaded already when fs is fsspec's
    return local is not None and isinstance(fs, local.LocalFileSystem)


#: inode of a local file the walk listed but did not stat yet
UNSTATED = -1


def signed_inode(inode: int) -> int:
    """An inode as the native listing holds it, an int64: one past 2**63 wraps (64-bit NFS
    file ids, overlayfs)."""
    return inode - (1 << 64) if inode >= 1 << 63 else inode


#: Directories the native listing reads at once, at most (one a core).
LIST_THREADS = 8
#: Batches a listing thread takes of each level of the tree (more balance the threads'
#: work; fewer hand the GIL back and forth less).
LIST_BATCHES = 4

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


#: Directories one call of the native listing reads in the digest's walk: enough that a call
#: is worth its GIL release and its threads, few enough that hashing starts while the walk goes on.
NATIVE_BATCH = 256
#: The most threads one such call reads directories on (the kernel's listing is the time).
NATIVE_THREADS = 16


def iter_native_dirs(root: str, empty: list[str], confine: Sequence[str] | None = None) -> Iterator[Dir]:
    """:func:`iter_local_dirs` with the directories read in C (:func:`~dsagent.format.native.list_dirs`,
    which takes a file ``d_type`` calls regular without a stat: the hashing stats each file
    it opens): the same groups of names under the same rules (links followed and confined,
    loops refused, other special files refused, empty directories noted), a level of the
    tree at a time, :data:`NATIVE_BATCH` directories a call, read on up to a thread a core
    inside the call. No Python thread and no thread outliving a call: a process that forks
    its hashing processes once the first groups are in (:mod:`dsagent.format.digestpool`)
    still may. Python's ``os.scandir`` walk spends about 1 us a file under the GIL, the
    bound of a digest on many cores (docs/design-native.md#on-a-node-with-many-cores)."""
    seen: set[tuple[int, int]] = set()
    threads = min(NATIVE_THREADS, cores.usable())
    level = [("", root)]
    while level:
        below: list[tuple[str, str]] = []
        for start in range(0, len(level), NATIVE_BATCH):
            batch = level[start : start + NATIVE_BATCH]
            listed = native.list_dirs([d for _, d in batch], [""] * len(batch), stat=False, threads=threads)
            for (rel, directory), (names, _, dirs, others, entries, device, inode) in zip(batch, listed, strict=True):
                _walked(directory, (device, inode), seen)
                at = directory if directory.endswith("/") else f"{directory}/"
                for name in sorted(others):  # links, and what is neither a file nor a directory
                    (dirs if _is_directory(at + name, confine) else names).append(name)
                if others:
                    names.sort()
                for first in range(0, len(names), _GROUP):
                    yield Dir(rel, directory, names[first : first + _GROUP])
                if not entries and rel:
                    empty.append(rel)
                below += [(f"{rel}/{name}" if rel else name, at + name) for name in sorted(dirs)]
        level = below


def _enter(directory: str, seen: set[tuple[int, int]]) -> None:
    """Note ``directory`` as walked (:func:`_walked`, by its ``stat``)."""
    st = os.stat(directory)
    _walked(directory, (st.st_dev, st.st_ino), seen)


def _walked(directory: str, identity: tuple[int, int], seen: set[tuple[int, int]]) -> None:
    """Note ``directory`` (its device and inode) as walked, refusing it when a symlink led
    back to one walked before."""
    if identity in seen:
        raise InvalidInput(f"directory loop through symlinks at {directory!r}", hint="remove the looping link")
    seen.add(identity)


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


def list_local(root: str, empty: list[str], confine: Sequence[str] | None = None) -> Listing:
    """The files under a local ``root``, stat'ed, as :func:`iter_local_dirs` walks them
    (the same rules: links followed and confined, loops refused), read a level of the tree
    at a time by the native :func:`~dsagent.format.native.list_dirs`: each level's
    directories cut into a few batches (:data:`LIST_BATCHES` a thread), each batch read
    and stat'ed in one call without the GIL, on every core (the kernel's lookups and stats
    are most of a listing's time). Columns come back, a path the only object made a file.
    Not in path order (the caller sorts)."""
    from concurrent.futures import ThreadPoolExecutor  # here: the digest's walk starts no pool

    seen: set[tuple[int, int]] = set()
    paths: list[str] = []
    stats = array("q")  # size, mtime, inode, ctime a file
    threads = min(LIST_THREADS, cores.usable())
    level = [("", root)]  # (prefix in the dataset, where to read it)
    with ThreadPoolExecutor(threads, thread_name_prefix="dsagent-list") as pool:
        while level:
            step = -(-len(level) // (threads * LIST_BATCHES))
            batches = [level[i : i + step] for i in range(0, len(level), step)]
            futures = [pool.submit(native.list_dirs, [d for _, d in b], [p for p, _ in b]) for b in batches]
            below: list[tuple[str, str]] = []
            for batch, future in zip(batches, futures):
                for (prefix, directory), listed in zip(batch, future.result()):
                    below += _take(prefix, directory, listed, paths, stats, seen, empty, confine)
            level = below
    base = root if root.endswith("/") else f"{root}/"  # where the root's files are: base + path, nested too
    # sizes and mtimes as lists (the pack makes an entry of each); inodes and ctimes, which
    # only the digest cache reads, stay arrays: an int is made only when one is read
    return Listing(paths, stats[0::4].tolist(), stats[1::4].tolist(), stats[2::4], stats[3::4], base=base)


def _take(
    prefix: str, directory: str, listed: native.Listed, paths: list[str], stats: array[int],
    seen: set[tuple[int, int]], empty: list[str], confine: Sequence[str] | None,
) -> list[tuple[str, str]]:  # fmt: skip
    """One directory's listing into the columns; the directories below it, to read next."""
    found, numbers, dirs, others, entries, device, inode = listed
    _walked(directory, (device, inode), seen)
    paths += found
    stats.frombytes(numbers)
    at = directory if directory.endswith("/") else f"{directory}/"
    for name in sorted(others):
        with translate_errors(f"source file {at + name!r}"):
            if _is_directory(at + name, confine):
                dirs.append(name)
                continue
            st = os.stat(at + name)
        paths.append(prefix + name)
        stats.extend((st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
    if not entries and prefix:
        empty.append(prefix[:-1])
    return [(f"{prefix}{name}/", at + name) for name in sorted(dirs)]


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
    from urllib.parse import unquote  # here: a local walk reads no URL

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
            walk = iter_native_dirs if native.AVAILABLE else iter_local_dirs
            return LocalWalk(walk(root, empty, confine), root, empty, confine)
        found, dirs = walk_remote(fs, root)
        empty.extend(dirs)
        return found


def list_files(
    fs: AbstractFileSystem, root: str, empty: list[str], *, confine: Sequence[str] | None = None
) -> Listing | None:
    """Every file of the dataset at ``root`` with its size and mtime, in path order, none of them read.

    Local files are stat'ed (each once, following links as the walk does); the listing of
    another filesystem already carries sizes. None when a size is unknown (an http
    listing gives none): a caller that plans bundles from sizes must digest first.
    Used by the one-pass pack (:func:`dsagent.format.bundles.bundle.pack_dataset`), which reads
    each file only while packing it.
    """
    found = walk_source(fs, root, empty, confine=confine)
    if isinstance(found, LocalWalk) and native.AVAILABLE:
        return list_local(found.root, found.empty, found.confine).in_path_order()
    files: list[Found] = []
    if isinstance(found, LocalWalk):
        for group in found.groups:
            files += _stat_group(group)
    else:
        for item in found:
            if item.size < 0:
                return None
            files.append(item)
    files.sort(key=_found_path)
    return Listing.of(files)


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
