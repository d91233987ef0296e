"""Manifests and digests: what a dataset is, whatever machine or walk order."""

from __future__ import annotations

import os
import random
from pathlib import Path

import fsspec
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from dsagent.errors import IntegrityError, InvalidInput, NotFound
from dsagent.format.digester import build_manifest
from dsagent.format.manifest import (
    CHUNK_SIZE,
    EntryTableBuilder,
    FileEntry,
    FileHasher,
    Manifest,
    dataset_digest,
    hash_file,
    read_manifest,
    read_manifest_header,
)
from tests.dsagent.conftest import AWKWARD_EMPTY_DIRS, AWKWARD_FILES

pytestmark = pytest.mark.usefixtures("native_mode")  # each test with the native loops and the pure ones


def _entry(path: str, data: bytes, mtime_ns: int = 0) -> FileEntry:
    return FileEntry(path, len(data), mtime_ns, xxhash.xxh3_128_hexdigest(data))


def test_entries_are_sorted_with_sizes_and_xxh3_128_digests(awkward_dataset: Path) -> None:
    manifest = build_manifest(awkward_dataset, name="awkward")
    assert [e.path for e in manifest.entries] == sorted(AWKWARD_FILES)
    for entry in manifest.entries:
        data = AWKWARD_FILES[entry.path]
        assert (entry.size, entry.digest) == (len(data), xxhash.xxh3_128_hexdigest(data))
        assert entry.mtime_ns == os.stat(awkward_dataset / entry.path).st_mtime_ns
    assert manifest.directories == AWKWARD_EMPTY_DIRS
    assert manifest.file_count == len(AWKWARD_FILES)
    assert manifest.total_bytes == sum(map(len, AWKWARD_FILES.values()))


def test_dataset_digest_ignores_walk_order_and_mtimes() -> None:
    files = [_entry(f"d/{i}", bytes([i]) * i, mtime_ns=i) for i in range(50)]
    shuffled = [FileEntry(e.path, e.size, 12345, e.digest) for e in random.Random(1).sample(files, len(files))]
    assert dataset_digest(files) == dataset_digest(shuffled)


@pytest.mark.parametrize(
    "change",
    [
        lambda e: FileEntry(e.path + "x", e.size, e.mtime_ns, e.digest),
        lambda e: FileEntry(e.path, e.size + 1, e.mtime_ns, e.digest),
        lambda e: FileEntry(e.path, e.size, e.mtime_ns, "0" * 32),
    ],
    ids=["path", "size", "content"],
)
def test_dataset_digest_changes_with_any_path_size_or_content(change) -> None:  # type: ignore[no-untyped-def]
    files = [_entry("a", b"1"), _entry("b", b"22")]
    assert dataset_digest(files) != dataset_digest([files[0], change(files[1])])


def test_empty_directories_count_in_the_digest() -> None:
    files = [_entry("a/x", b"1")]
    assert dataset_digest(files) != dataset_digest(files, ["b"])
    assert dataset_digest(files, ["b", "c"]) == dataset_digest(files, ["c", "b"])


def test_the_same_tree_digests_equally_on_local_and_memory_sources(awkward_dataset: Path, memory_root: str) -> None:
    fs = fsspec.filesystem("memory")
    for rel, data in AWKWARD_FILES.items():
        fs.pipe_file(f"{memory_root}/{rel}", data)
    local = build_manifest(awkward_dataset, name="d")
    remote = build_manifest(memory_root, name="d")
    # object stores have no empty directories; files alone must agree
    assert [(e.path, e.size, e.digest) for e in local.entries] == [(e.path, e.size, e.digest) for e in remote.entries]
    assert remote.digest == dataset_digest(local.entries)


def test_manifest_round_trips_through_its_stored_form(awkward_dataset: Path) -> None:
    manifest = build_manifest(awkward_dataset, name="awkward")
    assert Manifest.from_bytes(manifest.to_bytes()) == manifest


def test_an_empty_dataset_is_a_valid_manifest(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    manifest = build_manifest(tmp_path / "empty", name="nothing")
    assert manifest.entries == () and manifest.directories == () and manifest.total_bytes == 0
    assert Manifest.from_bytes(manifest.to_bytes()) == manifest
    assert manifest.digest == dataset_digest([])


def test_a_missing_source_is_not_found_not_an_empty_dataset(tmp_path: Path, memory_root: str) -> None:
    with pytest.raises(NotFound):
        build_manifest(tmp_path / "nope", name="x")
    with pytest.raises(NotFound):
        build_manifest(memory_root + "/typo", name="x")


def test_a_single_file_is_a_dataset_of_one(tmp_path: Path) -> None:
    (tmp_path / "one.bin").write_bytes(b"abc")
    manifest = build_manifest(tmp_path / "one.bin", name="one")
    assert [(e.path, e.size) for e in manifest.entries] == [("one.bin", 3)]


@pytest.mark.parametrize("corrupt", ["flip", "truncate", "header", "empty", "reorder-digest"])
def test_corrupt_stored_manifests_raise_integrity_errors(awkward_dataset: Path, corrupt: str) -> None:
    data = bytearray(build_manifest(awkward_dataset, name="awkward").to_bytes())
    if corrupt == "flip":
        data[-20] ^= 0x01
    elif corrupt == "truncate":
        del data[-30:]
    elif corrupt == "header":
        data[2] = ord("#")
    elif corrupt == "empty":
        data = bytearray()
    else:
        start = data.index(b'"digest":"') + len(b'"digest":"')
        data[start] = ord("0") if data[start] != ord("0") else ord("1")
    with pytest.raises(IntegrityError):
        Manifest.from_bytes(bytes(data))


@pytest.mark.parametrize("bad", ["/abs", "../up", "a/../b", "a//b", "./a", "a/", ""])
def test_unsafe_paths_cannot_enter_a_manifest(bad: str) -> None:
    with pytest.raises(InvalidInput):
        Manifest.create("d", [_entry(bad, b"x")])


def test_a_path_cannot_be_both_a_file_and_a_directory() -> None:
    with pytest.raises(InvalidInput):
        Manifest.create("d", [_entry("a", b"x"), _entry("a/b", b"y")])


@pytest.mark.parametrize("name", ["", "../x", "a/b", "-x", "x" * 300, "sp ace"])
def test_invalid_dataset_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidInput):
        Manifest.create(name, [])


def test_streaming_hasher_equals_one_shot_digest_across_chunk_boundaries(tmp_path: Path) -> None:
    data = os.urandom(CHUNK_SIZE * 2 + 123)
    hasher = FileHasher()
    for start in range(0, len(data), 65_537):
        hasher.update(data[start : start + 65_537])
    (tmp_path / "f").write_bytes(data)
    assert hasher.hexdigest() == xxhash.xxh3_128_hexdigest(data) == hash_file(tmp_path / "f")[0]
    assert hasher.size == len(data)


def test_special_files_in_a_source_are_refused(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    os.mkfifo(tmp_path / "src" / "pipe")
    with pytest.raises(InvalidInput, match="not a regular file"):
        build_manifest(tmp_path / "src", name="d")


def test_read_manifest_of_an_absent_dataset_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        read_manifest(str(tmp_path), "nothing-here")
    with pytest.raises(NotFound):
        read_manifest_header(str(tmp_path), "nothing-here")


@pytest.mark.parametrize(
    ("path", "safe"),
    [
        ("a", True), ("a/b/c.jpg", True), (".hidden", True), ("a/.b", True), ("..a", True), ("a/..b", True),
        ("a/b..", True), ("a.../b", True), ("\u00e9t\u00e9/\U0001f600", True), ("a b/c", True), ("a\\b", True),
        ("", False), (".", False), ("..", False), ("/", False), ("/a", False), ("a/", False), ("a//b", False),
        ("./a", False), ("../a", False), ("a/./b", False), ("a/../b", False), ("a/.", False), ("a/..", False),
        ("a\x00b", False),
    ],
)  # fmt: skip
def test_path_safety_table(path: str, safe: bool) -> None:
    from dsagent.format.manifest import is_safe_path

    assert is_safe_path(path) is safe


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("bad", ["", "../x", "a//b", "x/."])
def test_one_unsafe_path_among_many_is_named(position: int, bad: str) -> None:
    entries = [_entry(p, b"x") for p in ["ok/1", "ok/2"]]
    entries.insert(position, _entry(bad, b"x"))
    with pytest.raises(InvalidInput) as excinfo:
        Manifest.create("d", entries)
    assert repr(bad) in str(excinfo.value)


def test_the_dataset_and_bundle_digests_follow_the_documented_encoding() -> None:
    """The digests are a stored contract (manifests and bundle names outlive versions of
    this code): recompute them here from dataset_digest's docstring, record by record."""
    import struct

    import xxhash

    from dsagent.format.manifest import bundle_digest, dataset_digest

    entries = [
        FileEntry(f"c{i % 3}/é{i:05d}.jpg", 1000 + i * 7919, 10**18 + i, f"{(i * 2654435761) % (1 << 128):032x}")
        for i in range(5000)  # more than one block of records
    ]
    directories = ["z/empty", "a/empty"]

    def record(entry: FileEntry) -> bytes:
        name = entry.path.encode()
        return b"F" + struct.pack("<I", len(name)) + name + struct.pack("<Q", entry.size) + bytes.fromhex(entry.digest)

    ordered = sorted(entries, key=lambda e: e.path)
    dirs = b"".join(b"D" + struct.pack("<I", len(d.encode())) + d.encode() for d in sorted(directories))
    expected = xxhash.xxh3_128(b"dsplatform/dataset/v1\n" + b"".join(map(record, ordered)) + dirs).hexdigest()
    assert dataset_digest(entries, directories) == expected
    assert Manifest.create("spec", entries, directories=directories).digest == expected
    members = ordered[10:4600]
    assert (
        bundle_digest(members)
        == xxhash.xxh3_128(b"dsplatform/bundle/v1\n" + b"".join(map(record, members))).hexdigest()
    )


@given(
    path=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=()) | st.sampled_from("\udce9\udcff")),
    size=st.integers(min_value=0, max_value=2**63),
    mtime=st.integers(min_value=-(2**63), max_value=2**63),
    digest=st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
)
def test_an_entry_line_is_what_json_writes(path: str, size: int, mtime: int, digest: str) -> None:
    import json

    from dsagent.format.manifest import _entry_line

    want = json.dumps([path, size, mtime, digest], ensure_ascii=False, separators=(",", ":"))
    assert _entry_line(path, size, mtime, digest) == want


def test_a_manifest_of_a_checked_layout_is_the_one_create_makes_and_refuses_what_is_out_of_order() -> None:
    from dsagent.format.manifest import EntryTable

    entries = [FileEntry("a/x", 1, 0, "1" * 32), FileEntry("b", 2, 0, "2" * 32)]
    table = EntryTable.of(entries)
    made = Manifest.of_checked_layout("d", table, directories=["c", "e"], bundles=())
    assert made == Manifest.create("d", entries, directories=["e", "c"])
    with pytest.raises(ValueError, match="path order"):
        Manifest.of_checked_layout("d", EntryTable.of(entries[::-1]), directories=[], bundles=())
    with pytest.raises(ValueError, match="sorted"):
        Manifest.of_checked_layout("d", table, directories=["e", "c"], bundles=())


@pytest.mark.parametrize(
    "digests",
    [
        ["a" * 30, "b" * 34],  # the right total length, cut in the wrong places
        ["a" * 32, "b" * 31],
        ["a" * 16 + " " + "b" * 15, "c" * 32],  # fromhex would skip the space
        ["a" * 32, "g" * 32],
        ["a" * 32, "b" * 33],
    ],
)
def test_a_table_takes_only_digests_of_32_hex_characters(digests: list[str]) -> None:
    with pytest.raises(ValueError):
        EntryTableBuilder().add(["a", "b"], [1, 2], [0, 0], digests)
    built = EntryTableBuilder()
    built.add(["a", "b"], [1, 2], [0, 0], ["0f" * 16, "e1" * 16])
    assert list(built.build().hex_digests()) == ["0f" * 16, "e1" * 16]


def test_a_manifest_compressed_by_zstd_workers_reads_back_the_same() -> None:
    """The pack writes a manifest's body on zstd's worker threads, the agent on its own
    thread: both stored forms are the same manifest, across many zstd jobs."""
    rng = random.Random(7)
    entries = [
        FileEntry(
            f"c{i % 97:02d}/img_{i:07d}.JPEG",
            rng.randrange(1 << 20),
            rng.randrange(1 << 31),
            f"{rng.getrandbits(128):032x}",
        )
        for i in range(60_000)  # a body of several MB: more than one job of each worker
    ]
    manifest = Manifest.create("d", entries, directories=["empty"])
    alone, workers = manifest.to_bytes(), manifest.to_bytes(threads=2)
    assert Manifest.from_bytes(alone) == manifest == Manifest.from_bytes(workers)
    assert len(workers) > 1 << 20


@pytest.mark.parametrize("count", [1, 3])
def test_a_table_takes_one_digest_a_file_hex_or_raw(count: int) -> None:
    from dsagent.format.bundles.storeobjects import named

    members = [FileEntry("a", 1, 0, ""), FileEntry("b", 2, 0, "")]
    with pytest.raises(ValueError, match="digests for 2 files"):
        named(members, ["0f" * 16] * count)
    with pytest.raises(ValueError, match="16 digest bytes"):
        named(members, b"\x0f" * 16 * count)
    assert list(named(members, b"\x0f" * 32).hex_digests()) == ["0f" * 16] * 2
