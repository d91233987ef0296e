"""The ``dsctl`` click group: its commands, imported lazily, and click's side of the error edge.

Who calls it: :func:`dsagent.cli.main` (for every command line the quick ways in of
:mod:`dsagent.cli.digesting` do not take) and ``dsagent`` (:func:`run`). Commands live one
group per module and are imported on first use, so ``dsctl cache`` in an init-container
does not pay for importing the scheduler or the topology code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from dsagent.cli.edge import unexpected
from dsplatform.errors import exit_on_error

# command name -> "module:attribute"; each module owns its commands.
COMMANDS: dict[str, str] = {
    "digest": "dsagent.cli.bundles:digest",
    "pack": "dsagent.cli.bundles:pack",
    "unpack": "dsagent.cli.bundles:unpack",
    "verify": "dsagent.cli.bundles:verify",
    "cache": "dsagent.cli.cache:cache",
    "ls": "dsagent.cli.cache:ls",
    "evict": "dsagent.cli.cache:evict",
    "status": "dsagent.cli.cache:status",
    "tasks": "dsagent.cli.cache:tasks",
    "release": "dsagent.cli.cache:release",
    "operation": "dsagent.cli.cache:operation",
    "wait": "dsagent.cli.cache:wait",
    "topo": "dsagent.cli.topo:topo",
    "scheduler": "dsagent.cli.scheduler:scheduler",
    "plan": "dsagent.cli.plan:plan",
    "gc": "dsagent.cli.gc:gc",
    "stripe": "dsagent.cli.stripe:stripe",
    "version": "dsagent.cli.version:version",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | self._available())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def _available(self) -> set[str]:
        found = set()
        for name, target in self._lazy.items():
            module = target.split(":", 1)[0]
            if importlib.util.find_spec(module) is not None:
                found.add(name)
        return found

    def _load(self, cmd_name: str) -> click.Command | None:
        module_name, attr = self._lazy[cmd_name].split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        command = getattr(module, attr, None)
        return command if isinstance(command, click.Command) else None


_F = TypeVar("_F", bound=Callable[..., Any])


def installed() -> tuple[str, str | None]:
    """This install's version, and why the native loops do not run (None: they do), with
    ``DSAGENT_NATIVE`` applied."""
    import os

    from dsagent import __version__
    from dsagent.cli.edge import native_switch
    from dsagent.format import native

    native_switch(os.environ)  # dsagent's too (dsctl's edge has applied it already)
    return __version__, native.off_reason()


def describe(prog: str) -> str:
    """The version, and whether the native loops run (``on``, or ``off`` and why: not built,
    or ``DSAGENT_NATIVE``), on a second line."""
    from dsagent.format import native

    version, _ = installed()
    return f"{prog}, version {version}\nnative loops: {native.describe()}"


def version_option(prog: str) -> Callable[[_F], _F]:
    """``--version``: the version, and whether the native loops run (``on``, or ``off`` and
    why: not built, or ``DSAGENT_NATIVE``), on a second line."""

    def show(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if not value or ctx.resilient_parsing:
            return
        click.echo(describe(prog))
        ctx.exit()

    return click.option(
        "--version",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=show,
        help="Show the version and whether the native loops run, and exit.",
    )


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@version_option("dsctl")
def cli() -> None:
    """dsctl: digest, pack and cache datasets; inspect GPU topology; run the extender."""


def run(command: click.Command, argv: list[str] | None, prog: str) -> None:
    """The CLI's error edge for ``dsctl`` and ``dsagent``: every failure is one line on stderr,
    ``<prog>: error: <message> (<hint>)``.

    Exit codes: the error's own (any :class:`dsplatform.errors.PlatformError`, through
    :func:`dsplatform.errors.exit_on_error`; listed in docs/reference/exit-codes.md), click's
    for usage errors (2), 130 for Ctrl-C, 1 for anything unexpected (its traceback only with
    ``DSCTL_DEBUG=1``).
    """
    try:
        with exit_on_error(prog):
            command.main(args=argv, prog_name=prog, standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        # a command that knows what goes on after Ctrl-C says so in its Abort's message
        click.echo(str(exc) if isinstance(exc, click.exceptions.Abort) and str(exc) else "Aborted.", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog
        click.echo(f"{prog}: error: {exc.format_message()} (see '{where} --help')", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"{prog}: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # not a deliberate error: a storage library's, or a bug
        unexpected(exc, prog)
