"""Reading a bundle's tar stream: its headers and its members' data, from the decompressed
bytes a :class:`~dsagent.format.framereader.FrameReader` hands on; and the header layout
bundles are written with.

Who calls it: :mod:`dsagent.format.bundles.extract`, and :mod:`dsagent.format.bundles.packwriter`
and the native loops for the header layout (:data:`USTAR`). What it owns: turning the
decompressed stream into ``(header, data chunks)`` with as few copies as possible, and
reporting every malformation as :class:`IntegrityError` or :class:`UnsafeArchive`:

- :func:`iter_members` parses POSIX ustar headers (the plain header bundles are written
  with by :func:`_plain_header`, checksum included; any other by ``tarfile.TarInfo.frombuf``),
  pax extended headers (``path``, ``size``) and GNU long names, and yields each member's
  header; the caller must then consume exactly ``size`` bytes with :func:`read_data`
  before asking for the next one. A pax or GNU long-name header is at most
  :data:`MAX_EXTENDED_HEADER` bytes.

The standard ``tarfile`` streaming reader does the same job with several extra copies
per chunk, which made it the hot spot of unpacking. The pack imports this module for the
layout alone, so it holds no decompression (:mod:`dsagent.format.framereader`).
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from dsagent.errors import IntegrityError, UnsafeArchive
from dsagent.format.hashing import CHUNK_SIZE

if TYPE_CHECKING:
    import tarfile

    from dsagent.format.framereader import FrameReader


#: tar's block and record sizes (``tarfile.BLOCKSIZE``, ``tarfile.RECORDSIZE``), here so that
#: reading and writing plain headers (the C member loop, the packer) imports no ``tarfile``
BLOCK = 512
RECORD = 20 * BLOCK
#: The plain ustar header bundles are written with (:func:`dsagent.format.bundles.bundle.tar_header`)
#: and read back fast (:func:`_plain_header`): ``tarfile``'s layout and zero padding, mode
#: 0644, uid/gid 0, a regular file, ``ustar\0`` ``00``, no link, owner names, device
#: numbers or prefix; only the name, the size and the mtime vary.
USTAR = struct.Struct("100s8s8s8s12s12s8s1s100s6s2s32s32s8s8s155s12s")
USTAR_FIXED = (b"0000644\0", b"0000000\0", b"0000000\0")
USTAR_TAIL = (b"0", b"", b"ustar\0", b"00", b"", b"", b"", b"", b"", b"")
USTAR_LIMIT = 8**11  # 11 octal digits: larger sizes and times need a pax header
_PLAIN = USTAR.pack(b"", *USTAR_FIXED, b"", b"", b"", *USTAR_TAIL)
_PLAIN_FIXED, _PLAIN_TAIL = _PLAIN[100:124], _PLAIN[156:]
#: A header's checksum counts its own 8-byte field as spaces.
_BLANK_CHECKSUM = sum(b" " * 8)
#: The checksum of a plain header before its name, size and mtime are added.
USTAR_BASE = sum(_PLAIN) + _BLANK_CHECKSUM


@functools.cache
def _octal_11() -> re.Pattern[bytes]:
    """11 octal digits and a NUL, compiled on first use (the C member loop checks its own
    headers) and kept: the Python loop asks twice a member, and ``re``'s own cache costs
    each lookup more than the match."""
    return re.compile(rb"[0-7]{11}\0")


_ZERO_BLOCK = bytes(BLOCK)

#: Zero bytes a tar writer may add after the end-of-archive block (ours: two records).
MAX_TAIL = 2 * RECORD
#: The largest pax or GNU long-name header accepted (a path is at most a few KB).
MAX_EXTENDED_HEADER = 1 << 20


def plain_template() -> bytes:
    """The 512-byte plain header with its name, size, mtime and checksum blank (the native
    member loop takes exactly the headers :func:`_plain_header` takes)."""
    return _PLAIN


def tar_bound(members: Iterable[tuple[int, int]]) -> int:
    """The most bytes a tar of ``(size, name bytes)`` members may hold: each member's data
    padded, its header and a pax header carrying its name, then the end blocks."""
    total = MAX_TAIL + 2 * BLOCK
    for size, name_bytes in members:
        total += _padded(size) + 3 * BLOCK + _padded(3 * name_bytes + 256)
    return total


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _pax_records(data: bytes, what: str) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        try:
            length_text, _, _ = data[pos : pos + 24].partition(b" ")
            length = int(length_text)
            record = data[pos + len(length_text) + 1 : pos + length]
            key, _, value = record.rstrip(b"\n").partition(b"=")
        except ValueError as exc:
            raise IntegrityError(f"{what} has a malformed pax header") from exc
        if length <= 0:
            raise IntegrityError(f"{what} has a malformed pax header")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _plain_header(block: bytes) -> tarfile.TarInfo | None:
    """The member of a header exactly as bundles write it (:data:`USTAR`), else None.

    ``TarInfo.frombuf`` costs ~25 us a header, ~10% of unpacking 6,000 files on tmpfs;
    this takes only a header that ``frombuf`` would read the same way (every fixed field
    as written, 11 octal digits and a NUL for the size and mtime, an ASCII name padded
    with NULs, the checksum right) and leaves any other to ``frombuf``.
    """
    if block[100:124] != _PLAIN_FIXED or block[156:] != _PLAIN_TAIL:
        return None
    size, mtime = block[124:136], block[136:148]
    octal_11 = _octal_11()
    if not (octal_11.fullmatch(size) and octal_11.fullmatch(mtime)):
        return None
    if block[148:156] != b"%06o\0 " % (sum(block) - sum(block[148:156]) + _BLANK_CHECKSUM):
        return None
    name = block[:100].rstrip(b"\0")
    if not name or b"\0" in name or not name.isascii():
        return None
    import tarfile  # loaded by iter_members

    info = tarfile.TarInfo(name.decode("ascii"))
    info.size, info.mtime, info.mode, info.type = int(size[:11], 8), int(mtime[:11], 8), 0o644, tarfile.REGTYPE
    return info


def _header(reader: FrameReader, block: bytes, what: str) -> tarfile.TarInfo:
    plain = _plain_header(block)
    if plain is not None:
        return plain
    import tarfile  # loaded by iter_members

    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as exc:
        raise IntegrityError(f"{what} has a corrupt tar header: {exc}", hint="re-fetch or re-pack it") from exc


def iter_members(reader: FrameReader, what: str) -> Iterator[tarfile.TarInfo]:
    """Each member's header, with pax and GNU long-name overrides applied."""
    import tarfile  # here: only this, the pure-Python member loop, reads headers into TarInfo

    overrides: dict[str, str] = {}
    while True:
        block = reader.read_exact(BLOCK)
        if block == _ZERO_BLOCK:
            return
        info = _header(reader, block, what)
        if info.type in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME) and info.size > MAX_EXTENDED_HEADER:
            raise IntegrityError(
                f"{what} has a {info.size}-byte extended header", hint="the bundle is corrupt or hostile; re-pack it"
            )
        if info.type == tarfile.XHDTYPE:
            overrides.update(_pax_records(reader.read_exact(_padded(info.size)), what))
            continue
        if info.type == tarfile.GNUTYPE_LONGNAME:
            overrides["path"] = (
                reader.read_exact(_padded(info.size)).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            )
            continue
        if info.type in (tarfile.XGLTYPE, tarfile.GNUTYPE_LONGLINK):
            raise UnsafeArchive(f"{what} uses a tar feature bundles never contain (type {info.type!r})")
        if "path" in overrides:
            info.name = overrides["path"]
        if "size" in overrides:
            try:
                info.size = int(overrides["size"])
            except ValueError as exc:
                raise IntegrityError(f"{what} has a malformed pax size") from exc
        overrides = {}
        yield info


def read_data(reader: FrameReader, size: int, what: str) -> Iterator[memoryview]:
    """The ``size`` data bytes of the current member in chunks, then its padding skipped."""
    left = size
    while left:
        view = reader.read(min(left, CHUNK_SIZE))
        if not view:
            raise IntegrityError(f"{what} is truncated inside a member", hint="re-fetch or re-pack it")
        left -= len(view)
        yield view
    reader.skip(_padded(size) - size)
