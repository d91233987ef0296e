"""``dsagent``: the node agent's own entry point (``dsagent serve``)."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def agent() -> None:
    """dsagent: the dsplatform node agent (a DaemonSet on every GPU node)."""


def main(argv: list[str] | None = None) -> None:
    agent.main(args=argv, prog_name="dsagent")
