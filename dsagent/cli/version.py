"""``dsctl version``: what ``--version`` prints, or the same as JSON.

Who calls it: the ``dsctl`` group (:mod:`dsagent.cli.group`, imported on first use).
"""

from __future__ import annotations

import json
import os

import click

from dsagent.cli.options import output_option


@click.command("version")
@output_option
def version(output: str) -> None:
    """Show the version and whether the native loops run (as --version does)."""
    from dsagent.cli.group import describe

    if output == "text":
        click.echo(describe("dsctl"))
        return
    from dsagent import __version__
    from dsagent.cli.edge import native_switch
    from dsagent.format import native

    native_switch(os.environ)
    off = None if native.AVAILABLE else (native.OFF_REASON or "switched off")
    click.echo(json.dumps({"version": __version__, "nativeLoops": native.AVAILABLE, "nativeOff": off}))
