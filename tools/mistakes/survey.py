"""A new user's mistakes, run against the real commands and judged the same way each time.

Who runs it: the lead before closing issue 23 (its "done when" asks for the count of clear
answers out of 80), and ``tests/tools/test_mistakes.py`` at ``--smoke`` size so that the
list cannot rot. Not run by CI in full (about a minute on a quiet machine).

Each mistake is one command line (``dsctl``, ``dsagent``, ``python -m scheduler_plugin``)
with the environment a new user would have: a small dataset, a store packed from it, a
running ``dsagent serve``, a port already taken. A mistake is answered **clearly** when:

- the process exits with the code the README's exit-code table documents for it;
- stderr says so in at most three lines (one line, and a hint), with no traceback and no
  "internal error";
- the message names what was wrong (each case lists a word it must contain: the option,
  the value or the thing missing, compared case-insensitively);
- it exits by itself within the case's limit (a server that should refuse to start and
  serves instead is a miss).

The cases are written from the documentation (README's exit codes and commands), not from
what the code answers today: a case that fails is a finding, not a wrong expectation.

    python tools/mistakes/survey.py            # all cases, a line per miss, the count
    python tools/mistakes/survey.py -v         # every case with its exit code and stderr
    python tools/mistakes/survey.py --smoke    # a handful, to check that the survey runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
DSCTL = [str(BIN / "dsctl")] if (BIN / "dsctl").exists() else [sys.executable, "-m", "dsagent.cli"]
DSAGENT = [str(BIN / "dsagent")] if (BIN / "dsagent").exists() else [sys.executable, "-m", "dsagent"]
EXTENDER = [sys.executable, "-m", "scheduler_plugin"]


@dataclass(frozen=True)
class Mistake:
    """One mistake: the command (``{tmp}``-style placeholders filled from :class:`World`),
    the documented exit code, and a word the one-line answer must contain."""

    what: str
    argv: list[str]
    exit: int
    says: str
    env: dict[str, str] = field(default_factory=dict)
    limit_s: float = 60.0
    smoke: bool = False


@dataclass
class World:
    """What the mistakes run against; built once by :func:`world`."""

    tmp: Path
    data: Path
    store: Path
    afile: Path
    sock: Path
    nosock: Path
    busy_port: int
    env: dict[str, str]

    def fill(self, text: str) -> str:
        return text.format(
            tmp=self.tmp,
            data=self.data,
            store=self.store,
            file=self.afile,
            sock=self.sock,
            nosock=self.nosock,
            busy=self.busy_port,
        )


def _cases() -> list[Mistake]:
    agent = ["--socket", "{sock}"]
    m = Mistake
    return [
        # -- dsctl digest / pack / unpack / verify: the format library's commands
        m("digest a path that does not exist", [*DSCTL, "digest", "{tmp}/nope"], 3, "nope", smoke=True),
        m("digest a URL with an unknown scheme", [*DSCTL, "digest", "foo://bucket/x"], 2, "foo"),
        m("digest s3 without a bucket", [*DSCTL, "digest", "s3://"], 2, "s3"),
        m("digest with an unknown output format", [*DSCTL, "digest", "{data}", "-o", "yaml"], 2, "yaml"),
        m("digest with an unknown flag", [*DSCTL, "digest", "{data}", "--fast"], 2, "--fast"),
        m("digest with a misspelt source option", [*DSCTL, "digest", "{data}", "--option", "anno=true"], 2, "anno"),
        m("pack without --to", [*DSCTL, "pack", "{data}", "--name", "ds"], 2, "--to"),
        m("pack without --name", [*DSCTL, "pack", "{data}", "--to", "{tmp}/s2"], 2, "--name"),
        m("pack with a size in an unknown unit", [*DSCTL, "pack", "{data}", "--name", "ds", "--to", "{tmp}/s3", "--max-bytes", "10XB"], 2, "10XB", smoke=True),
        m("pack with --max-bytes 0", [*DSCTL, "pack", "{data}", "--name", "ds", "--to", "{tmp}/s4", "--max-bytes", "0"], 2, "max-bytes"),
        m("pack with a negative --max-files", [*DSCTL, "pack", "{data}", "--name", "ds", "--to", "{tmp}/s5", "--max-files", "-1"], 2, "max-files"),
        m("pack a dataset name with a space", [*DSCTL, "pack", "{data}", "--name", "my data", "--to", "{tmp}/s6"], 2, "my data"),
        m("pack a dataset name with a slash", [*DSCTL, "pack", "{data}", "--name", "../up", "--to", "{tmp}/s7"], 2, "../up"),
        m("pack a regular file as the source", [*DSCTL, "pack", "{file}", "--name", "ds", "--to", "{tmp}/s8"], 2, "file.txt"),
        m("pack into a store that is a file", [*DSCTL, "pack", "{data}", "--name", "ds", "--to", "{file}"], 2, "file.txt"),
        m("pack with zstd level 99", [*DSCTL, "pack", "{data}", "--name", "ds", "--to", "{tmp}/s9", "--level", "99"], 2, "level"),
        m("pack with a store option without '='", [*DSCTL, "pack", "{data}", "--name", "ds", "--to", "{tmp}/s10", "--store-option", "anon"], 2, "anon"),
        m("pack with a store options file that is not JSON", [*DSCTL, "pack", "{data}", "--name", "ds", "--to", "{tmp}/s11", "--store-options-file", "{file}"], 2, "file.txt"),
        m("pack to an http store (read-only)", [*DSCTL, "pack", "{data}", "--name", "ds", "--to", "http://127.0.0.1:9/store"], 2, "http"),
        m("unpack a dataset the store does not hold", [*DSCTL, "unpack", "{store}", "{tmp}/u1", "--name", "other"], 3, "other", smoke=True),
        m("unpack from a store that does not exist", [*DSCTL, "unpack", "{tmp}/nostore", "{tmp}/u2", "--name", "ds"], 3, "nostore"),
        m("unpack into a non-empty directory", [*DSCTL, "unpack", "{store}", "{data}", "--name", "ds"], 4, "data"),
        m("unpack into a path that is a file", [*DSCTL, "unpack", "{store}", "{file}", "--name", "ds"], 4, "file.txt"),
        m("unpack a damaged bundle", [*DSCTL, "unpack", "{tmp}/damaged", "{tmp}/u3", "--name", "ds"], 5, "ds"),
        m("unpack a truncated bundle", [*DSCTL, "unpack", "{tmp}/truncated", "{tmp}/u4", "--name", "ds"], 5, "ds"),
        m("unpack with --workers 0", [*DSCTL, "unpack", "{store}", "{tmp}/u5", "--name", "ds", "--workers", "0"], 2, "workers"),
        m("verify a copy missing a file", [*DSCTL, "verify", "{tmp}/missing", "--manifest", "{store}", "--name", "ds"], 5, "missing"),
        m("verify a copy with a changed file", [*DSCTL, "verify", "{tmp}/changed", "--manifest", "{store}", "--name", "ds"], 5, "a/1.bin"),
        m("verify a copy with an extra file", [*DSCTL, "verify", "{tmp}/extra", "--manifest", "{store}", "--name", "ds"], 5, "extra"),
        m("verify a directory that does not exist", [*DSCTL, "verify", "{tmp}/nodir", "--manifest", "{store}", "--name", "ds"], 3, "nodir"),
        m("verify against a dataset the store lacks", [*DSCTL, "verify", "{data}", "--manifest", "{store}", "--name", "other"], 3, "other"),
        # -- dsctl cache / status / release / evict / ls / wait: the agent's clients
        m("cache with no agent running", [*DSCTL, "cache", "ds={data}", "--socket", "{nosock}"], 8, "agent", smoke=True),
        m("cache with a port out of range", [*DSCTL, "cache", "ds={data}", "--agent", "notahost:99999"], 2, "99999"),
        m("cache with nothing listening on --agent", [*DSCTL, "cache", "ds={data}", "--agent", "127.0.0.1:9"], 8, "127.0.0.1:9"),
        m("cache a spec without '='", [*DSCTL, "cache", "imagenet", *agent], 2, "imagenet"),
        m("cache a dataset name with capitals and a space", [*DSCTL, "cache", "My Data={data}", *agent], 2, "My Data"),
        m("cache the same name twice", [*DSCTL, "cache", "ds={data}", "ds={store}", *agent], 2, "ds"),
        m("cache a local path that does not exist", [*DSCTL, "cache", "ds={data}/nope", "--task", "t-missing", *agent], 3, "nope"),
        m("cache a local path the agent does not allow", [*DSCTL, "cache", "ds=/etc", "--task", "t-etc", *agent], 2, "/etc"),
        m("cache file:///etc/passwd", [*DSCTL, "cache", "ds=file:///etc/passwd", "--task", "t-passwd", *agent], 2, "/etc/passwd"),
        m("cache over ftp://", [*DSCTL, "cache", "ds=ftp://host/x", "--task", "t-ftp", *agent], 2, "ftp"),
        m("cache from an unreachable HTTP store", [*DSCTL, "cache", "ds=http://127.0.0.1:9/ds", "--task", "t-http", *agent], 7, "127.0.0.1:9"),
        m("cache with an unreadable --timeout", [*DSCTL, "cache", "ds={data}", "--timeout", "10parsecs", *agent], 2, "10parsecs"),
        m("cache with a negative --timeout", [*DSCTL, "cache", "ds={data}", "--timeout", "-5", *agent], 2, "-5"),
        m("cache with --bundles lacking the dataset", [*DSCTL, "cache", "other={data}", "--bundles", "{store}", "--task", "t-bundles", *agent], 3, "other"),
        m("cache with endpoint_url lacking a scheme", [*DSCTL, "cache", "ds=s3://b/x", "--option", "endpoint_url=127.0.0.1:5055", "--task", "t-ep", *agent], 2, "endpoint_url"),
        m("cache with anon=maybe", [*DSCTL, "cache", "ds=s3://b/x", "--option", "anon=maybe", "--task", "t-anon", *agent], 2, "anon"),
        m("cache with a misspelt option key", [*DSCTL, "cache", "ds=s3://b/x", "--option", "endpoint_urll=http://127.0.0.1:9", "--task", "t-typo", *agent], 2, "endpoint_url"),
        m("cache s3 through an unreachable endpoint", [*DSCTL, "cache", "ds=s3://b/x", "--option", "endpoint_url=http://127.0.0.1:9", "--option", "anon=true", "--task", "t-s3", "--timeout", "45s", *agent], 7, "127.0.0.1:9", limit_s=90),
        m("cache a task id with a slash", [*DSCTL, "cache", "ds={data}", "--task", "a/b", *agent], 2, "a/b"),
        m("cache a second dataset set under a held task", [*DSCTL, "cache", "ds2={store}", "--task", "t-held", *agent], 4, "t-held"),
        m("cache --from-env with DSAGENT_DATASETS unset", [*DSCTL, "cache", "--from-env", *agent], 2, "DSAGENT_DATASETS"),
        m("cache with a source options file that does not exist", [*DSCTL, "cache", "ds={data}", "--source-options-file", "{tmp}/nofile.json", *agent], 2, "nofile.json"),
        m("status of an unknown task", [*DSCTL, "status", "no-such-task", *agent], 3, "no-such-task"),
        m("release an unknown task", [*DSCTL, "release", "no-such-task", *agent], 3, "no-such-task"),
        m("evict a dataset that is not cached", [*DSCTL, "evict", "nosuch", *agent], 3, "nosuch"),
        m("evict a dataset a task uses", [*DSCTL, "evict", "held", *agent], 4, "held"),
        m("evict with nothing named", [*DSCTL, "evict", *agent], 2, "evict"),
        m("ls with an unknown output format", [*DSCTL, "ls", "-o", "yaml", *agent], 2, "yaml"),
        m("ls with no agent running", [*DSCTL, "ls", "--socket", "{nosock}"], 8, "agent"),
        m("wait without a command", [*DSCTL, "wait", "--from-env", *agent], 2, "command"),
        m("wait with an unreadable --timeout", [*DSCTL, "wait", "--timeout", "soon", "--", "true"], 2, "soon"),
        m("gc a store that does not exist", [*DSCTL, "gc", "{tmp}/nostore"], 3, "nostore"),
        m("gc with an unreadable --grace", [*DSCTL, "gc", "{store}", "--grace", "5parsecs"], 2, "5parsecs"),
        m("gc with a negative --grace", [*DSCTL, "gc", "{store}", "--grace", "-1h"], 2, "-1h"),
        # -- dsctl topo / plan
        m("topo from a file that does not exist", [*DSCTL, "topo", "show", "--from", "{tmp}/nope.txt"], 2, "nope.txt"),
        m("topo from a file that is not a topology", [*DSCTL, "topo", "show", "--from", "{file}"], 2, "topology"),
        m("topo with an unknown class rule", [*DSCTL, "topo", "show", "--from", "{file}", "--classes", "rack"], 2, "rack"),
        m("topo best with no --count", [*DSCTL, "topo", "best", "--from", "{file}"], 2, "count"),
        m("plan with an unreadable deadline", [*DSCTL, "plan", "--extender", "http://127.0.0.1:9", "--params", "7B", "--step-seconds", "250ms", "--steps", "1e5", "--deadline", "tomorrow", "--max-gpus", "8"], 2, "tomorrow"),
        m("plan with a parameter count in an unknown unit", [*DSCTL, "plan", "--extender", "http://127.0.0.1:9", "--params", "7Q", "--step-seconds", "250ms", "--steps", "1e5", "--deadline", "6h", "--max-gpus", "8"], 2, "7Q"),
        m("plan with no extender running", [*DSCTL, "plan", "--extender", "http://127.0.0.1:9", "--params", "7B", "--step-seconds", "250ms", "--steps", "1e5", "--deadline", "6h", "--max-gpus", "8"], 7, "127.0.0.1:9"),
        # -- dsagent serve: the node agent's start-up
        m("serve a root under /proc", [*DSAGENT, "serve", "--root", "/proc/nope"], 2, "/proc/nope", limit_s=30, smoke=True),
        m("serve a root that is a regular file", [*DSAGENT, "serve", "--root", "{file}"], 2, "file.txt", limit_s=30),
        m("serve with a capacity in an unknown unit", [*DSAGENT, "serve", "--root", "{tmp}/r1", "--capacity", "lots"], 2, "lots", limit_s=30),
        m("serve with a misspelt DSAGENT_ variable", [*DSAGENT, "serve", "--root", "{tmp}/r2"], 2, "DSAGENT_CAPCITY", env={"DSAGENT_CAPCITY": "1GB"}, limit_s=30),
        m("serve with an unknown log level", [*DSAGENT, "serve", "--root", "{tmp}/r3", "--log-level", "verbose"], 2, "verbose", limit_s=30),
        m("serve a local source that does not exist", [*DSAGENT, "serve", "--root", "{tmp}/r4", "--local-source", "{tmp}/nosrc"], 2, "nosrc", limit_s=30),
        m("serve TCP on a port out of range", [*DSAGENT, "serve", "--root", "{tmp}/r5", "--listen", "127.0.0.1:99999"], 2, "99999", limit_s=30),
        m("serve TCP on a busy port", [*DSAGENT, "serve", "--root", "{tmp}/r6", "--listen", "127.0.0.1:{busy}"], 2, "{busy}", limit_s=30),
        m("serve a root another agent serves", [*DSAGENT, "serve", "--root", "{tmp}/root"], 4, "dsagent.sock", limit_s=30),
        m("serve with a bad DSAGENT_IDLE_TTL", [*DSAGENT, "serve", "--root", "{tmp}/r7"], 2, "DSAGENT_IDLE_TTL", env={"DSAGENT_IDLE_TTL": "forever"}, limit_s=30),
        # -- the extender and the webhook
        m("extender on a busy port", [*DSCTL, "scheduler", "serve", "--port", "{busy}"], 2, "{busy}", limit_s=30),
        m("extender with a misspelt DSEXT_ variable", [*EXTENDER], 2, "DSEXT_WIEGHTS", env={"DSEXT_WIEGHTS": "dataset=1"}, limit_s=30),
        m("extender with unreadable weights", [*DSCTL, "scheduler", "serve", "--weights", "dataset=lots"], 2, "lots", limit_s=30),
        m("extender with a kubeconfig that does not exist", [*DSCTL, "scheduler", "serve", "--watch", "--kubeconfig", "{tmp}/nokube"], 2, "nokube", limit_s=30),
        m("webhook without its certificate", [*DSAGENT, "webhook", "serve"], 2, "cert", env={"DSAGENT_WEBHOOK_CERT_FILE": "{tmp}/nocert.pem", "DSAGENT_WEBHOOK_KEY_FILE": "{tmp}/nokey.pem"}, limit_s=30),
        m("webhook with a misspelt variable", [*DSAGENT, "webhook", "serve"], 2, "DSAGENT_WEBHOOK_PROT", env={"DSAGENT_WEBHOOK_PROT": "8443"}, limit_s=30),
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Run one command; None for the exit code when it had to be stopped."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return None, err


@contextlib.contextmanager
def world() -> Iterator[World]:
    """A small dataset, its store, damaged and partial copies, a running agent holding a
    task, and a port something else listens on."""
    tmp = Path(tempfile.mkdtemp(prefix="dsmistakes-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSAGENT_", "DSEXT_"))}
    env.update({"XDG_RUNTIME_DIR": str(tmp / "run"), "XDG_CACHE_HOME": str(tmp / "xdg"), "HOME": str(tmp / "home"), "NO_COLOR": "1"})
    for d in ("run", "xdg", "home"):
        (tmp / d).mkdir()
    data = tmp / "data"
    for rel, size in (("a/1.bin", 3000), ("a/2.bin", 5000), ("b/3.bin", 7000)):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_bytes(os.urandom(size))
    afile = tmp / "file.txt"
    afile.write_text("not a directory, not JSON, not a topology\n")
    store = tmp / "store"
    subprocess.run([*DSCTL, "pack", str(data), "--name", "ds", "--to", str(store)], env=env, check=True, capture_output=True)
    subprocess.run([*DSCTL, "pack", str(data), "--name", "held", "--to", str(store)], env=env, check=True, capture_output=True)
    _damaged_stores(store, tmp)
    _partial_copies(data, tmp)
    sock = tmp / "root" / "dsagent.sock"
    agent = subprocess.Popen(
        [*DSAGENT, "serve", "--root", str(tmp / "root"), "--local-source", str(data), "--local-source", str(store)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    busy = socket.socket()
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("survey: the agent did not start")
            time.sleep(0.1)
        subprocess.run([*DSCTL, "cache", f"held={data}", "--task", "t-held", "--socket", str(sock)], env=env, check=True, capture_output=True, timeout=60)
        busy.bind(("127.0.0.1", _free_port()))
        busy.listen()
        yield World(tmp, data, store, afile, sock, tmp / "nosuch.sock", int(busy.getsockname()[1]), env)
    finally:
        busy.close()
        os.killpg(agent.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=15)
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def _damaged_stores(store: Path, tmp: Path) -> None:
    """``damaged``: a bundle with flipped bytes in the middle; ``truncated``: cut in half."""
    for name, spoil in (("damaged", _flip), ("truncated", _cut)):
        copy = tmp / name
        shutil.copytree(store, copy)
        bundles = [p for p in copy.rglob("*") if p.is_file() and p.suffix == ".zst"]
        for bundle in bundles:
            spoil(bundle)


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) // 3, len(raw) // 3 + 64):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def _cut(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _partial_copies(data: Path, tmp: Path) -> None:
    """Copies of the dataset with one file missing, one changed, one extra."""
    for name in ("missing", "changed", "extra"):
        shutil.copytree(data, tmp / name)
    (tmp / "missing" / "b" / "3.bin").unlink()
    (tmp / "changed" / "a" / "1.bin").write_bytes(os.urandom(3000))
    (tmp / "extra" / "extra.bin").write_bytes(b"x")


def judge(case: Mistake, code: int | None, err: str, w: World) -> str | None:
    """None when the answer is clear, else why not (one line)."""
    lines = [line for line in err.splitlines() if line.strip()]
    if code is None:
        return f"still running after {case.limit_s:.0f} s"
    if "Traceback" in err:
        return f"traceback (exit {code})"
    if code != case.exit:
        return f"exit {code}, documented {case.exit}: {lines[0] if lines else '(no message)'}"
    if not lines:
        return "no message"
    if len(lines) > 3:
        return f"{len(lines)} lines on stderr"
    if "internal error" in err.lower():
        return f"internal error: {lines[0]}"
    says = w.fill(case.says).lower()
    if says not in err.lower():
        return f"does not name {says!r}: {lines[0]}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a handful of cases, to check that the survey runs")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case with its answer")
    parser.add_argument("--json", metavar="OUT", help="write every case's result as JSON")
    args = parser.parse_args(argv)
    cases = [c for c in _cases() if c.smoke or not args.smoke]
    results = []
    with world() as w:
        for case in cases:
            env = {**w.env, **{k: w.fill(v) for k, v in case.env.items()}}
            code, err = _run([w.fill(a) for a in case.argv], env, case.limit_s)
            verdict = judge(case, code, err, w)
            results.append({"what": case.what, "exit": code, "documented": case.exit, "stderr": err.strip(), "miss": verdict})
            if verdict or args.verbose:
                mark = "ok  " if verdict is None else "MISS"
                print(f"{mark} {case.what}: {verdict or err.strip().splitlines()[0] if err.strip() else verdict}")
    clear = sum(1 for r in results if r["miss"] is None)
    print(f"clear: {clear} of {len(results)} mistakes")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
