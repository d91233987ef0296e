"""Benchmark: ``dsctl digest / pack / unpack`` as users run them, beside the C pipelines.

Not run by CI. Generates N files (default 50,000) with log-normal sizes around 110 KB of
incompressible bytes (like JPEGs) in 1,000 class folders, then times, in one run, each
step three ways on the same data:

    dsctl (process)   dsctl digest SRC            find | xargs -P<cpus> xxh128sum
                      dsctl pack SRC --to STORE   tar -cf - | zstd -1 -T0 && sync FILE
                      dsctl unpack STORE DEST     zstd -dc | tar -x && sync -f DIR
    in process        build_manifest / pack_dataset / unpack, called from this process
                      (the library's cost without the interpreter's start-up; labelled),
                      the cyclic GC paused around pack and unpack as dsctl pauses it

The process figures are what users see and what the ratios (dsctl throughput over the C
pipeline's; goals: pack >= 1.5x on incompressible data and >= 1.0x on text, unpack >= 1.0x
for one bundle and >= 1.2x for several against the C tools on the same bundles one after
another, digest >= 1.0x from 50,000 files: below that, dsctl's start-up of about 0.05 s is
a large share of a digest, and the row is printed without a goal) are computed
from; the in-process row shows what start-up costs (``dsctl unpack`` within 10%
of it), and each step also times its ``dsctl`` command on a dataset of one file: the
command's fixed cost (the interpreter's start, its imports, its pools), printed with its
share of dsctl's time on the dataset (a row, no ratio). Runs are interleaved (dsctl, C,
in-process, then C, in-process, dsctl, ...: each round starts one side further on) so that
all sides see the same load on a shared machine and none always runs after the same one,
each after a ``sync``, page cache warm; each side's best of ``--repeat`` is printed with its
CPU time (user + sys, all threads and children).
dsctl runs with the digest cache off (a cold pack), as ``dsctl`` from this interpreter's
``bin/`` (``python -m dsagent.cli`` without it), with bytecode caches written as a user's
install has them (``PYTHONDONTWRITEBYTECODE`` is dropped for the children; one untimed
warm-up round writes them). dsctl's writes are durable (fsync/syncfs before publishing),
so the C pipelines are followed by a ``sync`` of what they wrote; the unpack without that
sync is printed too. On a disk, every unpack run writes a new directory and all are removed
after the step (:class:`Outputs` says why: a filesystem without a journal is slow to create
files just after many were deleted). dsctl also hashes every file while packing and
unpacking; the C pipelines do not. dsctl runs the optional native loops where ``make
native`` built them (docs/design-native.md); each row's label and the JSON's params say
which (``pure`` or ``native``). A baseline tool that is missing (``xxh128sum``: Debian's ``xxhash``,
``zstd``) drops its column, not the benchmark.

    python tools/bench/bundle.py                 # the full run (50,000 files, ~5.5 GB)
    python tools/bench/bundle.py --smoke         # seconds: checks that the benchmark still runs
    python tools/bench/bundle.py --workdir /dev/shm/bench --workdir .bench/bundle \\
        --files 6000 --median-kb 65 --max-bytes 10GB --repeat 5
                                                 # one ~450 MB bundle, tmpfs then disk
    python tools/bench/bundle.py --dsctl /tmp/wheel-venv/bin/dsctl ...
                                                 # time the dsctl a wheel installed (make wheel)

``--workdir`` picks the filesystem (the default, ``.bench/bundle``, is this checkout's
disk; a tmpfs removes the disk from the comparison) and may be given more than once (a
table for each). ``--max-bytes`` picks one bundle (larger than the dataset) or many.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dsagent.format import native  # noqa: E402
from dsagent.format.bundles.bundle import pack_dataset, unpack  # noqa: E402
from dsagent.format.digester import build_manifest  # noqa: E402
from dsplatform.heap import collector_paused, keep_stream_chunks  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from support.record import Record, filesystem  # noqa: E402

from dsplatform.units import parse_size  # noqa: E402

#: the smallest dataset the digest goal is set for: on fewer files dsctl's start-up (about
#: 0.05 s, half of it the interpreter's) is a large share of the whole digest
DIGEST_GOAL_FILES = 50_000

#: baseline tools, and the Debian package that has each
TOOLS = {"zstd": "zstd", "xxh128sum": "xxhash", "tar": "tar"}


_WORDS = [w.encode() for w in "the of and label image class train valid cat dog 0.25 1.5 n0142 box".split()]


def q(path: object) -> str:
    """``path`` as one shell word (a work directory may hold spaces)."""
    return shlex.quote(str(path))


def _content(rng: random.Random, size: int, data: str, index: int) -> bytes:
    """``size`` bytes: random (like JPEGs), text (compresses ~4x), or mixed (every other file each)."""
    if data == "random" or (data == "mixed" and index % 2 == 0):
        return rng.randbytes(size)
    words = rng.choices(_WORDS, k=size // 4 + 1)
    return b" ".join(words)[:size]


def generate(root: Path, files: int, classes: int, median_kb: float, seed: int, data: str = "random") -> int:
    """The dataset under ``root`` (reused when it matches); returns its total bytes."""
    stamp = root.parent / f".{root.name}.complete"
    wanted = f"{files} {classes} {median_kb} {seed} {data}"
    if stamp.exists() and stamp.read_text() == wanted and root.is_dir():  # a removed dataset is made again
        return sum(p.stat().st_size for p in root.rglob("*.JPEG"))
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(seed)
    mu = math.log(median_kb * 1000)
    total = 0
    for c in range(classes):
        (root / f"n{c:08d}").mkdir(parents=True)
    for i in range(files):
        size = max(1000, min(int(rng.lognormvariate(mu, 0.55)), 8_000_000))
        path = root / f"n{i % classes:08d}" / f"n{i % classes:08d}_{i:07d}.JPEG"
        path.write_bytes(_content(rng, size, data, i))
        total += size
    stamp.write_text(wanted)
    return total


def _cpu() -> float:
    """CPU seconds used so far by this process (all its threads) and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Side:
    """One way of running a step: a callable, what to clear before each run, its best figures."""

    def __init__(self, label: str, run: Callable[[], object], reset: Callable[[], object] = lambda: None) -> None:
        self.label = label
        self.run = run
        self.reset = reset
        self.wall = math.inf
        self.cpu = math.inf

    def once(self, record: bool = True) -> None:
        self.reset()
        os.sync()  # nobody pays for the previous run's dirty pages
        cpu, start = _cpu(), time.perf_counter()
        self.run()
        wall, used = time.perf_counter() - start, _cpu() - cpu
        if record:
            self.wall, self.cpu = min(self.wall, wall), min(self.cpu, used)


def interleave(sides: list[Side], repeat: int) -> None:
    """One untimed warm-up round, then ``repeat`` rounds running each side in turn, each round
    starting one side further on: on a disk, what a run leaves to the device (writeback,
    freed blocks) slows the run after it, so no side always follows the same one."""
    for side in sides:
        side.once(record=False)
    for turn in range(repeat):
        shift = turn % len(sides) if sides else 0
        for side in sides[shift:] + sides[:shift]:
            side.once()


def clear(*paths: Path, mkdir: bool = False) -> Callable[[], None]:
    def reset() -> None:
        for path in paths:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
            if mkdir:
                path.mkdir(parents=True)

    return reset


def in_memory(path: Path) -> bool:
    """Whether ``path`` is on a tmpfs (or ramfs)."""
    return filesystem(path) in ("tmpfs", "ramfs")


class Outputs:
    """Where each unpack run writes. In memory, one directory cleared before each run. On a
    disk, a new directory each run, all removed after the step: ext4 without a journal skips
    the inodes deleted in the last few minutes (``recently_deleted``, up to 5 minutes while
    their inode table block is dirty): here, unpacking 50,000 files right after deleting
    such a tree took 6.9 s for dsctl against 2.8 s just before, and 27 s for tar against
    13 s, by where the new inodes fell among the old ones. A node's cache filesystem with a journal never skips
    them; fresh directories measure that."""

    def __init__(self, base: Path, fresh: bool, mkdir: bool = False) -> None:
        self.base, self.fresh, self.mkdir = base, fresh, mkdir
        self.current, self._runs = base, 0

    def reset(self) -> None:
        if self.fresh:
            self._runs += 1
            self.current = self.base.with_name(f"{self.base.name}-{self._runs}")
        clear(self.current, mkdir=self.mkdir)()

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)
        for run in range(1, self._runs + 1):
            shutil.rmtree(self.base.with_name(f"{self.base.name}-{run}"), ignore_errors=True)


def shell(command: str) -> Callable[[], object]:
    return lambda: subprocess.run(["bash", "-o", "pipefail", "-c", command], check=True)


def dsctl_command() -> list[str]:
    """``dsctl`` as installed beside this interpreter, else the same entry point through ``-m``."""
    script = Path(sys.executable).parent / "dsctl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "dsagent.cli"]


def dsctl(installed: Path | None, *args: str) -> Callable[[], object]:
    """``dsctl args`` as a process: this checkout's (on its path), or ``installed``, a dsctl
    as a user's install has it (a wheel in a virtualenv: nothing of the checkout on its path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as a user's install has them
    if installed is None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    else:
        env.pop("PYTHONPATH", None)
    command = [str(installed), *args] if installed is not None else [*dsctl_command(), *args]
    return lambda: subprocess.run(
        command, check=True, env=env, stdout=subprocess.DEVNULL, cwd="/" if installed is not None else None
    )


def loops_of(installed: Path | None) -> str:
    """Which loops the timed dsctl runs: an installed one says so itself (``dsctl version``);
    this checkout's runs the optional C extension's when ``make native`` built it."""
    if installed is None:
        return "native" if native.AVAILABLE else "pure"
    answer = subprocess.run([str(installed), "version", "-o", "json"], check=True, capture_output=True, text=True)
    return "native" if json.loads(answer.stdout).get("nativeLoops") else "pure"


def digest_goal(files: int) -> tuple[float | None, str]:
    """The digest's goal for a dataset of ``files`` files, and where there is none, why."""
    if files >= DIGEST_GOAL_FILES:
        return 1.0, ""
    return None, f"no goal under {DIGEST_GOAL_FILES:,} files"


def report(
    what: str, sides: list[Side], total: int, files: int, record: Record, goal: float | None, aside: str = "",
    fixed: Side | None = None,
) -> None:  # fmt: skip
    """Print each side and record the ratio of dsctl's throughput to the first baseline's
    against ``goal`` (None: none at this size), ``aside`` added to its note; ``fixed``: the
    same command on a dataset of one file, its share of dsctl's time printed (a row only)."""
    print(what)
    for side in sides:
        record.row(what, side.label, side.wall, side.cpu)
        print(
            f"  {side.label:<44} {side.wall:8.2f} s {total / side.wall / 1e6:9.1f} MB/s"
            f" {files / side.wall:10.0f} files/s   CPU {side.cpu:6.2f} s"
        )
    ours, inproc, baselines = sides[0], sides[1], sides[2:]
    for c in baselines[:1]:
        note = f"CPU time C / dsctl {c.cpu / ours.cpu:.2f}x" + (f"; {aside}" if aside else "")
        record.ratio(f"{what} vs {c.label}", c.wall / ours.wall, goal, note)
        print(
            f"  {'ratio (dsagent / C throughput)':<44} {c.wall / ours.wall:8.2f}x"
            f"   (CPU time C / dsctl: {c.cpu / ours.cpu:.2f}x; in process: {c.wall / inproc.wall:.2f}x)"
        )
    if not baselines:
        print(f"  {'ratio (dsagent / C throughput)':<44}      -   (no baseline: install {what}'s tool)")
    print(f"  {'dsctl process / in process':<44} {ours.wall / inproc.wall:8.2f}x", flush=True)
    if fixed is not None:
        record.row(what, fixed.label, fixed.wall, fixed.cpu)
        print(
            f"  {fixed.label:<44} {fixed.wall:8.2f} s   CPU {fixed.cpu:6.2f} s"
            f"   ({fixed.wall / ours.wall:.0%} of dsctl's time)",
            flush=True,
        )


def bench(work: Path, args: argparse.Namespace, cpus: int, record: Record) -> None:
    src = work / "src"
    print(f"generating {args.files} files in {min(args.classes, args.files)} classes under {src} ...", flush=True)
    total = generate(src, args.files, min(args.classes, args.files), args.median_kb, args.seed, args.data)
    load = os.getloadavg()[0]
    print(f"dataset: {args.files} files, {total / 1e6:.1f} MB, {cpus} CPUs, load average {load:.2f} at start\n")
    subprocess.run(["bash", "-c", f"find {q(src)} -name '*.JPEG' -print0 | xargs -0 cat > /dev/null"], check=True)
    have = {tool for tool in TOOLS if shutil.which(tool) is not None}
    missing = sorted(set(TOOLS) - have)
    if missing:
        print(f"missing baseline tools (their columns are left out): {', '.join(missing)}", flush=True)
    manifest_holder: list[object] = []
    # the fixed cost of each command, as users run it: the same dsctl on a dataset of one file
    # (the interpreter's start, the command's imports, its pools; what a large dataset hides)
    one, one_store, one_packed, one_out = work / "one", work / "store-one", work / "store-one-b", work / "out-one"
    (one / "d").mkdir(parents=True, exist_ok=True)
    (one / "d" / "one.JPEG").write_bytes(b"one file")
    shutil.rmtree(one_store, ignore_errors=True)
    pack_dataset(one, one_store, name="one")
    fixed_digest = Side(
        "dsctl digest, one file (fixed cost)", dsctl(args.dsctl, "digest", str(one), "--no-digest-cache")
    )
    fixed_pack = Side(
        "dsctl pack, one file (fixed cost)",
        dsctl(args.dsctl, "pack", str(one), "--name", "one", "--to", str(one_packed), "--no-digest-cache"),
        clear(one_packed),
    )
    fixed_unpack = Side(
        "dsctl unpack, one file (fixed cost)",
        dsctl(args.dsctl, "unpack", str(one_store), str(one_out), "--name", "one"),
        clear(one_out),
    )

    sides = [
        Side("dsctl digest (process)", dsctl(args.dsctl, "digest", str(src), "--name", "bench", "--no-digest-cache")),
        Side("dsagent build_manifest (in process)", lambda: manifest_holder.append(build_manifest(src, name="bench"))),
    ]
    if "xxh128sum" in have:
        sides.append(
            Side(
                f"find | xargs -P{cpus} xxh128sum",
                shell(
                    f"cd {q(src)} && find . -name '*.JPEG' -print0"
                    f" | xargs -0 -n 500 -P {cpus} xxh128sum >/dev/null 2>&1"
                ),
            )
        )
    interleave([*sides, fixed_digest], args.repeat)
    what = f"digest ({args.data}, {args.loops} loops, {work.name})"
    report(what, sides, total, args.files, record, *digest_goal(args.files), fixed=fixed_digest)

    store, store2, c_archive = work / "store", work / "store-inproc", work / "c.tar.zst"
    cap = str(args.max_bytes)
    sides = [
        Side(
            "dsctl pack (process)",
            dsctl(
                args.dsctl,
                "pack",
                str(src),
                "--name",
                "bench",
                "--to",
                str(store),
                "--max-bytes",
                cap,
                "--no-digest-cache",
            ),
            clear(store),
        ),
        Side(
            "dsagent pack_dataset (in process)",
            collector_paused()(lambda: pack_dataset(src, store2, name="bench", max_bytes=args.max_bytes)),
            clear(store2),
        ),
    ]
    if {"tar", "zstd"} <= have:
        sides.append(
            Side(
                "tar -cf - | zstd -1 -T0 && sync",
                shell(f"tar -C {q(src)} -cf - . | zstd -q -1 -T0 -o {q(c_archive)} && sync {q(c_archive)}"),
                clear(c_archive),
            )
        )
    interleave([*sides, fixed_pack], args.repeat)
    report(
        f"pack ({args.data}, {args.loops} loops, {work.name})",
        sides,
        total,
        args.files,
        record,
        1.5 if args.data == "random" else 1.0,
        fixed=fixed_pack,
    )
    shutil.rmtree(store2, ignore_errors=True)

    fresh = not in_memory(work)
    ours_out, inproc_out = Outputs(work / "out-dsctl", fresh), Outputs(work / "out-inproc", fresh)
    c_out = Outputs(work / "out-c", fresh, mkdir=True)
    sides = [
        Side(
            "dsctl unpack (process)",
            lambda: dsctl(args.dsctl, "unpack", str(store), str(ours_out.current), "--name", "bench")(),
            ours_out.reset,
        ),
        Side(
            "dsagent unpack (in process)",
            collector_paused()(lambda: unpack(store, name="bench", dest=inproc_out.current)),
            inproc_out.reset,
        ),
    ]
    if {"tar", "zstd"} <= have and c_archive.exists():
        sides.append(
            Side(
                "zstd -dc | tar -x && sync -f",
                lambda: shell(
                    f"zstd -q -dc {q(c_archive)} | tar -x -C {q(c_out.current)} && sync -f {q(c_out.current)}"
                )(),
                c_out.reset,
            )
        )
        sides.append(
            Side(
                "zstd -dc | tar -x (no sync)",
                lambda: shell(f"zstd -q -dc {q(c_archive)} | tar -x -C {q(c_out.current)}")(),
                c_out.reset,
            )
        )
    bundles = sorted((store / "bundles").glob("*.tar.zst"))
    if {"tar", "zstd"} <= have and len(bundles) > 1:  # the C tools on the same bundles, one after another
        # -i: read past the end-of-archive blocks to the end of the stream, so that tar does not
        # stop inside the bundle's trailing zeros and leave zstd to die of SIGPIPE (pipefail)
        def in_turn() -> object:
            each = " && ".join(f"zstd -q -dc {q(b)} | tar -x -i -C {q(c_out.current)}" for b in bundles)
            return shell(f"{each} && sync -f {q(c_out.current)}")()

        sides.insert(2, Side(f"zstd -dc | tar -x, {len(bundles)} bundles in turn && sync -f", in_turn, c_out.reset))
    interleave([*sides, fixed_unpack], args.repeat)
    several = f"{len(bundles)} bundles" if len(bundles) > 1 else "one bundle"
    report(
        f"unpack ({args.data}, {several}, {args.loops} loops, {work.name})",
        sides,
        total,
        args.files,
        record,
        1.2 if len(bundles) > 1 else 1.0,
        fixed=fixed_unpack,
    )
    if args.writers:
        writer_counts(store, work, args, record, several)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}\n", flush=True)

    for outputs in (ours_out, inproc_out, c_out):
        outputs.remove()
    shutil.rmtree(store, ignore_errors=True)
    for path in (one, one_store, one_packed, one_out):
        shutil.rmtree(path, ignore_errors=True)
    c_archive.unlink(missing_ok=True)
    if not args.keep:
        shutil.rmtree(src, ignore_errors=True)


def writer_counts(store: Path, work: Path, args: argparse.Namespace, record: Record, several: str) -> None:
    """The in-process unpack of the same store with each of ``--writers`` threads writing a
    bundle's files (``unpack(writers=N)``), interleaved: what the default
    (``extract.member_writers``) is chosen against. Rows only: no ratio, no goal."""
    from dsagent.format.bundles.extract import member_writers

    outputs = {n: Outputs(work / f"out-writers-{n}", not in_memory(work)) for n in args.writers}
    sides = [
        Side(
            f"dsagent unpack (in process, {n} writers)",
            collector_paused()(lambda n=n: unpack(store, name="bench", dest=outputs[n].current, writers=n)),
            outputs[n].reset,
        )
        for n in args.writers
    ]
    interleave(sides, args.repeat)
    what = f"unpack by writers ({args.data}, {several}, {args.loops} loops, {work.name}; default {member_writers(1)})"
    print(what)
    for side in sides:
        record.row(what, side.label, side.wall, side.cpu)
        print(f"  {side.label:<44} {side.wall:8.2f} s   CPU {side.cpu:6.2f} s")
    for output in outputs.values():
        output.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--median-kb", type=float, default=110)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workdir",
        "--dir",
        dest="workdirs",
        type=Path,
        action="append",
        help="where the dataset, the store and the outputs go (a tmpfs or a disk); repeat for a table each"
        " (default: .bench/bundle)",
    )
    parser.add_argument(
        "--max-bytes", type=parse_size, default=800_000_000, help="bundle cap, e.g. 800MB (many bundles) or 10GB (one)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a few hundred small files: checks in seconds that the benchmark runs"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated dataset for the next run")
    parser.add_argument(
        "--data",
        choices=["random", "text", "mixed"],
        default="random",
        help="file contents: incompressible, text, half each",
    )
    parser.add_argument(
        "--json", type=Path, help="write the results here as JSON (tools/bench/results.py renders them)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="report each side's best of this many interleaved runs")
    parser.add_argument(
        "--writers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=None,
        help="also time the in-process unpack with each of these numbers of file-writing threads,"
        " e.g. 1,2,4,7,12 (default: not; --smoke: 1,2)",
    )
    parser.add_argument(
        "--dsctl",
        type=Path,
        default=None,
        help="the dsctl to time: one installed from the wheel (tools/ci/wheel.sh) in a virtualenv of its own;"
        " default: this checkout's",
    )
    args = parser.parse_args()
    if args.smoke:
        args.files, args.classes, args.median_kb, args.repeat = 300, 10, 20, 1
        args.writers = args.writers or [1, 2]
    args.repeat = max(1, args.repeat)
    args.loops = loops_of(args.dsctl)
    keep_stream_chunks(os.environ)  # the in-process side's heap as dsctl's (dsplatform.heap)
    cpus = os.cpu_count() or 1
    record = Record(
        "bundle",
        {
            "files": args.files,
            "median_kb": args.median_kb,
            "max_bytes": args.max_bytes,
            "data": args.data,
            "loops": args.loops,
            "dsctl": f"installed ({args.dsctl})" if args.dsctl else "checkout",
        },
    )
    workdirs = args.workdirs or [ROOT / ".bench" / "bundle"]
    for workdir in workdirs:
        print(f"== {workdir}", flush=True)
        bench(workdir.absolute(), args, cpus, record)
    record.write(args.json or (workdirs[0].absolute() / "bundle.json"))


if __name__ == "__main__":
    main()
