"""Where a bundle's files are written while it is verified, and how they are put in place.

Who calls it: :mod:`dsagent.format.bundles.extract`, whose member loops write into a
:class:`Staging` and, once the whole bundle verified, :func:`publish` it. What it owns: the
staging directory (``.dsagent-staging/`` inside the target: each file created there with
``O_EXCL | O_NOFOLLOW`` under its index in the bundle, or at its path where the target is
itself a private stage), making the target's directories without going through a symlink
planted there (:func:`ensure_real_dir`), and the renames into place, taken back on any
failure, a file already in the way being a :class:`~dsagent.errors.Conflict`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from dsagent.errors import Conflict, UnsafeArchive
from dsagent.format.durable import syncfs
from dsagent.format.entries import parent_dirs
from dsagent.format.manifest import BundleRef, EntryTable

STAGING_DIR = ".dsagent-staging"
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: errors of a rename into the target that mean something is in the way there (a conflict)
_IN_THE_WAY = (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR)


class Staging:
    """Where one bundle's files are written first: a private flat directory inside the target.

    Files are staged under their index in the bundle (no subdirectories to create and
    remove), then renamed to their paths once the whole bundle verified. ``in_place``
    (:func:`unpack`, whose target is itself a private stage renamed once and removed on
    any error) writes each file at its path instead: its directories are made first, and
    there is nothing to rename or remove per bundle.
    """

    def __init__(self, dest_dir: str, bundle: BundleRef, in_place: EntryTable | None = None) -> None:
        self.in_place = in_place is not None
        if in_place is not None:
            self.root = dest_dir
            made: set[str] = {""}
            for parent in sorted(parent_dirs(in_place.paths)):  # a folder before those in it
                ensure_real_dir(dest_dir, parent, made)
            self._names: list[str] | None = in_place.paths
            self._prefix = f"{self.root}/"
            return
        self._names = None
        shared = f"{dest_dir}/{STAGING_DIR}"
        self.root = f"{shared}/{bundle.digest}-{os.urandom(4).hex()}"
        for _ in range(100):  # a bundle finishing beside us may remove the shared parent
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(shared)
                os.mkdir(self.root)
                break
            except (FileNotFoundError, FileExistsError):
                continue
        else:
            os.makedirs(self.root)
        self._prefix = f"{self.root}/"

    def path(self, index: int) -> str:
        return f"{self._prefix}{index if self._names is None else self._names[index]}"

    def create(self, index: int) -> int:
        return os.open(self.path(index), _OPEN_NEW, 0o644)

    def remove(self) -> None:
        if self.in_place:
            return  # the caller removes its whole stage on an error
        import shutil  # here: dsctl unpack writes in place and removes a tree only on an error

        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):  # another bundle is staging beside us
            os.rmdir(os.path.dirname(self.root))


def ensure_real_dir(dest_dir: str, parent: str, made: set[str]) -> None:
    """Create ``dest_dir/parent``, refusing to go through a symlink planted in the target.

    One ``mkdir`` a directory not made yet, its ancestors first (``made`` remembers them):
    what is already there is taken only when ``lstat`` says it is a directory, so a planted
    symlink is refused, not followed. ~8 us a directory where walking every component
    with ``lstat`` and ``makedirs`` took ~40 us (40 ms of a 1,000-class unpack)."""
    missing = []  # parent and its ancestors not made yet, deepest first (a loop: paths may be deep)
    while parent not in made:
        missing.append(parent)
        parent = parent.rpartition("/")[0]
    for path in reversed(missing):
        current = f"{dest_dir}/{path}"
        try:
            os.mkdir(current)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                raise UnsafeArchive(
                    f"{current} exists in the target and is not a directory", hint="clear the target directory"
                ) from None
        made.add(path)


def publish(staging: Staging, dest_dir: str, members: EntryTable, durable: bool) -> None:
    """Rename a verified bundle's files into place; on failure take back the ones moved."""
    if durable:
        syncfs(staging.root)
    made: set[str] = {""}
    prefix = f"{dest_dir}/"
    moved: list[str] = []
    try:
        for index, path in enumerate(members.paths):
            parent = path.rpartition("/")[0]
            if parent:
                ensure_real_dir(dest_dir, parent, made)
            os.replace(staging.path(index), prefix + path)
            moved.append(prefix + path)
    except BaseException as exc:
        for path in moved:
            os.unlink(path)
        if isinstance(exc, OSError) and exc.errno in _IN_THE_WAY:
            raise Conflict(
                f"cannot place the files of a bundle in {dest_dir}: {exc}", hint="clear the target directory"
            ) from exc
        raise  # a full or failing disk: the caller's _local_writes says which
    if durable:
        syncfs(dest_dir)


__all__ = ["STAGING_DIR", "Staging", "ensure_real_dir", "publish"]
