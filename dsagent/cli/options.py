"""The one option vocabulary of ``dsctl``: output format, source options, store options.

Who calls it: every command module of :mod:`dsagent.cli` that prints a result or reads a
dataset source or a bundle store (``digest``, ``pack``, ``unpack``, ``verify``, ``cache``,
``status``, ``ls``). What it owns: the spellings, so that they are the same everywhere:

- ``-o/--output text|json``: the output format (kubectl's habit);
- ``--source-option KEY=VALUE`` (repeatable) and ``--source-options-file FILE.json``:
  fsspec storage options of the dataset source;
- ``--store-option KEY=VALUE`` (repeatable) and ``--store-options-file FILE.json``:
  fsspec storage options of the bundle store;
- durations (``--timeout``): :data:`DURATION`, the platform's syntax (``30s``, ``5m``,
  plain seconds).

Reading storage options is also where ``dsctl`` reads the storage timeouts
(``DSAGENT_STORAGE_CONNECT_TIMEOUT``, ``..._READ_TIMEOUT``, ``DSAGENT_SOURCE_TIMEOUT``:
:class:`dsagent.format.storagesettings.StorageSettings`) and hands them to the format layer, which
reads no environment: every command that opens a store goes through :func:`storage_options`.

Values of ``KEY=VALUE`` are parsed as JSON when they are JSON (``anon=true``,
``config_kwargs={"region_name": "eu-west-1"}``), else taken as strings. Flags win over the
file. Decision: ``--option`` (the old spelling of ``--source-option`` in ``digest`` and
``pack``) and ``--json`` (``digest``) stay as hidden aliases; ``-o`` is the output format
only, so ``-o KEY=VALUE`` fails with a usage error naming the choices.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from dsagent.errors import InvalidInput
from dsplatform.paths import agent_default_root, agent_records_dir
from dsplatform.units import UnitError, parse_duration

_F = TypeVar("_F", bound=Callable[..., Any])


def storage_options(
    pairs: Sequence[str], files: Sequence[str] = (), *, flag: str = "--source-option"
) -> dict[str, Any]:
    """fsspec storage options from JSON ``files`` (in order), then ``KEY=VALUE`` ``pairs``:
    what the user gave (``dsctl cache`` sends them to the agent; the storage commands
    add the settings' bounds with :func:`dsagent.cli.bundlework.options_for_stores`)."""
    options: dict[str, Any] = {}
    for name in files:
        try:
            loaded = json.loads(Path(name).read_text(encoding="utf-8"))
        except OSError as exc:
            raise InvalidInput(f"cannot read storage options file {name!r}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise InvalidInput(f"storage options file {name!r} is not JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise InvalidInput(
                f"storage options file {name!r} must hold a JSON object",
                hint='e.g. {"endpoint_url": "http://minio:9000"}',
            )
        options.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(
                f"storage option {pair!r} is not KEY=VALUE",
                hint=f"e.g. {flag} endpoint_url=http://minio:9000 {flag} anon=true",
            )
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def default_socket(environ: Mapping[str, str]) -> Path:
    """Where the local agent listens (``dsctl``'s default for ``--socket``): ``DSAGENT_SOCKET``,
    else ``DSAGENT_ROOT/dsagent.sock``, else the one running agent the user's records name
    (:func:`~dsplatform.paths.agent_records_dir`: ``dsagent serve --root X`` is found without
    settings), else the default root's. With several agents running and none named, dsctl
    does not guess: InvalidInput lists them, each with the setting that picks it."""
    env = environ
    if env.get("DSAGENT_SOCKET"):
        return Path(env["DSAGENT_SOCKET"])
    if env.get("DSAGENT_ROOT"):
        return Path(env["DSAGENT_ROOT"]) / "dsagent.sock"
    running = running_agents(env)
    if len(running) > 1:
        choices = "; ".join(f"root {a['root']} (DSAGENT_ROOT={a['root']})" for a in running)
        raise InvalidInput(
            f"{len(running)} agents are running for this user and none is named: {choices}",
            hint="pick one: DSAGENT_ROOT=ROOT or --socket PATH (dsctl answers for one agent at a time)",
        )
    if running:
        return Path(running[0]["socket"])
    return agent_default_root(env) / "dsagent.sock"


def running_agents(environ: Mapping[str, str]) -> list[dict[str, str]]:
    """The user's recorded agents whose socket answers, by root (stale records are skipped)."""
    from dsplatform.serving import unix_socket_answers

    found = []
    try:
        records = sorted(agent_records_dir(environ).glob("*.json"))
    except OSError:
        return []
    for path in records:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        sock = record.get("socket") if isinstance(record, dict) else None
        if isinstance(sock, str) and isinstance(record.get("root"), str) and unix_socket_answers(sock):
            found.append({"root": record["root"], "socket": sock})
    return found


def agent_named(socket_path: str | None, agent_url: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The agent dsctl talks to, as its output names it: its socket (or URL) and its root
    (from the user's records, else the socket's folder when it is a root's default)."""
    if agent_url:
        return {"url": agent_url}
    sock = str(Path(socket_path).absolute()) if socket_path else str(default_socket(environ))
    root = next((a["root"] for a in running_agents(environ) if a["socket"] == sock), None)
    if root is None and Path(sock).name == "dsagent.sock":
        root = str(Path(sock).parent)
    return {"socket": sock, **({"root": root} if root else {})}


def describe_agent(agent: Mapping[str, str]) -> str:
    """``agent`` (:func:`agent_named`) in one phrase for the human output."""
    if "url" in agent:
        return f"agent at {agent['url']}"
    root = f" (root {agent['root']})" if "root" in agent else ""
    return f"agent at {agent['socket']}{root}"


def output_option(fn: _F) -> _F:
    """``-o/--output text|json``."""
    return click.option(
        "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True, help="Output format."
    )(fn)


def _options_pair(kind: str, what: str, example: str, *aliases: str) -> Callable[[_F], _F]:
    """``--KIND-option KEY=VALUE`` (repeatable) and ``--KIND-options-file``, read by
    :func:`storage_options` into the command's one parameter ``KIND_opts``."""
    flag = f"--{kind}-option"

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def given(*args: Any, **kwargs: Any) -> Any:
            pairs, files = kwargs.pop(f"{kind}_option_pairs"), kwargs.pop(f"{kind}_options_files")
            return fn(*args, **kwargs, **{f"{kind}_opts": storage_options(pairs, files, flag=flag)})

        wrapped: _F = cast(_F, given)
        wrapped = click.option(
            f"--{kind}-options-file",
            f"{kind}_options_files",
            multiple=True,
            metavar="FILE.json",
            help=f"JSON object of fsspec storage options for the {what}.",
        )(wrapped)
        return click.option(
            flag,
            *aliases,
            f"{kind}_option_pairs",
            multiple=True,
            metavar="KEY=VALUE",
            help=f"fsspec storage option for the {what} (repeatable){example}.",
        )(wrapped)

    return decorate


#: ``--source-option KEY=VALUE`` (repeatable; hidden alias ``--option``) and ``--source-options-file``
source_options = _options_pair("source", "source", ", e.g. endpoint_url=http://minio:9000", "--option")
#: ``--store-option KEY=VALUE`` (repeatable) and ``--store-options-file``
store_options = _options_pair("store", "bundle store", "")


class DurationType(click.ParamType[float]):
    """A duration in the platform's one syntax (:func:`dsplatform.units.parse_duration`):
    ``30s``, ``250ms``, ``5m``, ``2h``, ``7d``, or plain seconds (``90``, ``1.5``) as
    before; anything else is a usage error (exit 2) naming the syntax."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(value)
        except UnitError:
            self.fail(
                f"{value!r} is not a duration: use seconds or a number with ms, s, m, h or d, e.g. 30s, 5m", param, ctx
            )


#: ``--timeout`` and every other duration option
DURATION = DurationType()


def timeout_option(help: str) -> Callable[[_F], _F]:  # noqa: A002 - click's name
    """``--timeout DURATION`` (default: none), in the platform's duration syntax; ``0``, as
    most tools read it, means no limit (and the help says so)."""

    def no_limit_at_zero(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
        return None if value == 0 else value

    return click.option(
        "--timeout",
        type=DURATION,
        default=None,
        metavar="DURATION",
        callback=no_limit_at_zero,
        help=f"{help} 0: no limit.",
    )


__all__ = [
    "DURATION",
    "DurationType",
    "agent_named",
    "default_socket",
    "describe_agent",
    "running_agents",
    "output_option",
    "source_options",
    "storage_options",
    "timeout_option",
    "store_options",
]
