"""The optional native digest loop gives what the pure-Python loops give, file for file and error for error.

The extension is built by ``make native``; where it is not, these tests build a private copy
with ``native/build.py`` (and skip, saying why, on a machine without a C compiler or Python
headers: the pure path is then the only one, and the rest of the suite covers it).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest
import xxhash

from dsagent.errors import IntegrityError, NotFound
from dsagent.format import digester, native
from dsagent.format.digester import build_manifest
from dsagent.format.hashing import CHUNK_SIZE, HASH_BUFFER, read_buffer
from tests.dsagent.conftest import AWKWARD_EMPTY_DIRS, AWKWARD_FILES, write_tree

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow  # builds the extension with the C compiler where it is not built


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("dsagent.format._native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def extension(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The built extension, else a private build of it (skipped without a compiler)."""
    if native._native is not None:
        return native._native
    sys.path.insert(0, str(ROOT / "native"))
    try:
        import build as native_build  # native/build.py, not a package
    finally:
        sys.path.remove(str(ROOT / "native"))
    if native_build.compiler() is None or native_build.headers() is None:
        pytest.skip("no C compiler or Python headers here: only the pure-Python digest can run")
    return _load(native_build.build(tmp_path_factory.mktemp("native")))


@pytest.fixture
def with_native(monkeypatch: pytest.MonkeyPatch, extension: ModuleType) -> ModuleType:
    monkeypatch.setattr(native, "_native", extension)
    monkeypatch.setattr(native, "AVAILABLE", True)
    return extension


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    files = dict(AWKWARD_FILES)
    files["big/over-the-buffer.bin"] = os.urandom(HASH_BUFFER + 1)
    files["big/exactly-the-buffer.bin"] = os.urandom(HASH_BUFFER)
    files["big/below-the-buffer.bin"] = os.urandom(HASH_BUFFER - 1)
    files["big/chunks.bin"] = os.urandom(2 * CHUNK_SIZE + 3)
    files["empty/zero.bin"] = b""
    files.update({f"flat/{i:04d}.jpg": os.urandom(i * 53) for i in range(700)})  # several walk groups
    root = write_tree(tmp_path / "src", files, AWKWARD_EMPTY_DIRS)
    (root / "latin1-\udce9.bin".encode("utf-8", "surrogateescape").decode("latin-1")).write_bytes(b"x")
    os.symlink(root / "flat" / "0001.jpg", root / "link.jpg")  # a linked file is hashed as its target
    return root


@pytest.mark.parametrize("pure_on", ["threads", "processes"])
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_the_native_digest_is_the_pure_digest(
    tree: Path, with_native: ModuleType, pure_on: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pure_on == "processes":
        monkeypatch.setattr(digester, "PROCESS_MIN_FILES", 2)
        monkeypatch.setattr(digester, "can_fork", lambda: True)
    native_manifest = build_manifest(tree, name="d", native=True)
    pure = build_manifest(tree, name="d", native=False)
    assert native_manifest.entries == pure.entries
    assert native_manifest.directories == pure.directories
    assert native_manifest.digest == pure.digest
    by_path = {e.path: e for e in native_manifest.entries}
    data = (tree / "big" / "chunks.bin").read_bytes()
    assert by_path["big/chunks.bin"].digest == xxhash.xxh3_128_hexdigest(data)
    assert by_path["big/chunks.bin"].size == len(data)
    assert by_path["empty/zero.bin"].digest == xxhash.xxh3_128_hexdigest(b"")


def test_the_native_digest_runs_on_threads_and_forks_nothing(
    tree: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digester, "PROCESS_MIN_FILES", 2)
    monkeypatch.setattr(digester, "can_fork", lambda: True)
    monkeypatch.setattr(digester, "ProcessPool", None)  # called: a TypeError
    done: list[int] = []
    manifest = build_manifest(tree, name="d", progress=lambda size, files: done.append(files))
    assert sum(done) == manifest.file_count


def test_a_digest_cache_keeps_the_pure_loop(tree: Path, with_native: ModuleType, tmp_path: Path) -> None:
    from dsagent.format.digestcache import DigestCache

    with DigestCache(tmp_path / "cache.sqlite") as cache:
        cached = build_manifest(tree, name="d", digest_cache=cache)
        assert cache.misses == cached.file_count  # counted and stored by the pure loop
    assert cached.digest == build_manifest(tree, name="d", native=True).digest


def test_a_missing_file_is_not_found_by_name(tmp_path: Path, with_native: ModuleType) -> None:
    (tmp_path / "here").write_bytes(b"1")
    with pytest.raises(NotFound, match="gone"):
        native.hash_names(str(tmp_path), ["here", "gone"], read_buffer())


def test_a_file_read_longer_than_its_stat_is_an_integrity_error(with_native: ModuleType) -> None:
    # /proc files stat as empty and read as text: a file that grew between stat and read
    with pytest.raises(IntegrityError, match="'proc/status' changed while it was digested"):
        native.hash_names("/proc/self", ["status"], read_buffer(), prefix="proc/")


def test_columns_stop_at_the_first_failure(tmp_path: Path, with_native: ModuleType) -> None:
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(name.encode())
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sizes, mtimes, digests, failure = with_native.hash_names(dfd, ["a", "missing", "b"], read_buffer())
    finally:
        os.close(dfd)
    assert sizes == [1] and len(mtimes) == 1 and digests == bytes.fromhex(xxhash.xxh3_128_hexdigest(b"a"))
    assert failure[:2] == (1, 2)  # index, ENOENT


def test_a_kept_buffer_hashes_as_a_fresh_one_and_is_checked(tmp_path: Path, with_native: ModuleType) -> None:
    # files smaller, equal to and larger than the lent buffer, read through it again and again
    sizes = {"small": 10, "page": 4096, "big": 3 * 4096 + 7, "empty": 0}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(os.urandom(size))
    names = sorted(sizes)
    lent = read_buffer(4096)
    first = native.hash_names(str(tmp_path), names, lent)
    again = native.hash_names(str(tmp_path), names, lent)
    assert first == again == native.hash_names(str(tmp_path), names, read_buffer(HASH_BUFFER))
    expected = (bytes.fromhex(xxhash.xxh3_128_hexdigest((tmp_path / n).read_bytes())) for n in names)
    assert first.digests == b"".join(expected)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(ValueError, match="at least 4096 bytes"):
            with_native.hash_names(dfd, names, read_buffer(4095))
        with pytest.raises(BufferError):  # not writable
            with_native.hash_names(dfd, names, bytes(8192))
    finally:
        os.close(dfd)


def test_asking_for_the_native_loop_without_it_fails_and_the_default_is_the_pure_loop(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "AVAILABLE", False)
    with pytest.raises(RuntimeError, match="make native"):
        build_manifest(tree, name="d", native=True)
    assert build_manifest(tree, name="d").file_count == len(AWKWARD_FILES) + 707


def test_an_extension_built_from_other_sources_is_not_used(
    extension: ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert extension.INTERFACE == native.INTERFACE  # the sources here build what this module speaks
    stale = ModuleType("dsagent.format._native")
    stale.__file__ = "/old/_native.so"
    stale.INTERFACE = native.INTERFACE - 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dsagent.format._native", stale)
    monkeypatch.setattr(sys.modules["dsagent.format"], "_native", stale, raising=False)
    spec = importlib.util.find_spec("dsagent.format.native")
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)  # a second copy: the imported module stays as it is
    with caplog.at_level("WARNING"):
        spec.loader.exec_module(fresh)
    assert fresh.AVAILABLE is False
    assert "/old/_native.so was built from other sources" in caplog.text


def test_the_build_takes_the_compiler_asked_for_or_says_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "native"))
    try:
        import build as native_build  # native/build.py, not a package
    finally:
        sys.path.remove(str(ROOT / "native"))
    monkeypatch.setenv("CC", "clang-no-such-version")
    with pytest.raises(RuntimeError, match="CC=clang-no-such-version is not installed"):
        native_build.compiler()  # never silently another compiler
    monkeypatch.setenv("CC", f"{shlex.quote(sys.executable)} -c pass")  # any installed command, with its arguments
    assert native_build.compiler() == [sys.executable, "-c", "pass"]
