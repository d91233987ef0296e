"""``dsagent``: the node agent's command line (``dsagent serve``, ``dsagent webhook``,
``dsagent release-nodes``).

Parses the flags, reads the settings once (``DSAGENT_*``, overridden by flags; one error names
every bad value) and hands them to the node agent's process, :func:`dsagent.nodeagent.serve.run`,
which binds, serves and stops. Errors become one line and an exit code at :func:`main`.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from dsagent.cache.settings import Settings
from dsagent.cli.edge import stream_heap
from dsagent.cli.group import version_option
from dsagent.nodeagent.serve import refuse_unknown_settings, run
from dsplatform.logs import LOG_FORMATS, LOG_LEVELS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("dsagent")
def agent() -> None:
    """dsagent: the dsplatform node agent (a DaemonSet on every GPU node)."""


def _register_webhook() -> None:
    from dsagent.cli.webhook import webhook

    agent.add_command(webhook)


_register_webhook()


@agent.command()
@click.option("--root", type=click.Path(path_type=Path), help="Cache root [DSAGENT_ROOT].")
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(path_type=Path),
    help="Unix socket [DSAGENT_SOCKET, default ROOT/dsagent.sock].",
)
@click.option("--listen", help="Also serve TCP on HOST:PORT [DSAGENT_LISTEN].")
@click.option(
    "--capacity",
    help="Cap the cache's disk use (blocks and per-file overhead count) at this size, e.g. 500GB [DSAGENT_CAPACITY].",
)
@click.option(
    "--local-source",
    "local_sources",
    multiple=True,
    type=click.Path(path_type=Path),
    help="A local directory requests may cache from (repeatable) [DSAGENT_LOCAL_SOURCES].",
)
@click.option("--node-name", help="This node's name [DSAGENT_NODE_NAME].")
@click.option(
    "--kubernetes/--no-kubernetes",
    default=None,
    help="Cluster mode: publish to the Node, watch pods [DSAGENT_KUBERNETES].",
)
@click.option(
    "--device-plugin/--no-device-plugin",
    default=None,
    help="Serve the kubelet GPU+VF device plugin [DSAGENT_DEVICE_PLUGIN].",
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS), help="[DSAGENT_LOG_LEVEL]")
@click.option(
    "--log-format", type=click.Choice(LOG_FORMATS), help="text, or one JSON object per line [DSAGENT_LOG_FORMAT]."
)
@click.option(
    "--access-log/--no-access-log", default=None, help="Log every HTTP request at INFO (off) [DSAGENT_ACCESS_LOG]."
)
def serve(
    root: Path | None,
    socket_path: Path | None,
    listen: str | None,
    capacity: str | None,
    local_sources: tuple[Path, ...],
    node_name: str | None,
    kubernetes: bool | None,
    device_plugin: bool | None,
    log_level: str | None,
    log_format: str | None,
    access_log: bool | None,
) -> None:
    """Run the agent until SIGTERM or Ctrl-C (a failed start-up: one line and its exit code, by :func:`main`)."""
    refuse_unknown_settings()
    # DSAGENT_* with the flags given on the command line winning; one error lists every bad value
    settings = Settings.from_env(
        root=root,
        socket_path=socket_path,
        listen=listen,
        capacity_bytes=capacity,
        local_sources=local_sources or None,
        node_name=node_name,
        kubernetes=kubernetes,
        device_plugin=device_plugin,
        log_level=log_level,
        log_format=log_format,
        access_log=access_log,
    )
    stream_heap(os.environ)  # the fetches and unpacks stream bundles in 1 MiB chunks (dsplatform.heap)
    run(settings)


@agent.command("release-nodes")
@click.option(
    "--label",
    default=None,
    help="The label the agents write on the nodes their device plugin serves [DSAGENT_DEVICE_PLUGIN_NODE_LABEL, "
    "default dsagent.io/device-plugin].",
)
def release_nodes(label: str | None) -> None:
    """Hand every node the agents' device plugin served back to NVIDIA's device plugin (run by
    the chart's pre-delete hook as the release is uninstalled): the labels go, so the NVIDIA GPU
    Operator puts its plugin back, and the node's condition says so. Exit 0 when done."""
    import os

    from dsagent.nodeagent.hardware import PLUGIN_LABEL
    from dsagent.nodeagent.nodeparts import release_nodes as release

    chosen = label or os.environ.get("DSAGENT_DEVICE_PLUGIN_NODE_LABEL") or PLUGIN_LABEL
    names = release(chosen)
    click.echo(f"released {len(names)} node(s) to NVIDIA's device plugin" + (": " + ", ".join(names) if names else ""))


def main(argv: list[str] | None = None) -> None:
    """The ``dsagent`` command; a deliberate error is one line and its exit code (the process
    edge, shared with ``dsctl``: usage errors too are one line, not click's usage block)."""
    from dsagent.cli import run as run_command

    run_command(agent, argv, "dsagent")
