"""Tree verification: does a directory hold exactly a manifest's files and empty directories?

Who calls it: ``dsctl verify`` (:mod:`dsagent.cli.bundles`), the agent's recovery of its
cache after a restart (:mod:`dsagent.cache.recovery`) and the demo; re-exported by
:mod:`dsagent.format.bundles.extract` and :mod:`dsagent.format.bundles.bundle`. What it owns: walking the
tree without following links and hashing every listed file on a thread pool.
"""

from __future__ import annotations

import os
import stat
import threading

from dsagent.errors import IntegrityError, InvalidInput, NotFound
from dsagent.format.hashing import hash_file, read_buffer
from dsagent.format.manifest import FileEntry, Manifest
from dsagent.format.storage import translate_errors
from dsplatform import cores


def _tree(directory: str) -> tuple[dict[str, os.stat_result], set[str], list[str]]:
    files: dict[str, os.stat_result] = {}
    empty: set[str] = set()
    odd: list[str] = []
    stack = [("", directory)]
    while stack:
        rel, path = stack.pop()
        has_child = False
        with os.scandir(path) as it:
            for item in it:
                has_child = True
                child = f"{rel}/{item.name}" if rel else item.name
                st = item.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append((child, item.path))
                elif stat.S_ISREG(st.st_mode):
                    files[child] = st
                else:
                    odd.append(child)
        if not has_child and rel:
            empty.add(rel)
    return files, empty, odd


def verify_tree(directory: str | os.PathLike[str], manifest: Manifest, *, workers: int | None = None) -> None:
    """Check that ``directory`` holds exactly ``manifest``'s files and empty directories.

    Reads and hashes every file. Raises :class:`IntegrityError` listing what differs
    (missing, unexpected, wrong size, wrong content, not a regular file).
    """
    root = os.fspath(directory)
    if not os.path.isdir(root):
        if not os.path.exists(root):  # as digest and unpack answer a missing path: not found, not bad input
            raise NotFound(f"{root} does not exist", hint="give the directory the dataset was unpacked or cached into")
        raise InvalidInput(f"{root} is not a directory")
    with translate_errors(f"directory {root}"):
        files, empty, odd = _tree(root)
    problems = [f"not a regular file: {p}" for p in sorted(odd)]
    listed = {entry.path for entry in manifest.entries}
    problems += [f"unexpected file: {p}" for p in sorted(files.keys() - listed)]
    problems += [f"missing directory: {d}" for d in manifest.directories if d not in empty]
    present = []
    for entry in manifest.entries:
        st = files.get(entry.path)
        if st is None:
            problems.append(f"missing file: {entry.path}")
        elif st.st_size != entry.size:
            problems.append(f"wrong size: {entry.path} ({st.st_size} bytes, expected {entry.size})")
        else:
            present.append(entry)

    buffers = threading.local()  # one read buffer per thread, not one per file

    def check(entry: FileEntry) -> str | None:
        buffer = getattr(buffers, "buffer", None)
        if buffer is None:
            buffer = buffers.buffer = read_buffer()
        with translate_errors(f"file {entry.path!r}"):
            digest, _ = hash_file(f"{root}/{entry.path}", buffer)
        return None if digest == entry.digest else f"wrong content: {entry.path}"

    from concurrent.futures import ThreadPoolExecutor  # here: dsctl unpack imports this module and verifies nothing

    with ThreadPoolExecutor(workers or min(8, 2 * cores.usable())) as pool:
        problems += [p for p in pool.map(check, present) if p]
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise IntegrityError(f"{root} does not match dataset {manifest.name!r}: {shown}", problems=problems)
