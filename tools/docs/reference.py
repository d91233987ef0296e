"""The reference pages of the documentation, written from the code.

``python tools/docs/reference.py`` writes :data:`PAGES` under ``docs/reference/``, where they
are committed so that their links work where most people read them, in the repository as in
the site; ``tests/docs/test_reference.py`` fails while a committed page differs from what the
code writes, so the pages cannot drift from what they describe: the commands from click, the
environment variables from the pydantic-settings classes, the metrics from each component's
Prometheus registry, the exit codes from the error trees under
:class:`dsplatform.errors.PlatformError`, and the Helm values from the chart's
``values.schema.json`` (defaults from ``values.yaml``, descriptions from its comments).
``tests/docs/test_reference.py`` checks what each page must contain.

Nothing here is hand-kept but :data:`EXIT_MEANINGS`, one line per exit code: a code that an
error class carries and that has no line here fails the build.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import json
import pkgutil
import textwrap
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import yaml

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("dsplatform", "dsagent", "scheduler_plugin", "gpu_topology")
CHART = REPO / "charts" / "dsplatform"

GENERATED = "<!-- Written from the code by python tools/docs/reference.py; edit the code, not this page. -->\n\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    parts = text.split("`")  # outside code spans, < and > are text, not HTML
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


# -- commands -----------------------------------------------------------------------------------

PROGRAMS = (("dsctl", "dsagent.cli:cli"), ("dsagent", "dsagent.cli.agent:agent"))


def _load(target: str) -> Any:
    module, attr = target.split(":", 1)
    return getattr(importlib.import_module(module), attr)


def _commands(command: click.Command, ctx: click.Context) -> Iterator[tuple[click.Context, click.Command]]:
    yield ctx, command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx, max_content_width=100))


def cli_page() -> str:
    out = ["# Commands", "", GENERATED.rstrip(), ""]
    out.append(
        "Every command prints one line on stderr and exits with a documented code when it fails "
        "([Exit codes](exit-codes.md)); `-h` or `--help` prints the same text as below."
    )
    for prog, target in PROGRAMS:
        root = _load(target)
        out += ["", f"## `{prog}`", ""]
        # the root's context settings (-h besides --help), as the command line builds them
        top = click.Context(root, info_name=prog, max_content_width=100, **root.context_settings)
        for ctx, command in _commands(root, top):
            path = ctx.command_path
            if path != prog:
                out += [f"### `{path}`", ""]
            out += ["```text", command.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(out)


# -- settings -----------------------------------------------------------------------------------

# (title, class, who reads it); each class's fields with their variables
SETTINGS = (
    (
        "The node agent (`dsagent serve`)",
        "dsagent.cache.settings:Settings",
        "the agent; `dsctl` reads the storage timeouts",
    ),
    ("Cluster mode of the agent", "dsagent.nodeagent.clustersettings:ClusterSettings", "the agent with `--kubernetes`"),
    ("The webhook", "dsagent.webhook.server:WebhookSettings", "`dsagent webhook serve`"),
    ("GPU classes in the webhook", "dsagent.webhook.gpurequest:GpuClassSettings", "the webhook"),
    (
        "The Dataset controller",
        "dsagent.controller.controllersettings:ControllerSettings",
        "`python -m dsagent.controller`",
    ),
    ("The scheduler extender", "scheduler_plugin.settings:Settings", "`python -m scheduler_plugin`"),
)


def _field_comments(cls: type) -> dict[str, str]:
    """The comments written beside each field of ``cls`` and its bases: the full-line comments
    right above a field and the one at the end of its line(s)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.split(".")[0] not in PACKAGES:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
        lines = source.splitlines()
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                alone = not lines[row - 1][:col].strip()
                comments[row] = (token.string.lstrip("#").strip(), alone)
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node in body.body:
            if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
                continue
            above: list[str] = []
            row = node.lineno - 1
            while row in comments and comments[row][1]:
                above.insert(0, comments[row][0])
                row -= 1
            beside = [comments[r][0] for r in range(node.lineno, (node.end_lineno or node.lineno) + 1) if r in comments]
            text = " ".join(part for part in [*above, *[b for b in beside if b]] if not part.startswith("---"))
            found[node.target.id] = text
    return found


def _annotations(cls: type) -> dict[str, str]:
    """Each field's annotation as written in the source (``Duration``, ``Size | None``)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.split(".")[0] not in PACKAGES:
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        except (OSError, TypeError):
            continue
        assert isinstance(body, ast.ClassDef)
        for node in body.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found[node.target.id] = ast.unparse(node.annotation)
    return found


def _default(field: Any) -> str:
    import socket

    factory = field.default_factory
    if factory is socket.gethostname:
        return "the host name"
    if factory is not None:
        try:
            value = factory()
        except Exception:  # noqa: BLE001 - a default computed at start-up: say so
            return "computed at start-up"
        if isinstance(value, Path):
            return "computed at start-up"
    else:
        value = field.default
    if value is None:
        return ""
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, (tuple, list, frozenset)):
        return f"`{','.join(map(str, value))}`" if value else ""
    if isinstance(value, dict):
        return f"`{json.dumps(value, separators=(',', ':'))}`" if value else ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def settings_page() -> str:
    from dsplatform.settings import _from_env

    out = ["# Settings", "", GENERATED.rstrip(), ""]
    out.append(
        "Every process reads its settings once at start-up from environment variables (the "
        "command's flags win) and refuses to start on a bad or unknown variable of its prefix, "
        "naming every one in one line (exit 2). Sizes take units (`10GB`, `1.5TiB`), durations "
        "take `90`, `30s`, `10m`, `2h`, `7d`; flags take `1`/`0`, `true`/`false`, `on`/`off`."
    )
    for title, target, reader in SETTINGS:
        cls = _load(target)
        comments, annotations = _field_comments(cls), _annotations(cls)
        out += ["", f"## {title}", "", f"Read by {reader} (`{cls.__module__}.{cls.__name__}`).", ""]
        out += ["| variable | type | default | meaning |", "|---|---|---|---|"]
        for name, field in cls.model_fields.items():
            if not _from_env(field):
                continue
            out.append(
                f"| `{cls.env_name(name)}` | {_cell(annotations.get(name, ''))} | {_cell(_default(field))} "
                f"| {_cell(field.description or comments.get(name, ''))} |"
            )
    return "\n".join(out) + "\n"


# -- metrics ------------------------------------------------------------------------------------

REGISTRIES: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    (
        "The node agent",
        "dsagent.cache.metrics:Metrics",
        lambda cls: _agent_metrics(cls(protocols=("file", "http", "s3"))),
    ),
    ("The Dataset controller", "dsagent.controller.controllermetrics:ControllerMetrics", lambda cls: cls()),
    ("The webhook", "dsagent.webhook.admissionmetrics:WebhookMetrics", lambda cls: cls()),
    ("The scheduler extender", "scheduler_plugin.metrics:ExtenderMetrics", lambda cls: cls()),
)


def _agent_metrics(metrics: Any) -> Any:
    """The agent's metrics with those cluster mode adds to its registry (its writes of its state)."""
    from dsagent.nodeagent.statewrites import StateWriteMetrics

    StateWriteMetrics(metrics)
    return metrics


SUFFIX = {"counter": "_total", "histogram": "", "gauge": "", "summary": "", "info": "_info"}


def metrics(target: str, make: Callable[[Any], Any]) -> list[tuple[str, str, list[str], str]]:
    """(exposed name, type, labels, help) of every metric in the registry of one component."""
    registry = make(_load(target)).registry
    rows = []
    by_name = getattr(registry, "_names_to_collectors", {})
    for metric in registry.collect():
        labels = sorted({key for sample in metric.samples for key in sample.labels} - {"le", "quantile"})
        if not labels:
            collector = by_name.get(metric.name) or by_name.get(metric.name + SUFFIX.get(metric.type, ""))
            labels = list(getattr(collector, "_labelnames", ()))
        rows.append((metric.name + SUFFIX.get(metric.type, ""), metric.type, labels, metric.documentation))
    return rows


def metrics_page() -> str:
    out = ["# Metrics", "", GENERATED.rstrip(), ""]
    out.append(
        "Every component serves Prometheus text at `GET /metrics` from a registry of its own; "
        "no metric has a `*_created` twin. What each is for, and the alerts built on them: "
        "[Metrics and alerts](../operator-guide/monitoring.md)."
    )
    for title, target, make in REGISTRIES:
        out += ["", f"## {title}", "", "| metric | type | labels | what |", "|---|---|---|---|"]
        for name, kind, labels, doc in metrics(target, make):
            label_text = ", ".join(f"`{label}`" for label in labels)
            out.append(f"| `{name}` | {kind} | {label_text} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


# -- exit codes ---------------------------------------------------------------------------------

EXIT_MEANINGS = {
    0: "success",
    1: "an unexpected error: a bug, or a catalog that cannot be written (`DSCTL_DEBUG=1` shows a traceback)",
    2: "bad input: a name, size, URL, flag, setting or request; also command-line usage errors",
    3: "no such dataset, task, manifest, bundle, bucket or object",
    4: "a conflict: dataset in use, task already holds another set, target directory not empty",
    5: "digest mismatch; a truncated, corrupt or unsafe bundle",
    6: "cannot free enough space (the message gives the numbers)",
    7: "transient, worth retrying: the store, a peer or the API server unreachable or failing",
    8: "dsctl could not reach the local agent",
    9: "an action this caller may not take (an operator action without the admin token, a pod "
    "acting on another pod's task); the Kubernetes API refused the service account",
    10: "a GPU topology backend cannot run here (the message says what to install)",
    11: "the store has no credentials from us, or refused them",
    12: "the store accepted the credentials but refused the action",
    13: "the node's cache disk failed a write, rename, fsync or mkdir: the node's fault, not the source's",
    14: "dsctl stopped waiting (`--timeout`) for an eviction or release the agent goes on with: not a failure, "
    "nothing to retry; follow it with `dsctl operation ID`. Only a running operation gives 14: a refused or "
    "failed one exits with its own error's code (`dsctl operation ID` too), and `--timeout 0` means no limit",
    15: "the version asked for is gone for good: the store holds another version of the name now "
    "(a pod pinned to it at admission must be created again)",
    130: "interrupted (Ctrl-C)",
}


def error_classes() -> list[type]:
    """Every class under :class:`dsplatform.errors.PlatformError` in the packages, each module
    imported first (error classes live beside their code); modules whose optional dependency
    is missing are skipped."""
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:
                continue
    from dsplatform.errors import PlatformError

    found: dict[type, None] = {}
    todo: list[type] = [PlatformError]
    while todo:
        cls = todo.pop()
        if cls not in found and cls.__module__.split(".")[0] in PACKAGES:
            found[cls] = None
            todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: (c.exit_code, c.code, c.__module__, c.__name__))


def _summary(cls: type) -> str:
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    first = doc.split("\n\n", 1)[0]
    return " ".join(first.split())


def exit_codes_page() -> str:
    classes = error_classes()
    missing = sorted({cls.exit_code for cls in classes} - set(EXIT_MEANINGS))
    if missing:
        raise ValueError(f"exit codes without a line in tools/docs/reference.py EXIT_MEANINGS: {missing}")
    out = ["# Exit codes", "", GENERATED.rstrip(), ""]
    out.append(
        "`dsctl` and `dsagent` exit with one of these codes and one line on stderr. The agent's "
        "API answers the same errors with the HTTP status and the JSON `code` shown (body "
        '`{"code", "message", "hint"?, "details"?}`); the CSI node plugin and the device plugin '
        "answer with the gRPC status each error class carries."
    )
    out += ["", "| exit | HTTP | code | meaning |", "|---|---|---|---|"]
    for exit_code, meaning in EXIT_MEANINGS.items():
        members = [cls for cls in classes if cls.exit_code == exit_code]
        statuses = sorted({cls.http_status for cls in members})
        if exit_code == 0:
            statuses_text = "2xx"
        else:
            statuses_text = ", ".join(map(str, statuses))
        codes = ", ".join(f"`{code}`" for code in dict.fromkeys(cls.code for cls in members))
        out.append(f"| {exit_code} | {statuses_text} | {codes} | {_cell(meaning)} |")
    out += ["", "## Every error", "", "Each error class with its code, statuses and what it means."]
    for exit_code in EXIT_MEANINGS:
        members = [cls for cls in classes if cls.exit_code == exit_code]
        if not members:
            continue
        out += ["", f"### Exit {exit_code}", "", "| code | HTTP | gRPC | class | what |", "|---|---|---|---|---|"]
        for cls in members:
            out.append(
                f"| `{cls.code}` | {cls.http_status} | `{cls.grpc_status}` | `{cls.__module__}.{cls.__name__}` "
                f"| {_cell(_summary(cls))} |"
            )
    return "\n".join(out) + "\n"


# -- Helm values --------------------------------------------------------------------------------


def values_comments(text: str) -> dict[str, str]:
    """The comment block right above each key of ``values.yaml``, by dotted path."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip().removeprefix("-- "))
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("- ") or ":" not in stripped:
            pending = []
            continue
        key = stripped.split(":", 1)[0].strip().strip("\"'")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        if pending:
            found[path] = " ".join(pending)
        pending = []
        stack.append((indent, key))
    return found


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"]
        target: Any = schema
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind:
        return str(kind)
    for key in ("oneOf", "anyOf"):
        if key in node:
            # a constant (``{"const": "auto"}``) is its value, not an object
            kinds = {f"`{json.dumps(o['const'])}`" if "const" in o else str(o.get("type", "object")) for o in node[key]}
            return " or ".join(sorted(kinds))
    return ""


def helm_values() -> list[tuple[str, str, str, str]]:
    """(path, type, default, description) of every value the chart's schema declares."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    defaults = yaml.safe_load(text)
    comments = values_comments(text)
    rows: list[tuple[str, str, str, str]] = []

    def default_of(path: list[str]) -> Any:
        value: Any = defaults
        for part in path:
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value

    def walk(node: dict[str, Any], path: list[str]) -> None:
        node = _resolve(schema, node)
        properties = node.get("properties")
        if properties and path:
            rows.append((".".join(path), "object", "", node.get("description") or comments.get(".".join(path), "")))
        if properties:
            for key, child in properties.items():
                walk(child, [*path, key])
            return
        value = default_of(path)
        shown = "" if value in (None, {}, [], "") else f"`{json.dumps(value)}`"
        rows.append((".".join(path), _type(node), shown, node.get("description") or comments.get(".".join(path), "")))

    walk(schema, [])
    return rows


def helm_values_page() -> str:
    out = ["# Helm values", "", GENERATED.rstrip(), ""]
    out.append(
        "Every value of `charts/dsplatform`, as its `values.schema.json` declares it (a value "
        "it does not declare is an error at `helm install`), with the default from "
        "`values.yaml` and the comment written above it there. How to install: "
        "[Installing on Kubernetes](../operator-guide/install.md)."
    )
    out += ["", "| value | type | default | what |", "|---|---|---|---|"]
    for path, kind, default, description in helm_values():
        out.append(f"| `{path}` | {kind} | {_cell(default)} | {_cell(description)} |")
    return "\n".join(out) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/settings.md": settings_page,
    "reference/metrics.md": metrics_page,
    "reference/exit-codes.md": exit_codes_page,
    "reference/helm-values.md": helm_values_page,
}


def main(argv: list[str] | None = None) -> int:
    """Write every page under ``docs/`` (``--check``: exit 1 naming the stale ones, write nothing)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="the reference pages, written from the code")
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed page is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, write in PAGES.items():
        target = REPO / "docs" / path
        text = write()
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(path)
        else:
            target.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"docs/{path} is stale: run python tools/docs/reference.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    import sys

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    raise SystemExit(main())
