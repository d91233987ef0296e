"""The optional native pack reader writes what the pure-Python reader writes, and refuses what it refuses.

The same trees are packed by both readers: the same manifests and the same bundle bytes
(one pass, digest then pack, one process or segments on forked ones). The C reader's
stream, taken a few bytes at a time, is the tar stream Python lays out. Files that changed,
grew or went are refused with the pure loop's error class and message. The extension is
built as for ``test_native.py`` (skipped, saying why, without a C compiler).
"""

from __future__ import annotations

import functools
import os
import random
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from dsagent.errors import DsagentError
from dsagent.format import native
from dsagent.format.bundles import bundle, packparallel
from dsagent.format.bundles.bundle import pack_dataset, write_bundles
from dsagent.format.bundles.packwriter import plain_header, tar_header, tar_stream
from dsagent.format.digester import build_manifest
from dsagent.format.hashing import CHUNK_SIZE
from dsagent.format.manifest import FileEntry, Manifest
from dsplatform import cores as cores_module
from tests.dsagent.conftest import write_tree
from tests.dsagent.format import test_native

extension = test_native.extension  # the fixtures that build or find the extension
with_native = test_native.with_native
tree = test_native.tree

pytestmark = pytest.mark.slow  # builds the extension with the C compiler where it is not built


def _both(monkeypatch: pytest.MonkeyPatch, run: Callable[[], object]) -> tuple[object, object]:
    """``run()`` with the pure reader, then with the native one (the fixture made it available)."""
    monkeypatch.setattr(native, "AVAILABLE", False)
    pure = run()
    monkeypatch.setattr(native, "AVAILABLE", True)
    return pure, run()


def _bundles(store: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (store / "bundles").iterdir()}


@pytest.mark.parametrize("cores", [1, 64])
@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_the_native_pack_writes_the_pure_packs_bytes(
    tree: Path, with_native: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int, cores: int
) -> None:
    monkeypatch.setattr(cores_module, "usable", lambda: cores)  # the cores left to each bundle read its files
    runs = iter(range(10))
    readers = []
    real = native.tar_reader
    monkeypatch.setattr(native, "tar_reader", lambda *args, **kw: readers.append(kw["threads"]) or real(*args, **kw))
    if processes > 1:  # segments on forked processes even for this small tree
        monkeypatch.setattr(bundle, "SEGMENT_MIN_BYTES", 1)
        monkeypatch.setattr(packparallel, "SEGMENT_MIN_BYTES", 1)
        monkeypatch.setattr(packparallel, "SEGMENT_MIN_FILES", 4)
        monkeypatch.setattr(bundle, "can_fork", lambda: True)

    def one_pass() -> tuple[Manifest, dict[str, bytes]]:
        store = tmp_path / f"one-{next(runs)}"
        manifest, _ = pack_dataset(tree, store, name="d", max_bytes=3 * CHUNK_SIZE, processes=processes)
        return manifest, _bundles(store)

    pure, fast = _both(monkeypatch, one_pass)
    assert pure == fast and readers, "the native reader did not run"
    assert (max(readers) > 1) == (cores > 1)  # a few bundles on 64 cores: each read on several threads
    manifest = build_manifest(tree, name="d")

    def digested() -> dict[str, bytes]:
        store = tmp_path / f"two-{next(runs)}"
        write_bundles(manifest, tree, store, max_bytes=3 * CHUNK_SIZE)
        return _bundles(store)

    pure_bundles, fast_bundles = _both(monkeypatch, digested)
    assert pure_bundles == fast_bundles and len(fast_bundles) > 2


def _thread_name(tid: str) -> str:
    """A thread's name (its ``comm``), "" once it has ended."""
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def _still_ours(tids: set[str]) -> set[str]:
    """Of ``tids``, the native loops' threads still there a second on (each names itself
    dsnative-...). A thread joined a moment ago can still be listed in /proc while the
    kernel finishes its exit (the join returns once its id is cleared, a little before its
    entry goes): only one that stays is one close() did not end."""
    ours = {t for t in tids if _thread_name(t).startswith("dsnative-")}
    for _ in range(100):
        ours = {t for t in ours if _thread_name(t)}
        if not ours:
            break
        time.sleep(0.01)
    return ours


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("size", [1, 7, 511, 512, 513, 4096, 1 << 20])
def test_the_c_stream_is_the_tar_stream_whatever_the_buffer(
    tree: Path, with_native: ModuleType, size: int, threads: int
) -> None:
    manifest = build_manifest(tree, name="d")
    entries = list(manifest.entries)
    if size < 512:
        entries = entries[:40]  # byte by byte: a few members are enough
    assert not all(map(plain_header, entries)), "the tree needs members with pax headers"
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        tasks = set(os.listdir("/proc/self/task"))
        reader = native.tar_reader(root, entries, tar_header, threads=threads)
        out, buffer = bytearray(), bytearray(size)
        while True:
            written, status, _, _ = reader.fill(memoryview(buffer))
            out += buffer[:written]
            if status == native.FILL_DONE:
                break
            assert status == native.FILL_MORE and written == size
        reader.close()
        # no reading thread outlives close(): none of the threads new since the reader was made
        # still runs as one of ours (each names itself dsnative-...; a gRPC or zstd thread
        # another test of this process left running is not the reader's)
        new = set(os.listdir("/proc/self/task")) - tasks
        assert not _still_ours(new)
    finally:
        os.close(root)
    assert bytes(out) + bytes(1024) == b"".join(tar_stream(tree, entries))
    raw = reader.digests
    assert [raw[i : i + 16].hex() for i in range(0, len(raw), 16)] == [e.digest for e in entries]


def _error(run: Callable[[], object]) -> tuple[type, str]:
    with pytest.raises(DsagentError) as caught:
        run()
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("change", ["rewritten", "grown", "shrunk", "removed"])
def test_a_changed_file_is_refused_as_the_pure_reader_refuses_it(
    with_native: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, threads: int
) -> None:
    monkeypatch.setattr(native, "spare_cores", lambda at_once: threads)
    files = {f"c{i % 3}/{i:03d}.jpg": os.urandom(100 + 997 * i) for i in range(30)}
    src = write_tree(tmp_path / "src", files)
    manifest = build_manifest(src, name="d")
    victim = src / "c1/013.jpg"
    if change == "rewritten":
        victim.write_bytes(bytes(255 - b for b in victim.read_bytes()))
    elif change == "grown":
        victim.write_bytes(victim.read_bytes() + b"more")
    elif change == "shrunk":
        victim.write_bytes(victim.read_bytes()[:-5])
    else:
        victim.unlink()
    runs = iter(range(10))
    pure, fast = _both(monkeypatch, lambda: _error(lambda: write_bundles(manifest, src, tmp_path / f"s{next(runs)}")))
    assert pure == fast
    assert "c1/013.jpg" in fast[1]


def test_a_file_rewritten_while_a_one_pass_pack_reads_it_is_refused(
    with_native: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tree(tmp_path / "src", {"a.jpg": b"a" * 100, "b.jpg": b"b" * 5000, "c.jpg": b"c" * 10})
    real = native.tar_reader

    def rewriting(dir_fd: int, members: object, header: object, **kw: int) -> object:
        path = src / "b.jpg"  # listed with its size and mtime; rewritten before it is read
        st = path.stat()
        path.write_bytes(b"B" * 5000)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        return real(dir_fd, members, header, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "tar_reader", rewriting)
    with pytest.raises(DsagentError, match="'b.jpg' changed while it was packed"):
        pack_dataset(src, tmp_path / "store", name="d")
    assert list((tmp_path / "store" / "bundles").iterdir()) == []


def test_the_c_reader_refuses_malformed_members(with_native: ModuleType) -> None:
    from dsagent.format.tarstream import plain_template

    def header(member: object) -> bytes:
        return tar_header(member)  # type: ignore[arg-type]

    one = FileEntry("a", 1, 0, "")
    with pytest.raises(ValueError, match="512-byte"):
        with_native.TarReader(0, [one], b"x" * 100, header)
    with pytest.raises(TypeError, match="callable"):
        with_native.TarReader(0, [one], plain_template(), None)
    with pytest.raises(TypeError, match="tuple"):
        with_native.TarReader(0, [("a", 1, 0)], plain_template(), header)
    with pytest.raises(TypeError, match="str"):
        with_native.TarReader(0, [(b"a", 1, 0, "")], plain_template(), header)
    with pytest.raises(ValueError, match="NUL"):
        with_native.TarReader(0, [FileEntry("a\0b", 1, 0, "")], plain_template(), header)
    with pytest.raises(OverflowError):
        with_native.TarReader(0, [FileEntry("a", -1, 0, "")], plain_template(), header)
    for digest in ("0" * 31, "g" * 32, "0" * 33, "\u00e9" * 32):
        with pytest.raises(ValueError, match="32 lowercase hex"):
            with_native.TarReader(0, [FileEntry("a", 1, 0, digest)], plain_template(), header)
    with pytest.raises(ValueError, match="512-byte blocks"):
        with_native.TarReader(0, [FileEntry("x" * 101, 1, 0, "")], plain_template(), lambda m: b"short")
    with pytest.raises(ZeroDivisionError):  # the header's own error, as raised
        with_native.TarReader(0, [FileEntry("\u00e9", 1, 0, "")], plain_template(), lambda m: 1 // 0)


def test_the_c_reader_asks_for_the_headers_python_writes_and_no_others(with_native: ModuleType) -> None:
    from dsagent.format.tarstream import plain_template

    members = [
        FileEntry("plain/a.jpg", 1, 10**18, "0" * 32),
        FileEntry("x" * 100, 1, 0, ""),
        FileEntry("x" * 101, 1, 0, ""),
        FileEntry("caf\u00e9.jpg", 1, 0, ""),
        FileEntry("big", 8**11, 0, ""),
        FileEntry("old", 1, -1, ""),
        FileEntry("late", 1, 8**11 * 10**9, ""),
    ]
    asked: list[str] = []

    def header(member: FileEntry) -> bytes:
        asked.append(member.path)
        return tar_header(member)

    with_native.TarReader(0, members, plain_template(), header)
    expected = ["x" * 101, "caf\u00e9.jpg", "big", "old", "late"]
    assert asked == [m.path for m in members if not plain_header(m)] == expected


def test_the_native_listing_is_the_pure_listing(
    tree: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsagent.format.storage import LocalFiles
    from dsagent.format.walk import list_files

    elsewhere = write_tree(tree.parent / "elsewhere", {"er/est/x.bin": b"x"})
    os.symlink(elsewhere, tree / "linked-dir")  # a linked directory is walked as one
    calls = []
    real = native.list_dirs
    monkeypatch.setattr(native, "list_dirs", lambda *args: calls.extend(args[0]) or real(*args))
    empty: list[list[str]] = []
    pure, fast = _both(monkeypatch, lambda: list_files(LocalFiles(), str(tree), empty.append([]) or empty[-1]))
    assert len(calls) > 3  # every directory read natively
    assert list(fast) == list(pure)  # path, location, size, mtime, inode and ctime, through symlinks too
    assert (fast.paths, fast.sizes, fast.mtimes) == (pure.paths, pure.sizes, pure.mtimes)  # the pack's columns
    assert "linked-dir/er/est/x.bin" in [f.path for f in fast]
    assert type(fast[0]) is type(pure[0])  # noqa: E721 - the walk's named tuple, not a plain one
    assert empty[0] and sorted(empty[1]) == sorted(empty[0])


@pytest.mark.parametrize(
    ("plant", "refusal"),
    [
        (lambda root: os.symlink(root, root / "d" / "loop"), "directory loop"),
        (lambda root: os.symlink(root / "nowhere", root / "d" / "dangling"), "broken symlink"),
        (lambda root: os.mkfifo(root / "d" / "pipe"), "not a regular file"),
    ],
)
def test_the_native_listing_refuses_what_the_walk_refuses(
    tmp_path: Path, with_native: ModuleType, plant: Callable[[Path], None], refusal: str
) -> None:
    from dsagent.errors import InvalidInput
    from dsagent.format.storage import LocalFiles
    from dsagent.format.walk import list_files

    root = write_tree(tmp_path / "src", {"d/a.bin": b"a"})
    plant(root)
    with pytest.raises(InvalidInput, match=refusal):
        list_files(LocalFiles(), str(root), [])


def test_the_native_listing_confines_symlinks(tmp_path: Path, with_native: ModuleType) -> None:
    from dsagent.errors import InvalidInput
    from dsagent.format.walk import list_local

    outside = write_tree(tmp_path / "outside", {"secret": b"s"})
    root = write_tree(tmp_path / "src", {"d/a.bin": b"a"})
    os.symlink(outside / "secret", root / "d" / "secret")
    with pytest.raises(InvalidInput, match="outside the allowed"):
        list_local(str(root), [], confine=[str(root)])
    listed = list_local(str(root), [], confine=[str(root), str(outside)])
    assert sorted(f.path for f in listed) == ["d/a.bin", "d/secret"]


def test_list_dirs_hands_back_what_is_not_a_regular_file(tmp_path: Path, with_native: ModuleType) -> None:
    root = write_tree(tmp_path / "src", {"b.bin": b"bb", "a.bin": b"a", "sub/c": b"c"})
    os.symlink(root / "a.bin", root / "link")
    os.symlink(root / "sub", root / "linked-sub")
    latin = os.fsdecode(b"caf\xe9.bin")  # not UTF-8: decoded as os.fsdecode does
    (root / latin).write_bytes(b"x")
    [top, sub] = native.list_dirs([str(root), str(root / "sub")], ["p/", "p/sub/"])
    paths, stats, dirs, others, entries, device, inode = top
    assert paths == ["p/a.bin", "p/b.bin", f"p/{latin}"]  # in byte order of the names
    numbers = array("q", stats)
    assert len(numbers) == 4 * len(paths)
    st = os.stat(root / "b.bin")
    assert list(numbers[4:8]) == [2, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
    assert dirs == ["sub"]  # a directory by d_type; a link to one is the caller's to judge
    assert sorted(others) == ["link", "linked-sub"] and entries == 6
    assert (device, inode) == (os.stat(root).st_dev, os.stat(root).st_ino)
    assert sub[0] == ["p/sub/c"] and sub[4] == 1 and sub[6] == os.stat(root / "sub").st_ino
    with pytest.raises(FileNotFoundError, match="gone"):
        native.list_dirs([str(root), str(root / "gone")], ["", "gone/"])
    with pytest.raises(ValueError, match="one prefix"):
        native.list_dirs([str(root)], [])


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=300_000), min_size=1, max_size=4),
    block=st.sampled_from([4096, 128 << 10]),
    shape=st.sampled_from([(64, 32), (4, 1024), (2, 1)]),
)
def test_the_c_samples_are_the_python_samples(
    extension: ModuleType, sizes: list[int], block: int, shape: tuple[int, int]
) -> None:
    from dsagent.format.bundles import frames

    view = memoryview(random.Random(sum(sizes)).randbytes(sum(sizes)))
    pieces, piece = shape
    python = [frames._cut(view[s : s + block], pieces, piece) for s in range(0, len(view), block)]
    assert extension.block_samples(view, block, pieces, piece) == b"".join(python)


@given(
    records=st.lists(
        st.tuples(st.integers(min_value=0, max_value=512), st.sampled_from([b"x", b"\0"])), min_size=0, max_size=80
    ),
    tail=st.integers(min_value=0, max_value=511),
)
def test_the_c_zero_runs_and_rle_frames_are_the_python_ones(
    extension: ModuleType, records: list[tuple[int, bytes]], tail: int
) -> None:
    from dsagent.format.bundles import frames

    # records of some filled bytes then zeros (a tail), whole records of zeros among them
    data = b"".join(fill * (512 - zeros) + bytes(zeros) for zeros, fill in records) + b"y" * tail
    view = memoryview(data)
    python_tails = [0] * -(-len(data) // 4096)
    for start, end in frames.zero_runs(view):
        for at in range(start, end):
            python_tails[at // 4096] += 1
    assert list(array("q", extension.zero_tails(view, 4096, frames.RLE_MIN))) == python_tails
    native_frame = extension.rle_frame(view, frames.RLE_MIN)
    assert zstandard.ZstdDecompressor().decompressobj().decompress(native_frame) == data
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "AVAILABLE", False)
        assert frames.rle_frame(view) == native_frame


def test_the_frame_rules_hold_with_the_c_loops(with_native: ModuleType) -> None:
    from tests.dsagent.format.test_frames import check_the_framing_costs_no_zstd, check_zero_runs_and_rle_blocks

    check_the_framing_costs_no_zstd()  # the samples, zero runs and RLE frames made in C
    check_zero_runs_and_rle_blocks()


def test_the_c_samples_refuse_pieces_that_do_not_fit(extension: ModuleType) -> None:
    with pytest.raises(ValueError, match="two pieces or more"):
        extension.block_samples(b"x" * 10, 4096, 1, 32)
    with pytest.raises(ValueError, match="two pieces or more"):
        extension.block_samples(b"x" * 10, 64, 4, 32)
    assert extension.block_samples(b"", 4096, 64, 32) == b""
    with pytest.raises(ValueError, match="whole 512-byte records"):
        extension.zero_tails(b"x" * 10, 1000, 64)
    with pytest.raises(ValueError, match="positive least run"):
        extension.rle_frame(b"x" * 10, 0)


def test_a_listing_is_its_found_tuples_in_path_order(tmp_path: Path) -> None:
    from dsagent.format.walk import Found, Listing

    found = [Found("b", "/s/b", 2, 20, 200, 2000), Found("a/c", "/s/a/c", 1, 10, 100, 1000)]
    listing = Listing.of(found)
    assert list(listing) == found and listing[1] == found[1] and listing[:1] == found[:1]
    ordered = listing.in_path_order()
    assert list(ordered) == sorted(found) and ordered.paths == ["a/c", "b"] and ordered.sizes == [1, 2]
    local = Listing(["a/c", "b"], [1, 2], [10, 20], [100, 200], [1000, 2000], base="/s/")
    assert local.in_path_order() is local  # already sorted: no copy
    assert list(local) == sorted(found) and type(local[0]) is Found


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=()) | st.sampled_from('"\\\n\x00\x1f\x7f'))


@given(
    rows=st.lists(
        st.tuples(
            _TEXT | st.sampled_from(["caf\udce9.jpg", "\udcff"]),  # surrogates: handed back to Python
            st.integers(min_value=0, max_value=2**64 - 1),
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
            st.binary(min_size=16, max_size=16),
        ),
        max_size=20,
    )
)
def test_the_native_manifest_lines_are_the_python_lines(
    extension: ModuleType, rows: list[tuple[str, int, int, bytes]]
) -> None:
    from dsagent.format.manifest import EntryTable, _entry_line

    table = EntryTable(
        [r[0] for r in rows], array("Q", [r[1] for r in rows]), array("q", [r[2] for r in rows]),
        b"".join(r[3] for r in rows),
    )  # fmt: skip
    lines = extension.entry_lines(table.paths, table.sizes, table.mtimes, table.digests)
    if any("\udc80" <= c <= "\udcff" for r in rows for c in r[0]):
        assert lines is None
        return
    want = "".join(_entry_line(p, s, m, d.hex()) + "\n" for p, s, m, d in rows).encode()
    assert lines == want


_DAMAGE = st.sampled_from(list(b'"\\,[]-0 9aAf\x00\x1f\x7f\x80\xff\n'))


@given(
    rows=st.lists(
        st.tuples(
            _TEXT | st.sampled_from(["caf\udce9.jpg", "\udcff", "a\udcc3"]),  # surrogates: bytes not UTF-8
            st.integers(min_value=0, max_value=2**64 - 1) | st.sampled_from([0, 10**18, 10**19 - 1, 10**19]),
            st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.sampled_from([-1, 1795933368022222502]),
            st.binary(min_size=16, max_size=16),
        ),
        min_size=1,  # the reader hands on no empty batch
        max_size=12,
    ),
    damage=st.lists(
        st.tuples(st.integers(min_value=0), st.sampled_from(["put", "insert", "drop"]), _DAMAGE), max_size=3
    ),
)
def test_the_native_entry_columns_are_what_json_reads(
    extension: ModuleType, rows: list[tuple[str, int, int, bytes]], damage: list[tuple[int, str, int]]
) -> None:
    """The C parse of a batch of lines, as written and damaged: None (json's to parse), or
    the values json reads of a batch the reader's checks find well formed; every batch of
    lines as written whose paths need no escape is the C parse's."""
    from dsagent.format.manifest import _BodyChecks, _entry_line, _parse_batch

    lines = [_entry_line(p, s, m, d.hex()).encode("utf-8", "surrogateescape") for p, s, m, d in rows]
    for at, how, byte in damage:  # a line is never emptied: it holds more than 3 bytes
        line = bytearray(lines[at % len(lines)])
        if how == "insert":
            spot = at % (len(line) + 1)
            line[spot:spot] = bytes([byte])
        else:
            spot = at % len(line)
            line[spot : spot + 1] = b"" if how == "drop" else bytes([byte])
        lines[at % len(lines)] = bytes(line)
    columns = extension.entry_columns(lines)
    plain = all(not any(c in p for c in '"\\') and min(map(ord, p), default=32) >= 32 for p, _, _, _ in rows)
    if not damage and plain and all(s < 10**19 for _, s, _, _ in rows):
        assert columns is not None
    if columns is None:
        return
    paths, sizes, mtimes, digests = _parse_batch(lines)  # json reads it, without an error
    assert _BodyChecks().batch((paths, sizes, mtimes, digests))  # and the reader finds it well formed
    assert columns[0] == paths
    assert array("Q", columns[1]).tolist() == sizes and array("q", columns[2]).tolist() == mtimes
    assert columns[3] == bytes.fromhex("".join(digests))


def test_entry_columns_refuses_what_is_not_lines(extension: ModuleType) -> None:
    with pytest.raises(TypeError, match="list of bytes"):
        extension.entry_columns(("x",))
    with pytest.raises(TypeError, match="list of bytes"):
        extension.entry_columns(["x"])
    assert extension.entry_columns([]) == ([], b"", b"", b"")


@given(
    rows=st.lists(
        st.tuples(
            _TEXT | st.sampled_from(["caf\udce9.jpg", "\udcff"]),  # surrogates: handed back to Python
            st.integers(min_value=0, max_value=2**64 - 1),
            st.binary(min_size=16, max_size=16),
        ),
        max_size=20,
    )
)
def test_the_native_digest_records_are_the_python_records(
    extension: ModuleType, rows: list[tuple[str, int, bytes]]
) -> None:
    from dsagent.format.entries import _records

    paths, sizes, digests = [r[0] for r in rows], array("Q", [r[1] for r in rows]), b"".join(r[2] for r in rows)
    records = extension.digest_records(paths, sizes, digests)
    if any("\udc80" <= c <= "\udcff" for r in rows for c in r[0]):
        assert records is None
        return
    assert records == _records(paths, sizes, digests)


def test_digests_and_bundle_checks_are_the_same_either_way(
    tree: Path, tmp_path: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dataset and bundle digests, and a lying bundle index refused, with C records
    and with Python's; a block with a name that is not UTF-8 is Python's either way."""
    from dsagent.errors import IntegrityError
    from dsagent.format.manifest import BundleRef

    (tree / os.fsdecode(b"caf\xe9.bin")).write_bytes(b"x")
    store = tmp_path / "store"
    pack_dataset(tree, store, name="t", max_files=3)
    raw = (store / "t" / "manifest").read_bytes()
    pure, fast = _both(monkeypatch, lambda: Manifest.from_bytes(raw))
    assert fast == pure and len(fast.bundles) > 2  # type: ignore[attr-defined]
    manifest: Manifest = fast  # type: ignore[assignment]
    swapped = [manifest.bundles[1], manifest.bundles[0], *manifest.bundles[2:]]
    wrong = [BundleRef(b.digest if i != 1 else manifest.bundles[0].digest, b.first, b.count, b.size,
                       b.compressed_size) for i, b in enumerate(manifest.bundles)]  # fmt: skip
    resized = [manifest.bundles[0]._replace(size=manifest.bundles[0].size + 1), *manifest.bundles[1:]]
    for bad, message in ((swapped, "tile"), (wrong, "does not match"), (resized, "wrong payload size")):
        for available in (False, True):
            monkeypatch.setattr(native, "AVAILABLE", available)
            with pytest.raises(IntegrityError, match=message):
                manifest.with_bundles(bad)
            with pytest.raises(IntegrityError, match=message):
                Manifest.of_checked_layout("t", manifest.entries, directories=manifest.directories, bundles=bad)
    with pytest.raises(ValueError, match="16 of digest"):
        with_native.digest_records(["a"], array("Q", [1]), b"short")
    with pytest.raises(TypeError, match="must be str"):
        with_native.digest_records([b"a"], array("Q", [1]), bytes(16))


def test_a_manifest_encodes_to_the_same_bytes_either_way(
    tree: Path, tmp_path: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree / os.fsdecode(b"caf\xe9.bin")).write_bytes(b"x")  # not UTF-8: that block is Python's
    awkward = build_manifest(tree, name="t")
    plain = Manifest.create("t", [e for e in awkward.entries if e.path.isprintable()], directories=awkward.directories)
    made: list[bool] = []
    real = native.entry_lines
    monkeypatch.setattr(native, "entry_lines", lambda table: made.append(real(table) is not None) or real(table))
    for manifest in (awkward, plain):
        pure, fast = _both(monkeypatch, manifest.to_bytes)
        assert fast == pure
        assert Manifest.from_bytes(fast) == manifest
    assert made == [False, True]
    with pytest.raises(ValueError, match="16 of digest"):
        with_native.entry_lines(["a"], array("Q", [1]), array("q", [1]), b"short")
    with pytest.raises(TypeError, match="must be str"):
        with_native.entry_lines([b"a"], array("Q", [1]), array("q", [1]), bytes(16))


@pytest.mark.parametrize("seed", range(3))
def test_the_native_plan_is_the_python_plan(
    seed: int, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    from dsagent.format.bundles.bundle import plan_bundles
    from dsagent.format.manifest import FileEntry

    rng = random.Random(seed)
    calls = []
    real = native.plan_cuts
    monkeypatch.setattr(native, "plan_cuts", lambda *args: calls.append(1) or real(*args))
    for _ in range(200):
        n = rng.randint(0, 400)
        names = sorted({f"d{rng.randrange(9)}/{rng.randrange(10**6):06d}.jpg" for _ in range(n)})
        if rng.random() < 0.1:  # a name that is not UTF-8: the Python loop hashes it
            names = sorted([*names, os.fsdecode(b"d0/caf\xe9.jpg")])
        entries = [FileEntry(p, rng.choice([0, 1, rng.randrange(10**6)]), 0, "0" * 32) for p in names]
        max_files, max_bytes = rng.randint(1, 80), rng.choice([1, rng.randrange(1, 10**7), 2**70])
        plan = functools.partial(plan_bundles, entries, max_files, max_bytes)
        pure, fast = _both(monkeypatch, plan)
        assert fast == pure
    assert calls  # the C rule ran where a plan needed cuts
