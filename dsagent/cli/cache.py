"""``dsctl cache / ls / evict / status / release / wait``: the agent's command line client.

Who calls it: operators on a node, and pods: the init-container runs
``dsctl cache --from-env`` (datasets from ``DSAGENT_DATASETS``, the task id from
``DSAGENT_TASK_ID``, storage options from ``DSAGENT_STORAGE_OPTIONS`` or
``DSAGENT_STORAGE_OPTIONS_<NAME>``, typically filled from Secrets), and the main container
may run ``dsctl wait --from-env -- CMD...``, which waits for the datasets and then execs
CMD. Everything goes through :class:`dsagent.api.client.AgentClient`; errors surface through
the ``dsctl`` edge as one line and their exit code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import click

from dsagent.api.client import AgentClient, operation_error
from dsagent.cli.options import (
    agent_named,
    default_socket,
    describe_agent,
    output_option,
    source_options,
    store_options,
    timeout_option,
)
from dsagent.errors import DsagentError, Forbidden, InvalidInput, NotFound, TransientError, Unauthorized
from dsagent.kube.podenv import datasets_from_env  # the init-container environment contract
from dsplatform.units import format_size
from dsplatform.wire.agenttask import TaskStatusBody

_F = TypeVar("_F", bound=Callable[..., Any])
POLL_SECONDS = 0.5


def agent_options(fn: _F) -> _F:
    """``--agent`` / ``--socket`` / ``--token``: where the agent is and the admin token."""
    fn = click.option(
        "--token", envvar="DSAGENT_ADMIN_TOKEN", help="Admin token for operator actions over TCP [DSAGENT_ADMIN_TOKEN]."
    )(fn)
    fn = click.option(
        "--socket", "socket_path", envvar="DSAGENT_SOCKET", help="The agent's unix socket [DSAGENT_SOCKET]."
    )(fn)
    fn = click.option(
        "--agent",
        "agent_url",
        envvar="DSAGENT_AGENT",
        help="The agent's TCP URL, e.g. http://127.0.0.1:7420 [DSAGENT_AGENT].",
    )(fn)
    return fn


def _client(agent_url: str | None, socket_path: str | None, token: str | None, timeout: float = 30.0) -> AgentClient:
    return AgentClient(url=agent_url, socket_path=_socket(agent_url, socket_path), token=token, timeout=timeout)


def _socket(agent_url: str | None, socket_path: str | None) -> str | None:
    """The socket dsctl talks to: the one given, else (no URL either) the local agent's."""
    if not agent_url and not socket_path:
        return str(default_socket(os.environ))
    return socket_path


# -- requests ------------------------------------------------------------------------


def parse_specs(specs: Sequence[str], bundles: str | None, *, allow_per_file: bool = False) -> list[dict[str, Any]]:
    """``NAME=SOURCE`` arguments as dataset requests."""
    if allow_per_file and not bundles:
        raise InvalidInput(
            "--allow-per-file applies only with --bundles", hint="without --bundles every copy is per file"
        )
    extra: dict[str, Any] = {"bundles": bundles} if bundles else {}
    if allow_per_file:
        extra["allowPerFile"] = True
    datasets = []
    for spec in specs:
        name, sep, source = spec.partition("=")
        if not sep or not name or not source:
            raise InvalidInput(
                f"invalid dataset {spec!r}", hint="write NAME=SOURCE, e.g. imagenet=s3://bucket/imagenet"
            )
        datasets.append({"name": name, "source": source, **extra})
    return datasets


def merged_options(source: Mapping[str, Any], store: Mapping[str, Any]) -> dict[str, Any]:
    """One storage-options dict for the agent from the source's and the store's."""
    clash = sorted(k for k in source.keys() & store.keys() if source[k] != store[k])
    if clash:
        raise InvalidInput(
            f"--source-option and --store-option disagree on {', '.join(clash)}",
            hint="the agent uses one set of storage options per dataset",
        )
    return {**source, **store}


def default_task_id(datasets: Sequence[Mapping[str, Any]]) -> str:
    """A stable id for a CLI request, so repeating the same command is the same task."""
    identity = json.dumps(sorted((d["name"], d["source"], d.get("bundles")) for d in datasets))
    user = re.sub(r"[^A-Za-z0-9._-]", "-", os.environ.get("USER", "user")) or "user"
    return f"cli-{user}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


# -- waiting -------------------------------------------------------------------------


def wait_until_done(
    client: AgentClient, task_id: str, *, timeout: float | None, show: Callable[[TaskStatusBody], None]
) -> TaskStatusBody:
    """Follow the task until every dataset is ready (returns) or one failed (raises).

    Each request is a long poll: the agent holds it until the task's work ends, at most
    :data:`POLL_SECONDS` (the progress shown is that old at most), so the answer that
    says ready comes when the task is, not up to a poll interval later. An answer still
    pending that came back sooner (an agent that predates the long poll answers at once)
    is followed by a sleep for the rest of the interval, never by a busy loop."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        hold = POLL_SECONDS if deadline is None else max(0.0, min(POLL_SECONDS, deadline - asked))
        record = client.get_task(task_id, wait=hold)
        show(record)
        if record["state"] == "ready":
            return record
        if record["state"] == "failed":
            raise _failure(record)
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise TransientError(
                f"task {task_id!r} not ready after {timeout:g}s", hint=f"check it with 'dsctl status {task_id}'"
            )
        if now - asked < hold:
            time.sleep(hold - (now - asked))


def _failure(record: TaskStatusBody) -> DsagentError:
    failed = next(d for d in record["datasets"] if d["state"] == "failed")
    error = failed.get("error") or {}
    from dsagent.api.client import _BY_CODE

    cls = _BY_CODE.get(str(error.get("code")), DsagentError)
    return cls(f"caching {failed['name']} failed: {error.get('message', 'unknown error')}", hint=error.get("hint"))


class ProgressView:
    """A one-line live bar on a terminal; a line per state change otherwise."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last: str | None = None

    def __call__(self, record: TaskStatusBody) -> None:
        line = describe(record)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            if record["state"] != "pending":
                self.stream.write("\n")
        elif line.split("  ")[0] != (self._last or "").split("  ")[0] or record["state"] != "pending":
            self.stream.write(line + "\n")
        self.stream.flush()
        self._last = line


def describe(record: TaskStatusBody) -> str:
    datasets = record["datasets"]
    total = sum(d["sizeBytes"] for d in datasets)
    done = sum(d["bytesDone"] for d in datasets)
    rate = sum(d["rateBytesPerSecond"] for d in datasets)
    states = ", ".join(f"{d['name']} {d['state']}" for d in datasets)
    if record["state"] == "pending" and total:
        width = 24
        filled = int(width * done / total) if total else width
        etas = [d["etaSeconds"] for d in datasets if d["etaSeconds"] is not None and d["bytesDone"] < d["sizeBytes"]]
        # every byte is in: what is left is the check by digest and the commit, not a download
        eta = f" eta {max(etas):.0f}s" if etas else " verifying" if done >= total else ""
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] "
            f"{format_size(done)}/{format_size(total)} {format_size(rate)}/s{eta}  {states}"
        )
    return f"task {record['task']}: {record['state']}  {states}"


# -- commands ------------------------------------------------------------------------


@click.command()
@click.argument("specs", nargs=-1, metavar="NAME=SOURCE...")
@click.option(
    "--bundles", help="Bundle store URL holding the packed datasets; a dataset it lacks fails (exit 3, bundle_missing)."
)
@click.option(
    "--allow-per-file",
    is_flag=True,
    help="When the --bundles store lacks a dataset, copy its source file by file (slow) instead of failing.",
)
@click.option("--task", "task_id", envvar="DSAGENT_TASK_ID", help="Task id (a pod UID, a job id) [DSAGENT_TASK_ID].")
@click.option("--from-env", is_flag=True, help="Read the datasets from DSAGENT_DATASETS (init-container mode).")
@click.option(
    "--wait/--no-wait", default=True, show_default=True, help="Wait with progress until the datasets are ready."
)
@timeout_option("Give up waiting after this long, e.g. 90s, 10m.")
@output_option
@source_options
@store_options
@agent_options
def cache(
    specs: tuple[str, ...], bundles: str | None, allow_per_file: bool, task_id: str | None, from_env: bool, wait: bool,
    timeout: float | None,
    output: str,
    source_opts: dict[str, Any], store_opts: dict[str, Any], agent_url: str | None, socket_path: str | None,
    token: str | None,
) -> None:  # fmt: skip
    """Cache datasets on this node for a task (idempotent per task).

    The agent reads a dataset's source and its bundle store with one set of storage
    options, so --source-option and --store-option are merged (a key given both ways
    must agree)."""
    options = merged_options(source_opts, store_opts)
    if from_env and (specs or bundles or allow_per_file):
        raise InvalidInput(
            "give either NAME=SOURCE arguments (with --bundles, --allow-per-file) or --from-env, not both"
        )
    datasets = datasets_from_env(os.environ) if from_env else parse_specs(specs, bundles, allow_per_file=allow_per_file)
    if options:
        datasets = [{**d, "storage_options": {**dict(d.get("storage_options") or {}), **options}} for d in datasets]
    if not datasets:
        raise InvalidInput("no datasets given", hint="dsctl cache NAME=SOURCE... or dsctl cache --from-env")
    if from_env and not task_id:
        raise InvalidInput("DSAGENT_TASK_ID is not set", hint="set it from the pod UID (downward API: metadata.uid)")
    task_id = task_id or default_task_id(datasets)
    socket_path = _socket(agent_url, socket_path)  # resolved once: the client and the output name it
    with _client(agent_url, socket_path, token) as client:
        try:
            # With --wait the agent holds the first answer up to one poll interval: a dataset
            # ready by then (cached already, or small) returns at once, not a poll later.
            record = client.submit_task(task_id, datasets, wait=POLL_SECONDS if wait else 0.0)
            if wait and record["state"] == "pending":
                record = wait_until_done(
                    client, task_id, timeout=timeout, show=ProgressView() if output == "text" else lambda r: None
                )
            elif record["state"] == "failed":
                raise _failure(record)
        except KeyboardInterrupt:
            raise click.Abort(
                f"\ndsctl: interrupted: the agent goes on caching for task {task_id} and keeps the data until "
                f"the task is released or its lease ends; release it now with 'dsctl release {task_id}'"
            ) from None
    agent = agent_named(socket_path, agent_url, os.environ)
    if output == "json":
        click.echo(json.dumps({**record, "agent": agent}, indent=2))
        return
    _print_record(record, output)
    click.echo(
        f"{describe_agent(agent)}; task {task_id} holds its datasets until 'dsctl release {task_id}' or its lease ends"
    )


@click.command()
@click.option(
    "--from-env",
    is_flag=True,
    required=True,
    help="Task id from DSAGENT_TASK_ID (and DSAGENT_DATASETS to submit if needed).",
)
@timeout_option("Give up after this long, e.g. 90s, 10m.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@agent_options
def wait(
    from_env: bool,
    timeout: float | None,
    command: tuple[str, ...],
    agent_url: str | None,
    socket_path: str | None,
    token: str | None,
) -> None:
    """Wait for the task's datasets, then exec COMMAND (the training command)."""
    task_id = os.environ.get("DSAGENT_TASK_ID")
    if not task_id:
        raise InvalidInput("DSAGENT_TASK_ID is not set", hint="set it from the pod UID (downward API: metadata.uid)")
    with _client(agent_url, socket_path, token) as client:
        if os.environ.get("DSAGENT_DATASETS"):  # idempotent: a no-op when the init-container submitted it
            client.submit_task(task_id, datasets_from_env(os.environ))
        wait_until_done(client, task_id, timeout=timeout, show=ProgressView())
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], list(command))
    except OSError as exc:
        raise InvalidInput(f"cannot run {command[0]!r}: {exc.strerror}") from exc


@click.command()
@click.argument("task_id")
@output_option
@agent_options
def status(task_id: str, output: str, agent_url: str | None, socket_path: str | None, token: str | None) -> None:
    """Show where a task's datasets stand."""
    with _client(agent_url, socket_path, token) as client:
        _print_record(client.get_task(task_id), output)


@click.command()
@output_option
@agent_options
def tasks(output: str, agent_url: str | None, socket_path: str | None, token: str | None) -> None:
    """List the tasks holding datasets here (a pod sees only its own): the ids 'dsctl release' takes."""
    with _client(agent_url, socket_path, token) as client:
        records = client.tasks()
    if output == "json":
        click.echo(json.dumps({"tasks": records}, indent=2))
        return
    rows = [("TASK", "STATE", "DATASETS", "LEASE UNTIL")]
    for record in records:
        names = ",".join(d["name"] for d in record["datasets"])
        rows.append((record["task"], record["state"], names or "-", record["leaseUntil"] or "-"))
    _echo_table(rows)


@click.command()
@click.argument("task_id")
@timeout_option("Stop waiting after this long (exit 14; the release goes on), e.g. 90s, 10m. Default: wait until done.")
@output_option
@agent_options
def release(
    task_id: str, timeout: float | None, output: str, agent_url: str | None, socket_path: str | None,
    token: str | None,
) -> None:  # fmt: skip
    """Release a task: its datasets are no longer in use and become evictable."""
    with _client(agent_url, socket_path, token) as client:
        result = _follow(
            output, lambda show: client.release_task(task_id, timeout=timeout, progress=show), f"releasing {task_id}"
        )
    if output == "json":
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"released task {task_id}")


@click.command("ls")
@output_option
@agent_options
def ls(output: str, agent_url: str | None, socket_path: str | None, token: str | None) -> None:
    """List the cached datasets, and the next tasks being prepared here (reserved, fetching)."""
    socket_path = _socket(agent_url, socket_path)  # resolved once: the client and the output name it
    with _client(agent_url, socket_path, token) as client:
        listing = client.datasets()
        try:
            preparations = client.preparations()
        except (NotFound, Forbidden, Unauthorized):  # an agent without them, or not an operator
            preparations = []
    agent = agent_named(socket_path, agent_url, os.environ)
    if output == "json":
        click.echo(json.dumps({**listing, "preparations": preparations, "agent": agent}, indent=2))
        return
    rows = [("NAME", "DIGEST", "STATE", "SIZE", "FILES", "IN USE", "LAST USED")]
    for d in listing["datasets"]:
        rows.append(
            (
                d["name"],
                d["digest"][:12],
                d["state"],
                format_size(d["sizeBytes"]),
                str(d["files"]),
                "yes" if d["inUse"] else "no",
                d["lastUsed"] or "-",
            )
        )
    _echo_table(rows)
    reserved = sum(p["reservedBytes"] for p in preparations)
    click.echo(
        f"cache space: used {format_size(listing['usedBytes'])}, free {format_size(listing['freeBytes'])} "
        f"of {format_size(listing['capacityBytes'])}"
        + (f", {format_size(reserved)} reserved for next tasks" if reserved else "")
        + " (SIZE is the data; space counts blocks and per-file overhead)"
    )
    if preparations:
        _prepared_table(preparations)
    click.echo(describe_agent(agent))


def _prepared_table(preparations: list[dict[str, Any]]) -> None:
    """The next tasks prepared on this node (docs/design.md#next-job-preparation)."""
    rows = [("PREPARED FOR", "PHASE", "STATE", "RESERVED", "MISSING", "DATASETS", "WAITING")]
    for p in preparations:
        missing = p.get("missingBytes")
        rows.append(
            (
                p["task"],
                str(p["phase"]),
                p["state"],
                format_size(p["reservedBytes"]),
                "-" if missing is None else format_size(missing),
                ",".join(d["name"] for d in p["datasets"]) or "-",
                p.get("waiting") or "",
            )
        )
    click.echo("")
    _echo_table(rows)


@click.command()
@click.argument("names", nargs=-1)
@click.option("--idle", is_flag=True, help="Evict datasets unused for longer than the agent's idle TTL.")
@click.option("--all-unused", is_flag=True, help="Evict every dataset no task uses.")
@click.option("--dry-run", is_flag=True, help="Show what would be evicted.")
@click.option("--force", is_flag=True, help="Evict named datasets even while tasks use them.")
@timeout_option(
    "Stop waiting after this long (exit 14; the eviction goes on), e.g. 90s, 10m. Default: wait until done."
)
@output_option
@agent_options
def evict(
    names: tuple[str, ...], idle: bool, all_unused: bool, dry_run: bool, force: bool, timeout: float | None,
    output: str, agent_url: str | None, socket_path: str | None, token: str | None,
) -> None:  # fmt: skip
    """Evict datasets: by NAME, --idle ones, or --all-unused.

    Deleting a large dataset takes a while: the agent carries the eviction out as an
    operation, and dsctl waits for it with progress (or until --timeout; Ctrl-C stops only
    the waiting)."""
    if sum((bool(names), idle, all_unused)) != 1:
        raise InvalidInput("give dataset names, --idle or --all-unused (exactly one of them)")
    mode = "idle" if idle else "unused" if all_unused else "names"
    what = f"evicting {', '.join(names)}" if names else f"evicting {'idle' if idle else 'unused'} datasets"
    socket_path = _socket(agent_url, socket_path)  # resolved once: the client and the output name it
    with _client(agent_url, socket_path, token) as client:
        result = _follow(
            output,
            lambda show: client.evict(
                mode=mode, names=names, force=force, dry_run=dry_run, timeout=timeout, progress=show
            ),
            what,
        )
    agent = agent_named(socket_path, agent_url, os.environ)
    if output == "json":
        click.echo(json.dumps({**result, "agent": agent}, indent=2))
        return
    verb = "would evict" if dry_run else "evicted"
    # sizes here are cache space (blocks and per-file overhead), as in ls's last line, not
    # the data size of ls's SIZE column: a dataset of many small files takes several times it
    for victim in result["evicted"]:
        click.echo(
            f"{verb} {victim['name']}@{victim['digest'][:12]} ({format_size(victim['sizeBytes'])} of cache space)"
        )
    freed = "would free" if dry_run else "freed"
    click.echo(
        f"{verb} {len(result['evicted'])} dataset version(s), "
        f"{freed} {format_size(result['freedBytes'])} of cache space ({describe_agent(agent)})"
    )


@click.command()
@click.argument("op_id", metavar="OPERATION")
@click.option(
    "--wait/--no-wait", default=False, show_default=True, help="Wait until the operation has finished, with progress."
)
@timeout_option("With --wait: stop waiting after this long.")
@output_option
@agent_options
def operation(
    op_id: str, wait: bool, timeout: float | None, output: str, agent_url: str | None, socket_path: str | None,
    token: str | None,
) -> None:  # fmt: skip
    """Show an eviction or release the agent carries out (the id dsctl printed)."""
    show = OperationProgress() if output == "text" and wait else None
    with _client(agent_url, socket_path, token) as client:
        op = client.follow_operation(op_id, timeout=timeout, progress=show) if wait else client.operation(op_id)
    if show is not None:
        show.done()
    if output == "json":
        click.echo(json.dumps(op, indent=2))
    else:
        click.echo(
            f"operation {op['id']}: {op['kind']} {op['target']}: {op['state']} after {op['elapsedSeconds']:.0f}s"
        )
    if op["state"] == "failed":  # its own error's line and exit code: a failed operation never exits 0
        raise operation_error(op)


class OperationProgress:
    """A live line while an operation runs: what, for how long, its id (for ``dsctl operation``)."""

    def __init__(self, what: str = "", stream: Any = None) -> None:
        self.what = what
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False
        self.last_op: dict[str, Any] | None = None

    def __call__(self, op: dict[str, Any]) -> None:
        self.last_op = op
        what = self.what or f"{op['kind']} {op['target']}"
        line = f"{what}: running {float(op.get('elapsedSeconds') or 0):.0f}s (operation {op['id']})"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
        elif not self.shown:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.tty and self.shown:
            self.stream.write("\n")
            self.stream.flush()
        self.shown = False


Follow = Callable[[Callable[[dict[str, Any]], None]], dict[str, Any]]


def _follow(output: str, call: Follow, what: str) -> dict[str, Any]:
    """Run an operation ``call`` with a progress line (text output), and on Ctrl-C say that
    the action goes on at the agent and how to follow it."""
    show = OperationProgress(what)
    try:
        return call(show if output == "text" else lambda op: setattr(show, "last_op", op))
    except KeyboardInterrupt:
        show.done()
        op = show.last_op
        if op is None:  # interrupted before the agent answered: it may or may not have started
            raise click.Abort(f"dsctl: interrupted: {what} may go on at the agent (check with 'dsctl ls')") from None
        raise click.Abort(
            f"dsctl: interrupted: {what} goes on at the agent (operation {op['id']}); "
            f"follow it with 'dsctl operation {op['id']} --wait'"
        ) from None
    finally:
        show.done()


def _echo_table(rows: Sequence[Sequence[str]]) -> None:
    """``rows`` (the header first) in left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _print_record(record: TaskStatusBody, output: str) -> None:
    if output == "json":
        click.echo(json.dumps(record, indent=2))
        return
    click.echo(f"task {record['task']}: {record['state']} (lease until {record['leaseUntil']})")
    for d in record["datasets"]:
        where = (
            d["path"]
            or (d["error"] or {}).get("message")
            or f"{format_size(d['bytesDone'])}/{format_size(d['sizeBytes'])}"
        )
        digest = (d["digest"] or "-")[:12]
        click.echo(f"  {d['name']:<20} {digest:<12} {d['state']:<9} {format_size(d['sizeBytes']):>9}  {where}")


__all__ = [
    "cache", "datasets_from_env", "default_task_id", "evict", "ls", "operation", "parse_specs", "release", "status",
    "tasks", "wait",
]  # fmt: skip
