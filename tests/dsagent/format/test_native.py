"""The optional native digest loop gives what the pure-Python loops give, file for file and error for error.

The extension is built by the package's build (``pip install``, ``make native``: setup.py);
where it is not (no C compiler at install time), these tests skip, saying why: the pure
path is then the only one, and the rest of the suite covers it. Also here: the build's own
behaviour (optional, or required and failing in one line) and the run-time switch.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from array import array
from pathlib import Path
from types import ModuleType

import pytest
import xxhash

from dsagent.errors import IntegrityError, NotFound
from dsagent.format import digester, native
from dsagent.format.digester import build_manifest
from dsagent.format.hashing import CHUNK_SIZE, HASH_BUFFER
from dsagent.format.walk import Dir, iter_native_dirs
from dsplatform import cores
from tests.dsagent.conftest import AWKWARD_EMPTY_DIRS, AWKWARD_FILES, write_tree

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow  # runs the build (setup.py) in subprocesses


@pytest.fixture(scope="module")
def extension() -> ModuleType:
    """The built extension (skipped, saying why, where it is not built)."""
    if native._native is None:
        pytest.skip(f"the native extension is not here ({native.OFF_REASON}): only the pure-Python loops run")
    return native._native


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


@pytest.mark.parametrize("may_fork", [True, False])
def test_the_native_loop_hashes_on_its_own_threads_whether_or_not_the_process_may_fork(
    tree: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch, may_fork: bool
) -> None:
    monkeypatch.setattr(digester, "PROCESS_MIN_FILES", 2)
    monkeypatch.setattr(digester, "can_fork", lambda: may_fork)  # False: the agent, where other threads run
    monkeypatch.setattr(digester, "ProcessPool", None)  # called: a TypeError
    monkeypatch.setattr(digester, "TREE_BATCH", 50)  # many calls, each while the walk goes on
    calls: list[int] = []
    original = native.hash_tree

    def counting(groups: list[Dir], *, threads: int) -> tuple[bytes, bytes, bytes]:
        calls.append(threads)
        return original(groups, threads=threads)

    monkeypatch.setattr(native, "hash_tree", counting)
    done: list[int] = []
    manifest = build_manifest(tree, name="d", workers=3, progress=lambda size, files: done.append(files))
    assert len(calls) >= 3 and set(calls) == {min(3, cores.usable())}
    assert sum(done) == manifest.file_count
    assert manifest == build_manifest(tree, name="d", workers=1, native=False)


@pytest.mark.parametrize("isolate", [True, False])
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_the_tree_digest_is_every_files_xxh3_in_walk_order(
    tree: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch, threads: int, isolate: bool
) -> None:
    monkeypatch.setattr(native, "ISOLATE_FDS", isolate)
    groups = list(iter_native_dirs(str(tree), []))
    sizes, mtimes, digests = native.hash_tree(groups, threads=threads)
    paths = [os.path.join(g.path, name) for g in groups for name in g.names]
    assert len(paths) > 700
    assert list(array("q", sizes)) == [os.stat(p).st_size for p in paths]
    assert list(array("q", mtimes)) == [os.stat(p).st_mtime_ns for p in paths]
    assert digests == b"".join(xxhash.xxh3_128_digest(Path(p).read_bytes()) for p in paths)


@pytest.mark.parametrize("isolate", [True, False])
def test_the_tree_digest_leaves_the_processs_descriptors_as_they_were(
    tree: Path, with_native: ModuleType, monkeypatch: pytest.MonkeyPatch, isolate: bool
) -> None:
    monkeypatch.setattr(native, "ISOLATE_FDS", isolate)
    groups = list(iter_native_dirs(str(tree), []))
    reading, writing = os.pipe()
    try:
        before = sorted(os.listdir("/proc/self/fd"))
        native.hash_tree(groups, threads=4)
        with pytest.raises(NotFound):
            native.hash_tree([*groups, Dir("gone", str(tree / "gone"), ["x"])], threads=4)
        assert sorted(os.listdir("/proc/self/fd")) == before  # nothing left open, nothing closed
        os.write(writing, b"still open")
        assert os.read(reading, 64) == b"still open"
    finally:
        os.close(reading)
        os.close(writing)


def test_the_first_failure_in_walk_order_is_the_one_raised(tmp_path: Path, with_native: ModuleType) -> None:
    names = [f"{i:03d}" for i in range(300)]
    for name in names:
        (tmp_path / name).write_bytes(name.encode())
    (tmp_path / "007").unlink()
    (tmp_path / "250").unlink()  # met first by another thread, most runs: still the second in order
    for threads in (1, 8):
        with pytest.raises(NotFound, match="007"):
            native.hash_tree([Dir("", str(tmp_path), names)], threads=threads)


def test_a_directory_that_does_not_open_is_named(tmp_path: Path, with_native: ModuleType) -> None:
    (tmp_path / "a").write_bytes(b"1")
    with pytest.raises(NotFound, match="no-such-dir'"):
        native.hash_tree([Dir("", str(tmp_path), ["a"]), Dir("d", str(tmp_path / "no-such-dir"), ["b"])], threads=2)


def test_a_file_read_longer_than_its_stat_is_an_integrity_error(with_native: ModuleType) -> None:
    # /proc files stat as empty and read as text: a file that grew between stat and read
    with pytest.raises(IntegrityError, match="'proc/status' changed while it was digested"):
        native.hash_tree([Dir("proc", "/proc/self", ["status"])], threads=1)


def test_files_around_the_buffers_size_hash_whole_and_the_arguments_are_checked(
    tmp_path: Path, with_native: ModuleType
) -> None:
    sizes = {"small": 10, "page": 4096, "big": 3 * 4096 + 7, "empty": 0}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(os.urandom(size))
    names = sorted(sizes)
    group = Dir("", str(tmp_path), names)
    small = native.hash_tree([group], threads=2, cap=4096)
    assert small == native.hash_tree([group], threads=1)
    assert small[2] == b"".join(xxhash.xxh3_128_digest((tmp_path / n).read_bytes()) for n in names)
    with pytest.raises(ValueError, match="at least 4096 bytes"):
        with_native.hash_tree([group], 4095, 1, True)
    with pytest.raises(TypeError, match="a \\(rel, directory, names\\) tuple"):
        with_native.hash_tree([(str(tmp_path), names)], 4096, 1, True)
    with pytest.raises(ValueError, match="null"):
        with_native.hash_tree([Dir("", str(tmp_path), ["sm\x00all"])], 4096, 1, True)
    assert with_native.hash_tree([], 4096, 4, True) == (b"", b"", b"", None)


def test_asking_for_the_native_loop_without_it_fails_and_the_default_is_the_pure_loop(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "AVAILABLE", False)
    monkeypatch.setattr(native, "OFF_REASON", native.NOT_BUILT)
    with pytest.raises(RuntimeError, match="the native loops are off: not built.*make native"):
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


def _build(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``setup.py build_ext`` into ``tmp_path`` (never the checkout's own build)."""
    return subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_compiler_asked_for_but_missing_fails_a_required_build_in_one_line(tmp_path: Path) -> None:
    built = _build(tmp_path, {"CC": "clang-no-such-version", "DSPLATFORM_BUILD_NATIVE": "require"})
    assert built.returncode != 0
    assert built.stderr.strip() == (
        "native: CC=clang-no-such-version is not installed (or not on PATH): install it, or unset CC"
    )  # never silently another compiler
    assert not list(tmp_path.rglob("_native*.so"))


def test_without_a_compiler_the_install_goes_on_and_says_so_once(tmp_path: Path) -> None:
    built = _build(tmp_path, {"CC": "clang-no-such-version", "DSPLATFORM_BUILD_NATIVE": "auto"})
    assert built.returncode == 0, built.stderr
    assert built.stderr.count("native: ") == 1 and "the pure-Python loops will run" in built.stderr
    assert not list(tmp_path.rglob("_native*.so"))


def test_the_build_compiles_the_extension_with_xxh3_inside(tmp_path: Path) -> None:
    if native._native is None:
        pytest.skip(f"no extension here ({native.OFF_REASON}): the build may not have a compiler")
    built = _build(tmp_path, {"DSPLATFORM_BUILD_NATIVE": "require"})
    assert built.returncode == 0, built.stderr
    (so,) = tmp_path.rglob("_native*.so")
    symbols = subprocess.run(["nm", "-D", str(so)], capture_output=True, text=True, check=False).stdout
    if symbols:  # binutils present: xxh3 is compiled in, nothing is looked up or exported
        assert "dlopen" not in symbols and "dlsym" not in symbols and "XXH" not in symbols
    spec = importlib.util.spec_from_file_location("dsagent.format._native", so)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.INTERFACE == native.INTERFACE
    assert b"dlopen" not in (ROOT / "native" / "dsnative.c").read_bytes()


def test_the_switch_turns_the_native_loops_off_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "LOADED", True)
    assert native.use_native(False, why_off="DSAGENT_NATIVE=0") is False
    assert native.AVAILABLE is False and native.describe() == "off (DSAGENT_NATIVE=0)"
    with pytest.raises(RuntimeError, match="the native loops are off: DSAGENT_NATIVE=0"):
        native.chosen(True)
    assert native.chosen(None) is False
    assert native.use_native(True) is True and native.describe() == "on"
    monkeypatch.setattr(native, "LOADED", False)
    monkeypatch.setattr(native, "_load_problem", native.NOT_BUILT)
    assert native.use_native(True) is False  # on asks for what is not there
    assert native.describe() == f"off ({native.NOT_BUILT})"


@pytest.mark.parametrize(("value", "on"), [("0", False), ("off", False), ("false", False), ("1", True), ("yes", True)])
def test_dsctl_and_dsagent_honour_dsagent_native_in_their_version(value: str, on: bool) -> None:
    for module, prog in (("dsagent.cli", "dsctl"), ("dsagent", "dsagent")):
        shown = subprocess.run(
            [sys.executable, "-m", module, "--version"], env={**os.environ, "DSAGENT_NATIVE": value},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        first, second = shown.stdout.strip().splitlines()
        assert first.startswith(f"{prog}, version ")
        if not on:
            assert second == f"native loops: off (DSAGENT_NATIVE={value})"
        else:
            assert second == f"native loops: {native.describe()}"  # this suite's: on where built


def test_a_bad_dsagent_native_is_one_line_and_exit_2() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "dsagent.cli", "--version"], env={**os.environ, "DSAGENT_NATIVE": "maybe"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 2 and shown.stderr.count("\n") == 1 and "DSAGENT_NATIVE='maybe'" in shown.stderr


def test_dsctl_digest_runs_the_pure_loop_with_dsagent_native_0(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick digest (no click) too: its edge switches the loops off before it digests."""
    from dsagent import cli

    ran: list[bool] = []
    real = digester.digest_files

    def spy(*args: object, **kwargs: object) -> object:
        ran.append(native.AVAILABLE)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(digester, "digest_files", spy)
    monkeypatch.setenv("DSAGENT_NATIVE", "0")
    monkeypatch.setenv("DSAGENT_DIGEST_CACHE", os.devnull + "-unused")
    cli.main(["digest", str(tree), "--no-digest-cache", "-o", "json"])
    assert ran == [False] and native.describe() == "off (DSAGENT_NATIVE=0)"


def test_the_extension_in_use_is_the_one_asked_for(extension: ModuleType) -> None:
    """Under ``tools/ci/native-asan.sh`` the sanitized build runs, not the installed one."""
    asked = os.environ.get("DSPLATFORM_TEST_NATIVE")
    assert extension is native._native
    if asked:
        assert extension.__file__ == asked


def test_the_extensions_system_calls_say_what_libc_says(tmp_path: Path, extension: ModuleType) -> None:
    """syncfs and mallopt as dsctl makes them without ctypes: 0 or the errno, and glibc's
    own verdict."""
    import ctypes
    import errno
    import platform

    calls = native.system_calls()
    assert calls is not None
    mallopt, syncfs = calls.mallopt, calls.syncfs
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert syncfs(fd) == 0
    finally:
        os.close(fd)
    assert syncfs(fd) == errno.EBADF
    if platform.libc_ver()[0] == "glibc":
        libc = ctypes.CDLL(None).mallopt
        # the process's own malloc answers both (AddressSanitizer's, preloaded, refuses every option)
        assert mallopt(-3, 4 << 20) is (libc(-3, 4 << 20) == 1)  # M_MMAP_THRESHOLD
        assert mallopt(-8, 16) is (libc(-8, 16) == 1)  # M_ARENA_MAX
        assert mallopt(12345, 1) is (libc(12345, 1) == 1)  # an option glibc does not know
