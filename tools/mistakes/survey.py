"""A new user's mistakes, run against the real commands and judged the same way each time.

Who runs it: whoever changes an error message or an exit code (it prints the count of
clear answers), and ``tests/tools/test_mistakes.py`` at ``--smoke`` size so that the
list cannot rot. Not run by CI in full (about a minute on a quiet machine).

Each mistake is one command line (``dsctl``, ``dsagent``, ``python -m scheduler_plugin``)
with the environment a new user would have: a small dataset, a store packed from it, a
running ``dsagent serve``, a port already taken. A mistake is answered **clearly** when:

- the process exits with the code docs/reference/exit-codes.md documents for it;
- stderr says so in one line, ``PROG: error: what (hint)``, with no traceback and no
  "internal error" (``dsctl cache``'s progress lines may come before it);
- the message names what was wrong (each case lists a word it must contain: the option,
  the value or the thing missing, compared case-insensitively);
- it exits by itself within the case's limit (a server that should refuse to start and
  serves instead is a miss).

The cases are written from the documentation (the exit codes and commands it documents), not from
what the code answers today: a case that fails is a finding, not a wrong expectation.

    python tools/mistakes/survey.py            # all cases, a line per miss, the count
    python tools/mistakes/survey.py -v         # every case with its exit code and stderr
    python tools/mistakes/survey.py --smoke    # a handful, to check that the survey runs

Exit status: 0 when every mistake was answered clearly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from tools.support.harness import held_port  # noqa: E402

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
    extender: str
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
            extender=self.extender,
        )


def _cases() -> list[Mistake]:
    """The mistakes. Commands are shell words (``{tmp}`` and the like filled in after the
    split, so paths with spaces stay one word); ``dsctl``/``dsagent``/``extender`` name the
    programs; ``@agent`` is ``--socket`` of the running agent."""
    rows: list[tuple[str, str, int, str, dict[str, Any]]] = [
        # -- dsctl digest / pack / unpack / verify: the format library's commands
        ("digest a path that does not exist", "dsctl digest {tmp}/nope", 3, "nope", SMOKE),
        ("digest a URL with an unknown scheme", "dsctl digest foo://bucket/x", 2, "foo", {}),
        ("digest s3 without a bucket", "dsctl digest s3://", 2, "s3", {}),
        ("digest with an unknown output format", "dsctl digest {data} -o yaml", 2, "yaml", {}),
        ("digest with an unknown flag", "dsctl digest {data} --fast", 2, "--fast", {}),
        ("digest with a storage option on a local path", "dsctl digest {data} --option anno=true", 2, "anno", {}),
        ("pack without --to", "dsctl pack {data} --name ds", 2, "--to", {}),
        ("pack without --name", "dsctl pack {data} --to {tmp}/s2", 2, "--name", {}),
        ("pack a source that does not exist", "dsctl pack {tmp}/nope --name ds --to {tmp}/s1", 3, "nope", {}),
        (
            "pack with a size in an unknown unit",
            "dsctl pack {data} --name ds --to {tmp}/s3 --max-bytes 10XB",
            2,
            "10XB",
            SMOKE,
        ),
        ("pack with --max-bytes 0", "dsctl pack {data} --name ds --to {tmp}/s4 --max-bytes 0", 2, "max-bytes", {}),
        (
            "pack with a negative --max-files",
            "dsctl pack {data} --name ds --to {tmp}/s5 --max-files -1",
            2,
            "max-files",
            {},
        ),
        ("pack a dataset name with a space", "dsctl pack {data} --name 'my data' --to {tmp}/s6", 2, "my data", {}),
        ("pack a dataset name with a slash", "dsctl pack {data} --name ../up --to {tmp}/s7", 2, "../up", {}),
        ("pack into a store that is a file", "dsctl pack {data} --name ds --to {file}", 2, "file.txt", {}),
        ("pack with zstd level 99", "dsctl pack {data} --name ds --to {tmp}/s9 --level 99", 2, "level", {}),
        (
            "pack with a store option without '='",
            "dsctl pack {data} --name ds --to {tmp}/s10 --store-option anon",
            2,
            "anon",
            {},
        ),
        (
            "pack with a store options file that is not JSON",
            "dsctl pack {data} --name ds --to {tmp}/s11 --store-options-file {file}",
            2,
            "file.txt",
            {},
        ),
        (
            "pack to an http store (read-only)",
            "dsctl pack {data} --name ds --to http://127.0.0.1:9/store",
            2,
            "read-only",
            {},
        ),
        ("unpack a dataset the store does not hold", "dsctl unpack {store} {tmp}/u1 --name other", 3, "other", SMOKE),
        ("unpack from a store that does not exist", "dsctl unpack {tmp}/nostore {tmp}/u2 --name ds", 3, "nostore", {}),
        ("unpack into a non-empty directory", "dsctl unpack {store} {data} --name ds", 4, "not empty", {}),
        ("unpack into a path that is a file", "dsctl unpack {store} {file} --name ds", 2, "is a file", {}),
        ("unpack a damaged bundle", "dsctl unpack {tmp}/damaged {tmp}/u3 --name ds", 5, "ds", {}),
        ("unpack a truncated bundle", "dsctl unpack {tmp}/truncated {tmp}/u4 --name ds", 5, "ds", {}),
        ("unpack with --workers 0", "dsctl unpack {store} {tmp}/u5 --name ds --workers 0", 2, "workers", {}),
        ("verify a copy missing a file", "dsctl verify {tmp}/missing --manifest {store} --name ds", 5, "missing", {}),
        (
            "verify a copy with a changed file",
            "dsctl verify {tmp}/changed --manifest {store} --name ds",
            5,
            "a/1.bin",
            {},
        ),
        ("verify a copy with an extra file", "dsctl verify {tmp}/extra --manifest {store} --name ds", 5, "extra", {}),
        (
            "verify a directory that does not exist",
            "dsctl verify {tmp}/nodir --manifest {store} --name ds",
            3,
            "nodir",
            {},
        ),
        (
            "verify against a dataset the store lacks",
            "dsctl verify {data} --manifest {store} --name other",
            3,
            "other",
            {},
        ),
        # -- dsctl cache / status / release / evict / ls / wait: the agent's clients
        ("cache with no agent running", "dsctl cache ds={data} --socket {nosock}", 8, "agent", SMOKE),
        ("cache with a port out of range", "dsctl cache ds={data} --agent notahost:99999", 2, "99999", {}),
        ("cache with nothing listening on --agent", "dsctl cache ds={data} --agent 127.0.0.1:9", 8, "127.0.0.1:9", {}),
        ("cache a spec without '='", "dsctl cache imagenet @agent", 2, "imagenet", {}),
        ("cache a dataset name with capitals and a space", "dsctl cache 'My Data={data}' @agent", 2, "My Data", {}),
        ("cache the same name twice", "dsctl cache ds={data} ds={store} @agent", 2, "ds", {}),
        ("cache a local path that does not exist", "dsctl cache ds={data}/nope --task t-missing @agent", 3, "nope", {}),
        ("cache a local path the agent does not allow", "dsctl cache ds=/etc --task t-etc @agent", 2, "/etc", {}),
        ("cache file:///etc/passwd", "dsctl cache ds=file:///etc/passwd --task t-passwd @agent", 2, "/etc/passwd", {}),
        ("cache over ftp://", "dsctl cache ds=ftp://host/x --task t-ftp @agent", 2, "ftp", {}),
        (
            "cache from an unreachable HTTP store",
            "dsctl cache ds=http://127.0.0.1:9/ds --task t-http @agent",
            7,
            "127.0.0.1:9",
            {},
        ),
        ("cache with an unreadable --timeout", "dsctl cache ds={data} --timeout 10parsecs @agent", 2, "10parsecs", {}),
        ("cache with a negative --timeout", "dsctl cache ds={data} --timeout -5 @agent", 2, "-5", {}),
        (
            "cache with --bundles lacking the dataset",
            "dsctl cache other={data} --bundles {store} --task t-bundles @agent",
            3,
            "other",
            {},
        ),
        (
            "cache with endpoint_url lacking a scheme",
            "dsctl cache ds=s3://b/x --option endpoint_url=127.0.0.1:5055 --task t-ep @agent",
            2,
            "endpoint_url",
            {},
        ),
        ("cache with anon=maybe", "dsctl cache ds=s3://b/x --option anon=maybe --task t-anon @agent", 2, "anon", {}),
        (
            "cache with a misspelt option key",
            "dsctl cache ds=s3://b/x --option endpoint_urll=http://127.0.0.1:9 --task t-typo @agent",
            2,
            "endpoint_url",
            {},
        ),
        (
            "cache s3 through an unreachable endpoint",
            "dsctl cache ds=s3://b/x --option endpoint_url=http://127.0.0.1:9 --option anon=true"
            " --task t-s3 --timeout 45s @agent",
            7,
            "127.0.0.1:9",
            {"limit_s": 90},
        ),
        ("cache a task id with a slash", "dsctl cache ds={data} --task a/b @agent", 2, "a/b", {}),
        (
            "cache a second dataset set under a held task",
            "dsctl cache ds2={store} --task t-held @agent",
            4,
            "t-held",
            {},
        ),
        ("cache --from-env with DSAGENT_DATASETS unset", "dsctl cache --from-env @agent", 2, "DSAGENT_DATASETS", {}),
        (
            "cache with a source options file that does not exist",
            "dsctl cache ds={data} --source-options-file {tmp}/nofile.json @agent",
            2,
            "nofile.json",
            {},
        ),
        ("status of an unknown task", "dsctl status no-such-task @agent", 3, "no-such-task", {}),
        ("release an unknown task", "dsctl release no-such-task @agent", 3, "no-such-task", {}),
        ("evict a dataset that is not cached", "dsctl evict nosuch @agent", 3, "nosuch", {}),
        ("evict a dataset a task uses", "dsctl evict held @agent", 4, "held", {}),
        ("evict a dataset a task uses: the fix named", "dsctl evict held @agent", 4, "dsctl release", {}),
        ("evict with --timeout 0 read as no limit", "dsctl evict held --timeout 0 @agent", 4, "held", {}),
        (
            "a source on the node's metadata server",
            "dsctl cache md=http://169.254.169.254/computeMetadata/v1/ --task t-md @agent",
            2,
            "169.254.169.254",
            {},
        ),
        ("evict with nothing named", "dsctl evict @agent", 2, "--idle", {}),
        ("ls with an unknown output format", "dsctl ls -o yaml @agent", 2, "yaml", {}),
        ("ls with no agent running", "dsctl ls --socket {nosock}", 8, "agent", {}),
        ("wait without a command", "dsctl wait --from-env @agent", 2, "command", {}),
        ("wait with an unreadable --timeout", "dsctl wait --timeout soon -- true", 2, "soon", {}),
        ("gc a store that does not exist", "dsctl gc {tmp}/nostore", 3, "nostore", {}),
        ("gc with an unreadable --grace", "dsctl gc {store} --grace 5parsecs", 2, "5parsecs", {}),
        ("gc with a negative --grace", "dsctl gc {store} --grace -1h", 2, "-1h", {}),
        # -- dsctl topo / plan
        ("topo from a file that does not exist", "dsctl topo show --from {tmp}/nope.txt", 2, "nope.txt", {}),
        ("topo from a file that is not a topology", "dsctl topo show --from {file}", 2, "nvidia-smi", {}),
        ("topo with an unknown class rule", "dsctl topo show --from {file} --classes rack", 2, "rack", {}),
        ("topo best with no --count", "dsctl topo best --from {file}", 2, "count", {}),
        (
            "plan with an unreadable deadline",
            "dsctl plan --extender {extender} --params 7B --step-seconds 250ms --steps 1e5"
            " --deadline tomorrow --max-gpus 8",
            2,
            "tomorrow",
            {},
        ),
        (
            "plan with a parameter count in an unknown unit",
            "dsctl plan --extender {extender} --params 7Q --step-seconds 250ms --steps 1e5 --deadline 6h --max-gpus 8",
            2,
            "7Q",
            {},
        ),
        (
            "plan with no step time",
            "dsctl plan --extender {extender} --params 7B --steps 1e5 --max-gpus 8",
            2,
            "step-seconds",
            {},
        ),
        (
            "plan with no extender running",
            "dsctl plan --extender http://127.0.0.1:9 --params 7B --step-seconds 250ms --steps 1e5 --max-gpus 8",
            7,
            "127.0.0.1:9",
            {},
        ),
        # -- dsagent serve: the node agent's start-up
        (
            "serve a root under /proc",
            "dsagent serve --root /proc/nope",
            2,
            "/proc/nope",
            {"limit_s": 30, "smoke": True},
        ),
        ("serve a root that is a regular file", "dsagent serve --root {file}", 2, "file.txt", {"limit_s": 30}),
        (
            "serve with a capacity in an unknown unit",
            "dsagent serve --root {tmp}/r1 --capacity lots",
            2,
            "lots",
            {"limit_s": 30},
        ),
        (
            "serve with a misspelt DSAGENT_ variable",
            "dsagent serve --root {tmp}/r2",
            2,
            "DSAGENT_CAPCITY",
            {"env": {"DSAGENT_CAPCITY": "1GB"}, "limit_s": 30},
        ),
        (
            "serve in cluster mode outside a cluster",
            "dsagent serve --root {tmp}/rk --kubernetes",
            2,
            "KUBECONFIG",
            {"env": {"KUBECONFIG": "{tmp}/no-kubeconfig", "KUBERNETES_SERVICE_HOST": ""}, "limit_s": 30},
        ),
        (
            "serve with an unknown log level",
            "dsagent serve --root {tmp}/r3 --log-level verbose",
            2,
            "verbose",
            {"limit_s": 30},
        ),
        (
            "serve a local source that does not exist",
            "dsagent serve --root {tmp}/r4 --local-source {tmp}/nosrc",
            2,
            "nosrc",
            {"limit_s": 30},
        ),
        (
            "serve TCP on a port out of range",
            "dsagent serve --root {tmp}/r5 --listen 127.0.0.1:99999",
            2,
            "99999",
            {"limit_s": 30},
        ),
        (
            "serve TCP on a busy port",
            "dsagent serve --root {tmp}/r6 --listen 127.0.0.1:{busy}",
            2,
            "{busy}",
            {"limit_s": 30},
        ),
        ("serve a root another agent serves", "dsagent serve --root {tmp}/root", 2, "already serving", {"limit_s": 30}),
        (
            "serve with a bad DSAGENT_IDLE_TTL",
            "dsagent serve --root {tmp}/r7",
            2,
            "DSAGENT_IDLE_TTL",
            {"env": {"DSAGENT_IDLE_TTL": "forever"}, "limit_s": 30},
        ),
        # -- the extender and the webhook
        ("extender on a busy port", "dsctl scheduler serve --port {busy}", 2, "{busy}", {"limit_s": 30}),
        (
            "extender with a misspelt DSEXT_ variable",
            "extender",
            2,
            "DSEXT_WIEGHTS",
            {"env": {"DSEXT_WIEGHTS": "dataset=1"}, "limit_s": 30},
        ),
        (
            "extender with unreadable weights",
            "dsctl scheduler serve --weights dataset=lots",
            2,
            "lots",
            {"limit_s": 30},
        ),
        (
            "extender with a kubeconfig that does not exist",
            "dsctl scheduler serve --watch --kubeconfig {tmp}/nokube",
            2,
            "nokube",
            {"limit_s": 30},
        ),
        ("webhook without its injection file", "dsagent webhook serve", 2, "INJECTION_FILE", {"limit_s": 30}),
        (
            "webhook without its certificate",
            "dsagent webhook serve",
            2,
            "certificate",
            {"env": WEBHOOK_NO_CERT, "limit_s": 30},
        ),
        (
            "webhook with a misspelt variable",
            "dsagent webhook serve",
            2,
            "DSAGENT_WEBHOOK_PROT",
            {"env": {"DSAGENT_WEBHOOK_PROT": "8443"}, "limit_s": 30},
        ),
    ]
    return [Mistake(what, _words(command), code, says, **extra) for what, command, code, says, extra in rows]


SMOKE: dict[str, Any] = {"smoke": True}
WEBHOOK_NO_CERT = {
    "DSAGENT_WEBHOOK_INJECTION_FILE": "{tmp}/injection.json",
    "DSAGENT_WEBHOOK_CERT_FILE": "{tmp}/nocert.pem",
    "DSAGENT_WEBHOOK_KEY_FILE": "{tmp}/nokey.pem",
}
PROGRAMS = {"dsctl": DSCTL, "dsagent": DSAGENT, "extender": EXTENDER}


def _words(command: str) -> list[str]:
    words: list[str] = []
    for word in shlex.split(command):
        if word == "@agent":
            words += ["--socket", "{sock}"]
        else:
            words += PROGRAMS.get(word, [word]) if not words else [word]
    return words


def _run(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Run one command; None for the exit code when it had to be stopped."""
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
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
    task, a running extender (no watch), and a port something else listens on."""
    tmp = Path(tempfile.mkdtemp(prefix="dsmistakes-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSAGENT_", "DSEXT_"))}
    for d in ("run", "xdg", "home"):
        (tmp / d).mkdir()
    env.update(XDG_RUNTIME_DIR=str(tmp / "run"), XDG_CACHE_HOME=str(tmp / "xdg"), HOME=str(tmp / "home"), NO_COLOR="1")
    data = tmp / "data"
    for rel, size in (("a/1.bin", 3000), ("a/2.bin", 5000), ("b/3.bin", 7000)):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_bytes(os.urandom(size))
    afile = tmp / "file.txt"
    afile.write_text("not a directory, not JSON, not a topology\n")
    (tmp / "injection.json").write_text(json.dumps({"image": "dsplatform:survey"}))
    store = tmp / "store"
    for name in ("ds", "held"):
        subprocess.run(
            [*DSCTL, "pack", str(data), "--name", name, "--to", str(store)], env=env, check=True, capture_output=True
        )
    _damaged_stores(store, tmp)
    _partial_copies(data, tmp)
    sock = tmp / "root" / "dsagent.sock"
    with contextlib.ExitStack() as stack:
        extender_port = stack.enter_context(held_port())  # nobody else's until the extender listens on it
        # the survey's stores and unreachable endpoints are on loopback: allowed as an operator would
        agent_env = {**env, "DSAGENT_EGRESS_ALLOW": "127.0.0.0/8,::1"}
        agent = stack.enter_context(
            _process([*DSAGENT, "serve", "--root", str(tmp / "root"), *_sources(data, store)], agent_env)
        )
        stack.enter_context(_process([*DSCTL, "scheduler", "serve", "--port", str(extender_port)], env))
        busy = stack.enter_context(socket.socket())
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        _wait_for(lambda: sock.exists(), agent, "the agent")
        _wait_for(lambda: _accepts(extender_port), None, "the extender")
        held = [*DSCTL, "cache", f"held={data}", "--task", "t-held", "--socket", str(sock)]
        subprocess.run(held, env=env, check=True, capture_output=True, timeout=60)
        port = int(busy.getsockname()[1])
        yield World(tmp, data, store, afile, sock, tmp / "nosuch.sock", port, f"http://127.0.0.1:{extender_port}", env)
    shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _process(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _sources(*paths: Path) -> list[str]:
    return [arg for path in paths for arg in ("--local-source", str(path))]


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(ready: Callable[[], bool], proc: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise SystemExit(f"survey: {what} did not start")
        time.sleep(0.1)


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
    if code is None:
        return f"still running after {case.limit_s:.0f} s"
    # progress lines ("task t: pending ...") may precede the answer on stderr
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("task ")]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    if "Traceback" in err:
        return f"traceback (exit {code})"
    if code != case.exit:
        return f"exit {code}, documented {case.exit}: {lines[0] if lines else '(no message)'}"
    if len(errors) != 1:
        return f"not one 'PROG: error:' line: {lines[0] if lines else '(no message)'}"
    if len(lines) > 1:
        return f"{len(lines)} lines on stderr"
    if "internal error" in err.lower():
        return f"internal error: {errors[0]}"
    says = w.fill(case.says).lower()
    if says not in err.lower():
        return f"does not name {says!r}: {errors[0]}"
    return None


_ERROR_LINE = re.compile(r"^[\w.-]+: error: \S")


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
            results.append(
                {"what": case.what, "exit": code, "documented": case.exit, "stderr": err.strip(), "miss": verdict}
            )
            if verdict or args.verbose:
                mark = "ok  " if verdict is None else "MISS"
                print(f"{mark} {case.what}: {verdict or err.strip().splitlines()[0] if err.strip() else verdict}")
    clear = sum(1 for r in results if r["miss"] is None)
    print(f"clear: {clear} of {len(results)} mistakes")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if clear == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
