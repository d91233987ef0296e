"""Re-packing: a bundle's tar+zstd stream made again from the files of an unpacked copy.

Who calls it: the peer server (:class:`dsagent.cache.peers.peerserver.PeerServer`), which
serves the bundles of its ready versions this way, since a cached version keeps no
``.tar.zst`` objects (docs/design.md#peers: why re-packing rather than keeping them).

What it owns: writing one bundle's stream (zstd frames, raw where zstd would not shrink
the data, as :mod:`dsagent.format.bundles.frames` encodes a packed bundle; in pieces of about
1 MiB) with the member order and plain headers packs write
(:func:`dsagent.format.bundles.packwriter.tar_header`) and the pack's zstd level, so that the receiver
verifies it exactly as a store bundle; and hashing every file again as it is read, so that
a cached file that changed since it was verified cuts the stream (:class:`IntegrityError`)
instead of being passed on as good.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import xxhash

from dsagent.errors import IntegrityError
from dsagent.format.bundles.frames import FrameEncoder
from dsagent.format.bundles.packwriter import tar_header
from dsagent.format.manifest import FileEntry

#: zstd level of re-packed bundles: the level packs use (JPEG-like data does not compress)
REPACK_LEVEL = 1
_BLOCK = tarfile.BLOCKSIZE
_ZEROS = bytes(2 * tarfile.RECORDSIZE)
_READ = 1 << 20


def repack(ready_dir: Path, members: Sequence[FileEntry], *, level: int = REPACK_LEVEL) -> Iterator[bytes]:
    """A bundle's tar+zstd stream re-packed from a ready directory's files,
    in pieces of about 1 MiB.

    Each file is hashed as it is read; a file whose size or digest no longer matches the
    manifest raises :class:`IntegrityError` mid-stream, which cuts the stream short: the
    receiver then sees a truncated bundle and falls back to another source.
    """
    root = os.open(ready_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield from repack_at(root, members, level=level)
    finally:
        os.close(root)


def repack_at(root: int, members: Sequence[FileEntry], *, level: int = REPACK_LEVEL) -> Iterator[bytes]:
    """:func:`repack` from the open directory ``root``: the files are opened relative to it,
    so a staging directory renamed into place while it is served is still read whole."""
    encoder = FrameEncoder(level)
    pending = bytearray()
    buf = bytearray(_READ)
    view = memoryview(buf)

    def put(data: bytes | memoryview) -> bytes | None:
        pending.extend(data)
        if len(pending) < _READ:
            return None
        piece = b"".join(encoder.encode(pending))
        pending.clear()
        return piece

    for entry in members:
        if (piece := put(tar_header(entry))) is not None:
            yield piece
        state = xxhash.xxh3_128()
        size = 0
        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        with open(fd, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                size += n
                if size > entry.size:
                    break
                chunk = view[:n]
                state.update(chunk)
                if (piece := put(chunk)) is not None:
                    yield piece
        if size != entry.size or state.hexdigest() != entry.digest:
            raise IntegrityError(f"cached file {entry.path!r} no longer matches its digest; not serving it")
        if size % _BLOCK and (piece := put(bytes(_BLOCK - size % _BLOCK))) is not None:
            yield piece
    pending.extend(_ZEROS)
    yield b"".join(encoder.encode(pending))


__all__ = ["REPACK_LEVEL", "repack", "repack_at"]
