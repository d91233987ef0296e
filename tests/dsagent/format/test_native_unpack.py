"""The optional native unpack loop writes what the pure-Python loop writes, and refuses what it refuses.

Every hostile bundle here is unpacked by both loops into fresh targets: the same error
class and message, and nothing of the bundle left behind; every good bundle gives the
same files, bytes and mtimes. The extension is built as for ``test_native.py`` (skipped,
saying why, without a C compiler).
"""

from __future__ import annotations

import os
import random
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import zstandard

from dsagent.errors import DsagentError
from dsagent.format import native
from dsagent.format.bundles import extract
from dsagent.format.bundles.bundle import pack, unpack, unpack_bundle
from dsagent.format.hashing import CHUNK_SIZE
from dsagent.format.manifest import Manifest, bundle_path
from tests.dsagent.conftest import write_tree
from tests.dsagent.format import test_native
from tools.fuzz.native_unpack import mutations

extension = test_native.extension  # the fixtures that build or find the extension
with_native = test_native.with_native

pytestmark = pytest.mark.slow  # builds the extension with the C compiler where it is not built

FILES = {
    "a/empty.bin": b"",
    "a/one.bin": b"1",
    "a/block.bin": bytes(range(256)) * 2,
    "a/block-plus.bin": os.urandom(513),
    "b/chunks.bin": os.urandom(3 * CHUNK_SIZE + 5),
    "b/text.txt": b"hello world\n" * 5000,
    "c/" + "long-" * 30 + ".bin": b"a name over 100 bytes: a pax header",
    "c/caf\u00e9.bin": b"a non-ASCII name: a pax header",
    "c/empty-too.bin": b"",
}
FILES.update({f"d/{i:04d}.bin": random.Random(i).randbytes(random.Random(i).randint(0, 3000)) for i in range(300)})


def _files(root: Path) -> dict[str, tuple[bytes, int]]:
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Manifest]:
    base = tmp_path_factory.mktemp("packed")
    src = write_tree(base / "src", FILES)
    store = base / "store"
    return src, store, pack(src, store, name="d")


@pytest.mark.parametrize("piece", [CHUNK_SIZE, 333, 512, 7])
def test_both_loops_unpack_the_same_tree(
    packed: tuple[Path, Path, Manifest], tmp_path: Path, with_native: ModuleType, piece: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    src, store, manifest = packed
    monkeypatch.setattr(native, "CHUNK_SIZE", piece)  # headers and data cut across the buffers fed
    counted: dict[bool, list[int]] = {True: [0, 0], False: [0, 0]}
    for use in (False, True):

        def progress(nbytes: int, files: int, use: bool = use) -> None:
            counted[use][0] += nbytes
            counted[use][1] += files

        unpack(store, name="d", dest=tmp_path / str(use), native=use, progress=progress, workers=1)
    assert _files(tmp_path / "True") == _files(tmp_path / "False")
    assert {k: v[0] for k, v in _files(tmp_path / "True").items()} == {k: v[0] for k, v in _files(src).items()}
    assert counted[True] == counted[False] == [sum(e.size for e in manifest.entries), manifest.file_count]


def test_plain_members_never_reach_the_python_loop(
    tmp_path: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {k: v for k, v in FILES.items() if not k.startswith("c/")}  # short ASCII names: plain headers
    store = tmp_path / "store"
    pack(write_tree(tmp_path / "src", files), store, name="d")
    steps: list[int | None] = []
    one = extract._Members.one

    def counted(self: extract._Members) -> int | None:
        steps.append(one(self))
        return steps[-1]

    monkeypatch.setattr(extract._Members, "one", counted)
    unpack(store, name="d", dest=tmp_path / "native", native=True)
    assert steps == []
    unpack(store, name="d", dest=tmp_path / "pure", native=False)
    assert len(steps) == len(files) + 1  # each member, then the end of the archive


def test_asking_for_the_native_loop_without_it_fails(
    packed: tuple[Path, Path, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, store, _ = packed
    monkeypatch.setattr(native, "AVAILABLE", False)
    with pytest.raises(RuntimeError, match="make native"):
        unpack(store, name="d", dest=tmp_path / "out", native=True)


# --------------------------------------------------------------------------- hostile bundles

SMALL = {"train/a.jpg": b"A" * 3000, "train/b.jpg": b"B" * 700, "train/c.jpg": b"", "val/d.jpg": b"D" * 1500}


def _member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, linkname: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    info.linkname = linkname
    block = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    return block + data + bytes(-len(data) % 512)


def _legit(files: dict[str, bytes] = SMALL) -> list[bytes]:
    return [_member(path, data) for path, data in sorted(files.items())]


_END = bytes(1024)


def _corrupt_checksum(members: list[bytes]) -> list[bytes]:
    bad = bytearray(members[1])
    bad[5] ^= 0x01  # the name changes, the checksum does not
    return [members[0], bytes(bad), *members[2:]]


def _gnu(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape") + data + bytes(-len(data) % 512)


#: tar streams (before zstd) for the bundle of SMALL
HOSTILE: dict[str, Callable[[], bytes]] = {
    "absolute path": lambda: b"".join([_member("/tmp/dsagent-evil-abs", b"x"), *_legit(), _END]),
    "dot-dot path": lambda: b"".join([_member("../evil", b"x"), *_legit(), _END]),
    "dot-dot inside": lambda: b"".join([*_legit()[:1], _member("train/../../evil", b"x"), *_legit()[1:], _END]),
    "symlink": lambda: b"".join([_member("train/a.jpg", kind=tarfile.SYMTYPE, linkname="/etc"), *_legit()[1:], _END]),
    "hard link": lambda: b"".join([*_legit()[:2], _member("train/c.jpg", kind=tarfile.LNKTYPE, linkname="x"), _END]),
    "character device": lambda: b"".join([*_legit()[:1], _member("train/b.jpg", kind=tarfile.CHRTYPE), _END]),
    "fifo": lambda: b"".join([*_legit()[:3], _member("val/d.jpg", kind=tarfile.FIFOTYPE), _END]),
    "directory member": lambda: b"".join([*_legit()[:1], _member("train", kind=tarfile.DIRTYPE), *_legit()[1:], _END]),
    "renamed member": lambda: b"".join(
        [*_legit()[:1], _member("train/x.jpg", SMALL["train/b.jpg"]), *_legit()[2:], _END]
    ),
    "unlisted extra member": lambda: b"".join([*_legit(), _member("val/zzz.jpg", b"z"), _END]),
    "duplicate member": lambda: b"".join([*_legit()[:2], _member("train/a.jpg", SMALL["train/a.jpg"]), _END]),
    "duplicate after out of order": lambda: b"".join([*_legit()[1:3], *_legit(), _END]),
    "missing member": lambda: b"".join([*_legit()[:-1], _END]),
    "size mismatch": lambda: b"".join([*_legit()[:1], _member("train/b.jpg", b"B" * 701), *_legit()[2:], _END]),
    "size mismatch, empty": lambda: b"".join([*_legit()[:2], _member("train/c.jpg", b"c"), *_legit()[3:], _END]),
    "digest mismatch": lambda: b"".join([*_legit()[:1], _member("train/b.jpg", b"b" * 700), *_legit()[2:], _END]),
    "digest mismatch, last": lambda: b"".join([*_legit()[:3], _member("val/d.jpg", b"d" * 1500), _END]),
    "header checksum": lambda: b"".join([*_corrupt_checksum(_legit()), _END]),
    "truncated inside data": lambda: b"".join(_legit())[: 512 + 1000],
    "truncated inside a header": lambda: b"".join(_legit())[: 512 + 3072 + 100],
    "truncated inside padding": lambda: b"".join(_legit())[: 512 + 3000 + 20],
    "truncated at a member's end": lambda: b"".join(_legit()),
    # the pure loop reads a member's padding before it compares the digest: cut, not corrupt
    "digest mismatch, cut in its padding": lambda: b"".join([*_legit()[:1], _member("train/b.jpg", b"b" * 700)])[
        : 512 + 3072 + 512 + 700 + 100
    ],
    "data after the end": lambda: b"".join([*_legit(), _END, b"x" * 10]),
    "global pax header": lambda: b"".join(
        [tarfile.TarInfo().create_pax_global_header({"comment": "x"}), *_legit(), _END]
    ),
}
#: streams both loops accept: members out of order, pax and GNU headers for plain names
GOOD: dict[str, Callable[[], bytes]] = {
    "in order": lambda: b"".join([*_legit(), _END]),
    "out of order": lambda: b"".join([*reversed(_legit()), _END]),
    "one pair swapped": lambda: b"".join([*_legit()[:1], _legit()[2], _legit()[1], *_legit()[3:], _END]),
    "gnu format header": lambda: b"".join([*_legit()[:1], _gnu(*sorted(SMALL.items())[1]), *_legit()[2:], _END]),
    "end padding": lambda: b"".join([*_legit(), _END, bytes(8192)]),
}


@pytest.fixture
def small(tmp_path: Path) -> tuple[Path, Manifest]:
    store = tmp_path / "store"
    manifest = pack(write_tree(tmp_path / "src", SMALL), store, name="d")
    assert len(manifest.bundles) == 1
    return store, manifest


def _replace_bundle(store: Path, manifest: Manifest, tar: bytes) -> None:
    Path(bundle_path(str(store), manifest.bundles[0].digest)).write_bytes(
        zstandard.ZstdCompressor(write_checksum=True).compress(tar)
    )


#: the C loop's writers: the calling thread alone, and a pool that writes the members whole
#: in a buffer (native/unpackloop.c)
WRITERS = [1, 4]


def _outcome(store: Path, manifest: Manifest, target: Path, use: bool, writers: int = 1) -> tuple[str, str]:
    target.mkdir()
    (target / "kept").write_bytes(b"k")
    try:
        unpack_bundle(store, manifest, manifest.bundles[0], target, native=use, writers=writers)
    except DsagentError as exc:
        assert sorted(os.listdir(target)) == ["kept"]  # nothing of the bundle, no staging left
        return type(exc).__name__, str(exc)
    return "ok", repr({k: v for k, v in _files(target).items() if k != "kept"})


def _dataset_outcome(store: Path, where: Path, use: bool) -> tuple[str, str]:
    """:func:`unpack` of the whole dataset (files written in place in its private stage)."""
    where.mkdir()
    try:
        unpack(store, name="d", dest=where / "out", native=use, workers=1)
    except DsagentError as exc:
        assert os.listdir(where) == []  # no target, no stage left
        return type(exc).__name__, str(exc).replace(str(where), "WHERE")
    return "ok", repr(_files(where / "out"))


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_both_loops_refuse_a_hostile_dataset_alike(
    kind: str, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    store, manifest = small
    _replace_bundle(store, manifest, HOSTILE[kind]())
    pure = _dataset_outcome(store, tmp_path / "pure", False)
    assert pure[0] in ("UnsafeArchive", "IntegrityError"), pure
    assert _dataset_outcome(store, tmp_path / "native", True) == pure


@pytest.mark.parametrize("writers", WRITERS)
@pytest.mark.parametrize("piece", [CHUNK_SIZE, 100])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_both_loops_refuse_a_hostile_bundle_alike(
    kind: str, piece: int, writers: int, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    store, manifest = small
    monkeypatch.setattr(native, "CHUNK_SIZE", piece)
    _replace_bundle(store, manifest, HOSTILE[kind]())
    pure = _outcome(store, manifest, tmp_path / "pure", False)
    assert pure[0] in ("UnsafeArchive", "IntegrityError"), pure
    assert _outcome(store, manifest, tmp_path / "native", True, writers) == pure
    assert not Path("/tmp/dsagent-evil-abs").exists()
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_both_loops_accept_what_the_pure_loop_accepts(
    kind: str, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    store, manifest = small
    _replace_bundle(store, manifest, GOOD[kind]())
    pure = _outcome(store, manifest, tmp_path / "pure", False)
    assert pure[0] == "ok", pure
    assert _outcome(store, manifest, tmp_path / "native", True) == pure
    assert _dataset_outcome(store, tmp_path / "dataset-native", True)[0] == "ok"


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.99])
def test_a_cut_bundle_object_is_refused_alike(
    keep: float, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    store, manifest = small
    path = Path(bundle_path(str(store), manifest.bundles[0].digest))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    pure = _outcome(store, manifest, tmp_path / "pure", False)
    assert pure[0] == "IntegrityError", pure
    assert _outcome(store, manifest, tmp_path / "native", True) == pure


def test_the_unpacker_refuses_columns_that_do_not_match(with_native: ModuleType) -> None:
    from dsagent.format.tarstream import plain_template

    with pytest.raises(ValueError, match="one item per name"):
        with_native.Unpacker(0, [b"a", b"b"], bytes(8), bytes(16), bytes(32), plain_template())
    with pytest.raises(ValueError, match="512-byte"):
        with_native.Unpacker(0, [b"a"], bytes(8), bytes(8), bytes(16), b"x")
    with pytest.raises(TypeError, match="bytes"):
        with_native.Unpacker(0, ["a"], bytes(8), bytes(8), bytes(16), plain_template())


@pytest.mark.parametrize("writers", WRITERS)
def test_a_write_the_disk_refuses_fails_alike_and_leaves_nothing(
    writers: int, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    import resource
    import signal

    store, manifest = small
    outcomes = []
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        for use in (False, True):
            target = tmp_path / str(use)
            target.mkdir()
            resource.setrlimit(resource.RLIMIT_FSIZE, (2000, old_limit[1]))  # train/a.jpg has 3000 bytes
            try:
                with pytest.raises(DsagentError) as caught:
                    unpack_bundle(store, manifest, manifest.bundles[0], target, native=use, writers=writers)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
            assert os.listdir(target) == []
            outcomes.append((type(caught.value).__name__, "File too large" in str(caught.value)))
    finally:
        signal.signal(signal.SIGXFSZ, old_handler)
    assert outcomes[0] == outcomes[1] == (outcomes[0][0], True)


@pytest.mark.parametrize("writers", WRITERS)
@pytest.mark.parametrize("seed", range(4))
def test_both_loops_agree_on_randomly_damaged_streams(
    seed: int, writers: int, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    """A small differential fuzz: bytes of a good tar stream changed, cut, dropped or repeated
    (headers first: that is where the C parser decides), both loops give the same outcome
    through a bundle in a store (``tools/fuzz/native_unpack.py`` feeds them streams)."""
    store, manifest = small
    damaged = mutations(random.Random(seed), b"".join([*_legit(), _END]))  # the fuzzer's own damage
    for case in range(25):
        data = next(damaged)
        _replace_bundle(store, manifest, data)
        where = tmp_path / f"{case}"
        where.mkdir()
        pure = _outcome(store, manifest, where / "pure", False)
        assert _outcome(store, manifest, where / "native", True, writers) == pure, data


# --------------------------------------------------------------------------- the C object's contract


def _columns(manifest: Manifest) -> tuple[list[str], dict[str, object]]:
    """The bundle's paths, and the Unpacker's other arguments, by keyword."""
    from dsagent.format.entries import EntryTable
    from dsagent.format.tarstream import plain_template

    members = EntryTable.of(manifest.bundle_entries(manifest.bundles[0]))
    return list(members.paths), {
        "sizes": members.sizes, "mtimes": members.mtimes, "digests": members.digests, "template": plain_template(),
    }  # fmt: skip


def _feed_all(loop: object, tar: bytes) -> tuple[int, int]:
    used, status, _, _ = loop.feed(tar)  # type: ignore[attr-defined]
    return used, status


@pytest.mark.parametrize("by_name", [False, True])
def test_the_unpacker_takes_every_argument_by_keyword(
    by_name: bool, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    _, manifest = small
    paths, columns = _columns(manifest)
    target = tmp_path / "t"
    for path in paths:
        (target / path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        loop = with_native.Unpacker(dir_fd=fd, names=[p.encode() for p in paths], by_name=by_name, **columns)
        _, status = _feed_all(loop, b"".join([*_legit(), _END]))
    finally:
        os.close(fd)
    assert status == 2 and loop.next == len(paths)  # END, every member written
    written = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert written == (sorted(paths) if by_name else [str(i) for i in range(len(paths))])


def test_the_unpacker_and_the_reader_refuse_an_unknown_keyword(
    small: tuple[Path, Manifest], with_native: ModuleType
) -> None:
    from dsagent.format.tarstream import plain_template

    _, manifest = small
    paths, columns = _columns(manifest)
    names = [p.encode() for p in paths]
    with pytest.raises(TypeError, match="by_nmae"):
        with_native.Unpacker(0, names, **columns, by_nmae=True)
    with pytest.raises(TypeError):  # by_name twice: positionally and by keyword
        with_native.Unpacker(0, names, *columns.values(), True, by_name=True)
    reader = with_native.TarReader(dir_fd=0, members=[], template=plain_template(), header=lambda m: b"")
    assert reader.next == 0
    with pytest.raises(TypeError):  # an unknown keyword
        with_native.TarReader(0, [], plain_template(), lambda m: b"", headers=lambda m: b"")


def test_the_unpacker_owns_its_names(small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType) -> None:
    """The names are copied into a tuple the loop holds: a caller emptying (or refilling)
    its list cannot free a name the loop compares or creates files by."""
    _, manifest = small
    paths, columns = _columns(manifest)
    names = [p.encode() for p in paths]
    target = tmp_path / "t"
    target.mkdir()
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        loop = with_native.Unpacker(fd, names, **columns)
        names.clear()
        names.extend([b"x" * 100] * len(paths))  # what a freed name's memory might now hold
        _, status = _feed_all(loop, b"".join([*_legit(), _END]))
        tupled = with_native.Unpacker(fd, tuple(p.encode() for p in paths), **columns)  # any sequence
    finally:
        os.close(fd)
    assert status == 2 and loop.next == len(paths) and tupled.next == 0
    assert sorted(os.listdir(target)) == sorted(str(i) for i in range(len(paths)))


def _errors_alike(outcomes: list[tuple[str, str]], *where: Path) -> list[tuple[str, str]]:
    """The outcomes with each target's path (and a staging directory's random suffix) made
    the same, so two targets' messages can be compared."""
    import re

    same = []
    for kind, message in outcomes:
        for path in where:
            message = message.replace(str(path), "TARGET")
        same.append((kind, re.sub(r"(\.dsagent-staging/[0-9a-f]+)-[0-9a-f]{8}", r"\1-X", message)))
    return same


@pytest.mark.parametrize("writers", WRITERS)
def test_a_file_too_large_fails_alike_in_type_and_message(
    writers: int, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    import resource
    import signal

    store, manifest = small
    outcomes: list[tuple[str, str]] = []
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        for use in (False, True):
            target = tmp_path / str(use)
            target.mkdir()
            resource.setrlimit(resource.RLIMIT_FSIZE, (2000, old_limit[1]))  # train/a.jpg has 3000 bytes
            try:
                with pytest.raises(DsagentError) as caught:
                    unpack_bundle(store, manifest, manifest.bundles[0], target, native=use, writers=writers)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
            outcomes.append((type(caught.value).__name__, str(caught.value).replace(str(target), "TARGET")))
    finally:
        signal.signal(signal.SIGXFSZ, old_handler)
    assert outcomes[0] == outcomes[1], outcomes
    assert outcomes[0][0] == "CacheDiskError" and "[Errno 27] File too large)" in outcomes[0][1]


@pytest.mark.parametrize("writers", WRITERS)
def test_a_file_in_the_way_fails_alike_in_type_and_message(
    writers: int, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    """Written in place (no staging), a file already at a member's path: EEXIST from the
    create (O_EXCL), naming the path, on both paths."""
    store, manifest = small
    outcomes: list[tuple[str, str]] = []
    for use in (False, True):
        target = tmp_path / str(use)
        (target / "train").mkdir(parents=True)
        (target / "train" / "b.jpg").write_bytes(b"already here")
        with pytest.raises(DsagentError) as caught:
            unpack_bundle(store, manifest, manifest.bundles[0], target, native=use, in_place=True, writers=writers)
        outcomes.append((type(caught.value).__name__, str(caught.value).replace(str(target), "TARGET")))
    assert outcomes[0] == outcomes[1], outcomes
    assert "[Errno 17] File exists: 'TARGET/train/b.jpg'" in outcomes[0][1]


@pytest.mark.parametrize("code", ["ENOSPC", "EDQUOT", "EIO"])
@pytest.mark.parametrize("kind", ["open", "write"])
@pytest.mark.parametrize("at", [1, 3])
def test_a_full_disk_or_quota_fails_alike_in_type_and_message(
    code: str, kind: str, at: int, small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    """The fault injector's errors (tools/support/faults.py) at the Nth create or write of
    a file: the pure loop's through ``os``, the C loop's through its I/O hook."""
    from tools.support.faults import ERRNOS, Injector

    store, manifest = small
    outcomes: list[tuple[str, str]] = []
    hits: list[int] = []
    for use in (False, True):
        # the loops open other things in another order (the C loop's directory first): the
        # point is the Nth create or write of a member's file, wherever that falls
        dry = Injector(tmp_path / f"dry-{use}", kinds=(kind,))
        dry.root = os.path.realpath(tmp_path / f"dry-{use}") + "/"
        (tmp_path / f"dry-{use}").mkdir()
        with dry:
            unpack_bundle(store, manifest, manifest.bundles[0], tmp_path / f"dry-{use}", native=use, durable=False)
        files = [n for n, (_, path) in enumerate(dry.ops, 1) if path.rsplit("/", 1)[-1].isdigit()]
        target = tmp_path / str(use)
        target.mkdir()
        injector = Injector(target, at=files[at - 1], code=ERRNOS[code], kinds=(kind,))
        with injector, pytest.raises(DsagentError) as caught:
            unpack_bundle(store, manifest, manifest.bundles[0], target, native=use, durable=False)
        hits.append(injector.native_ops)
        assert os.listdir(target) == []  # nothing of the bundle, no staging left
        outcomes.append((type(caught.value).__name__, str(caught.value)))
    assert hits[0] == 0 and hits[1] >= at  # the C loop's own calls were the ones failed
    pure, c = _errors_alike(outcomes, tmp_path / "False", tmp_path / "True")
    assert pure == c, outcomes
    expected = "InsufficientSpace" if code in ("ENOSPC", "EDQUOT") else "CacheDiskError"
    assert outcomes[0][0] == expected


# --------------------------------------------------------------------------- the C loop's writers


def test_the_first_of_several_bad_members_in_a_batch_is_the_one_reported(
    small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    """Two members whose bytes do not match their digests, written at once by the pool: the
    error names the first in the bundle's order, as the pure loop's does, however the
    threads took them."""
    store, manifest = small
    path = Path(bundle_path(str(store), manifest.bundles[0].digest))
    tar = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    tar = tar.replace(b"B" * 700, b"X" * 700).replace(b"D" * 1500, b"Y" * 1500)
    _replace_bundle(store, manifest, tar)
    pure = _outcome(store, manifest, tmp_path / "pure", False)
    assert pure[0] == "IntegrityError" and "'train/b.jpg' does not match its digest" in pure[1], pure
    for attempt in range(5):
        assert _outcome(store, manifest, tmp_path / f"native-{attempt}", True, 4) == pure


def test_members_whole_in_a_buffer_are_written_on_several_threads(tmp_path: Path, with_native: ModuleType) -> None:
    files = {f"c{i % 4}/{i:03d}.jpg": os.urandom(200 + i) for i in range(64)}
    store = tmp_path / "store"
    manifest = pack(write_tree(tmp_path / "src", files), store, name="d")
    threads: set[int] = set()

    def slow_creates(kind: str, fd: int, name: bytes | None) -> None:
        if kind == "open":
            threads.add(threading.get_ident())
            time.sleep(0.001)  # a slow disk: the pool's workers take the batch's later members

    (tmp_path / "out").mkdir()
    with_native.set_io_hook(slow_creates)
    try:
        unpack_bundle(store, manifest, manifest.bundles[0], tmp_path / "out", writers=4)
    finally:
        with_native.set_io_hook(None)
    assert len(threads) >= 2
    assert {k: v[0] for k, v in _files(tmp_path / "out").items()} == files


def test_the_unpacker_refuses_writers_it_cannot_have(small: tuple[Path, Manifest], with_native: ModuleType) -> None:
    paths, columns = _columns(small[1])
    for writers in (0, -1, 65):
        with pytest.raises(ValueError, match="writers must be 1 to 64"):
            with_native.Unpacker(0, [p.encode() for p in paths], writers=writers, **columns)


def test_no_writer_thread_outlives_a_failed_unpack(
    small: tuple[Path, Manifest], tmp_path: Path, with_native: ModuleType
) -> None:
    """The error keeps its traceback, and so the C object, alive: its writing threads ended
    anyway (a process that forks later must not fork without them)."""
    store, manifest = small
    path = Path(bundle_path(str(store), manifest.bundles[0].digest))
    tar = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    _replace_bundle(store, manifest, tar.replace(b"B" * 700, b"X" * 700))
    before = _pool_threads()
    (tmp_path / "out").mkdir()
    with pytest.raises(DsagentError) as caught:
        unpack_bundle(store, manifest, manifest.bundles[0], tmp_path / "out", writers=4)
    assert caught.value.__traceback__ is not None
    assert _pool_threads_settled(before) == before


def _pool_threads_settled(expected: int, bound_s: float = 5.0) -> int:
    """:func:`_pool_threads`, read again until it is ``expected`` or ``bound_s`` has passed: the
    kernel wakes a thread's joiner as the thread exits, a moment before it takes the thread
    out of the process's list (seen under AddressSanitizer). A thread still there after the
    bound was never stopped."""
    deadline = time.monotonic() + bound_s
    count = _pool_threads()
    while count != expected and time.monotonic() < deadline:
        time.sleep(0.01)
        count = _pool_threads()
    return count


def _pool_threads() -> int:
    """This process's threads of the native loops' pools (each names itself: pool.c), and
    not whatever other threads the test process has starting or ending meanwhile."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            count += Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "dsnative-pool"
        except FileNotFoundError:  # a thread that ended while listed
            continue
    return count


def test_a_hook_on_a_writer_thread_sees_its_files_and_the_standard_streams(
    tmp_path: Path, with_native: ModuleType, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each writer has a descriptor table of its own: a file it writes is found in that
    thread's table, and a report to stderr from it (a hook's, a sanitizer's) reaches stderr,
    not one of the files."""
    files = {f"c{i % 4}/{i:03d}.jpg": os.urandom(100 + i) for i in range(128)}
    store = tmp_path / "store"
    manifest = pack(write_tree(tmp_path / "src", files), store, name="d")
    out = tmp_path / "out"
    out.mkdir()
    written: list[str] = []

    def report(kind: str, fd: int, name: bytes | None) -> None:
        if kind == "write":
            written.append(os.readlink(f"/proc/thread-self/fd/{fd}"))
        os.write(2, b".")

    with_native.set_io_hook(report)
    try:
        unpack_bundle(store, manifest, manifest.bundles[0], out, writers=4)
    finally:
        with_native.set_io_hook(None)
    staged = f"{out}/{extract.STAGING_DIR}/"  # each file written under its index, renamed once all are
    assert len(set(written)) == len(files) and all(p.startswith(staged) for p in written), written[:4]
    assert {k: v[0] for k, v in _files(out).items()} == files
    assert capfd.readouterr().err.count(".") >= 2 * len(files)


def test_the_fault_injector_counts_every_create_and_write_of_the_writers(
    tmp_path: Path, with_native: ModuleType
) -> None:
    """The injector finds a writer's file in that thread's own descriptor table: every
    create and every write of the bundle is counted under the target, none lost."""
    from tools.support.faults import Injector

    files = {f"c{i % 4}/{i:03d}.jpg": os.urandom(100 + i) for i in range(256)}
    store = tmp_path / "store"
    manifest = pack(write_tree(tmp_path / "src", files), store, name="d")
    target = tmp_path / "out"
    target.mkdir()
    injector = Injector(target, kinds=("open", "write"))
    injector.root = os.path.realpath(target) + "/"
    with injector:
        unpack_bundle(store, manifest, manifest.bundles[0], target, writers=4, durable=False)
    members = [path for _, path in injector.ops if path.rsplit("/", 1)[-1].isdigit()]
    assert len(members) == 2 * len(files)  # a create and a write each
