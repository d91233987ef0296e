"""``dsctl version``: what ``--version`` prints, or the same as JSON.

Who calls it: the ``dsctl`` group (:mod:`dsagent.cli.group`, imported on first use).
"""

from __future__ import annotations

import json

import click

from dsagent.cli.options import output_option


@click.command("version")
@output_option
def version(output: str) -> None:
    """Show the version and whether the native loops run (as --version does)."""
    from dsagent.cli.group import describe, installed

    if output == "text":
        click.echo(describe("dsctl"))
        return
    number, off = installed()
    click.echo(json.dumps({"version": number, "nativeLoops": off is None, "nativeOff": off}))
