"""Coverage-guided differential fuzzing of the native unpack loop against the pure-Python one.

The C member loop (``native/unpackloop.c``) reads bundles that come from stores and peers a
pod may name: it sits on the trust boundary. This fuzzer gives both loops the same tar
stream, mutated by libFuzzer (through atheris) under coverage of the C code and of the
Python parser, and fails on the first input where they differ: another error class or
message, other files written, or anything left behind by a refusal. With AddressSanitizer
it also fails on any out-of-bounds read or write in C.

    python -m pip install atheris==3.0.0      # not in the lock: a person runs this
    apt-get install clang                     # coverage and ASan instrumentation
    CC=clang CFLAGS="-fsanitize=fuzzer-no-link,address" LDFLAGS="-fsanitize=fuzzer-no-link,address" \\
        DSPLATFORM_BUILD_NATIVE=require python setup.py -q build_ext --build-lib /tmp/fuzz-native
    LD_PRELOAD="$(python -c 'import atheris; print(atheris.path())')/asan_with_fuzzer.so" \\
        ASAN_OPTIONS=detect_leaks=0 python tools/fuzz/native_unpack.py --extension /tmp/fuzz-native \\
        -- -max_total_time=600 /tmp/fuzz-corpus

``--replay N`` runs the seeds and ``N`` random mutations of them without atheris (what the
test suite runs, with the normally built extension), so the harness cannot rot. Everything
after ``--`` goes to libFuzzer. Exit codes: 0 no difference found, 1 a difference or a
crash (libFuzzer saves the input as ``crash-*``), 2 bad arguments or no extension.
Who calls it: a person before changing the C loop or how it is shipped, and
``tests/tools/test_fuzz_native_unpack.py`` (``--replay``). Figures: docs/design-native.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import random
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: the dataset every input is unpacked as: plain members, an empty file, a name over 100
#: bytes and a non-ASCII one (pax headers), data across several 512-byte blocks
FILES = {
    "train/a.jpg": bytes(range(256)) * 3,
    "train/b.jpg": b"b" * 700,
    "train/c.jpg": b"",
    "train/" + "long-" * 25 + ".jpg": b"a name over 100 bytes",
    "val/caf\u00e9.jpg": b"non-ASCII",
    "val/d.jpg": random.Random(0).randbytes(1500),
}


class Mismatch(AssertionError):
    """The two loops gave different outcomes for one input."""


def load_extension(directory: Path) -> ModuleType:
    """The ``_native*.so`` built under ``directory`` (``setup.py build_ext --build-lib``)."""
    found = sorted(directory.rglob("_native*.so"))
    if not found:
        raise FileNotFoundError(f"no _native*.so under {directory} (setup.py build_ext --build-lib {directory})")
    spec = importlib.util.spec_from_file_location("dsagent.format._native", found[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use_extension(module: ModuleType) -> None:
    from dsagent.format import native

    native._native = module  # type: ignore[attr-defined]
    native.LOADED = native.AVAILABLE = True
    native.OFF_REASON = None


def _member(name: str, data: bytes, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + bytes(-len(data) % 512)


def seeds() -> list[bytes]:
    """Good streams (in order, reversed, GNU headers) and a few refused ones, to start from."""
    members = [_member(path, data) for path, data in sorted(FILES.items())]
    end = bytes(1024)
    gnu = tarfile.TarInfo("train/b.jpg")
    gnu.size = 700
    gnu_member = gnu.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape") + FILES["train/b.jpg"] + bytes(324)
    return [
        b"".join([*members, end]),
        b"".join([*reversed(members), end]),
        b"".join([members[0], gnu_member, *members[2:], end]),
        b"".join([_member("../evil", b"x"), *members, end]),
        b"".join([*members[:2], _member("train/c.jpg", b"", tarfile.SYMTYPE), *members[3:], end]),
        b"".join(members)[:1500],
    ]


class Harness:
    """One packed dataset and a scratch directory; :meth:`one_input` unpacks a stream with
    both loops and raises :class:`Mismatch` when they differ."""

    def __init__(self, scratch: Path) -> None:
        from dsagent.format.bundles.bundle import pack

        self.scratch = scratch
        src = scratch / "src"
        for rel, data in FILES.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
        self.manifest = pack(src, scratch / "store", name="d")
        assert len(self.manifest.bundles) == 1
        self.bundle = self.manifest.bundles[0]
        self.runs = 0

    def _outcome(self, stream: bytes, native: bool, writers: int = 1) -> tuple[str, Any]:
        from dsagent.errors import DsagentError
        from dsagent.format.bundles.extract import unpack_bundle_stream

        target = self.scratch / f"t{self.runs}-{int(native)}-{writers}"
        target.mkdir()
        (target / "kept").write_bytes(b"k")
        try:
            unpack_bundle_stream(
                io.BytesIO(stream), self.manifest, self.bundle, target, durable=False, native=native, writers=writers
            )
        except DsagentError as exc:
            left = sorted(os.listdir(target))
            return type(exc).__name__, (str(exc).replace(str(target), "TARGET"), left)
        finally:
            written = {
                str(p.relative_to(target)): (p.read_bytes(), p.stat().st_mtime_ns)
                for p in target.rglob("*")
                if p.is_file() and p.name != "kept"
            }
            shutil.rmtree(target)
        return "ok", written

    def one_input(self, data: bytes) -> None:
        import zstandard

        stream = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(data)
        self.runs += 1
        pure = self._outcome(stream, False)
        for writers in (1, 4):  # the C loop alone, and with the pool writing whole members
            c = self._outcome(stream, True, writers)
            if pure != c:
                raise Mismatch(f"pure loop: {pure!r:.400}\nnative loop, {writers} writers: {c!r:.400}")


def mutations(rng: random.Random, good: bytes) -> Iterator[bytes]:
    """Random damage of ``good`` (headers first), as the suite's small fuzz does."""
    while True:
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            if not data:
                break
            at = (
                rng.randrange(len(data))
                if rng.random() < 0.3
                else min(len(data) - 1, rng.randrange(0, len(data), 512) + rng.randrange(512))
            )
            how = rng.choice(("flip", "flip", "byte", "cut", "drop", "repeat"))
            if how == "flip":
                data[at] ^= 1 << rng.randrange(8)
            elif how == "byte":
                data[at] = rng.randrange(256)
            elif how == "cut":
                del data[at:]
            elif how == "drop":
                del data[at : at + rng.randrange(1, 600)]
            else:
                data[at:at] = data[at : at + rng.randrange(1, 600)]
        yield bytes(data)


def replay(harness: Harness, count: int, seed: int = 0) -> int:
    """The seeds, then ``count`` random mutations of them; returns the inputs run."""
    rng = random.Random(seed)
    runs = 0
    for good in seeds():
        harness.one_input(good)
        runs += 1
    made = mutations(rng, seeds()[0])
    for _ in range(count):
        harness.one_input(next(made))
        runs += 1
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, fuzzer = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extension", type=Path, default=None, help="directory of an instrumented build")
    parser.add_argument("--replay", type=int, default=None, metavar="N", help="seeds and N mutations, no atheris")
    parser.add_argument("--seed", type=int, default=0, help="of --replay's mutations")
    args = parser.parse_args(ours)
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-unpack-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        if args.replay is not None:
            return _replay(args, scratch)
        return _fuzz(args, scratch, fuzzer)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _replay(args: argparse.Namespace, scratch: Path) -> int:
    from dsagent.format import native

    if args.extension is not None:
        use_extension(load_extension(args.extension))
    if not native.AVAILABLE:
        print("native_unpack.py: the extension is not built (make native, or --extension DIR)", file=sys.stderr)
        return 2
    harness = Harness(scratch)
    try:
        runs = replay(harness, args.replay, args.seed)
    except Mismatch as exc:
        print(f"native_unpack.py: the loops differ\n{exc}", file=sys.stderr)
        return 1
    print(f"{runs} inputs, no difference")
    return 0


def _fuzz(args: argparse.Namespace, scratch: Path, fuzzer: list[str]) -> int:
    import atheris  # type: ignore[import-not-found]

    with atheris.instrument_imports(include=["dsagent.format"]):
        from dsagent.format import native  # noqa: F401

    if args.extension is None:
        print("native_unpack.py: --extension DIR (an instrumented build) is needed to fuzz", file=sys.stderr)
        return 2
    use_extension(load_extension(args.extension))
    assert native.AVAILABLE
    harness = Harness(scratch)
    corpus = [a for a in fuzzer if not a.startswith("-")]
    if corpus:  # start from the seeds
        Path(corpus[0]).mkdir(parents=True, exist_ok=True)
        for i, good in enumerate(seeds()):
            with contextlib.suppress(FileExistsError), open(Path(corpus[0]) / f"seed-{i}", "xb") as f:
                f.write(good)
    atheris.Setup([sys.argv[0], *fuzzer], harness.one_input)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
