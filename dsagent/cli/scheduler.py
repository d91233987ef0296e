"""``dsctl scheduler``: run the kube-scheduler extender (scheduler_plugin)."""

from __future__ import annotations

import click

from dsplatform.logs import LOG_FORMATS


@click.group()
def scheduler() -> None:
    """The kube-scheduler extender: dataset affinity, GPU-RoCE subnet, NUMA placement."""


@scheduler.command()
@click.option("--host", default=None, help="Address to listen on [DSEXT_HOST, 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port to listen on [DSEXT_PORT, 8888].")
@click.option("--base-path", default=None, help="Path part of kube-scheduler's urlPrefix [DSEXT_BASE_PATH].")
@click.option("--weights", default=None, help="e.g. dataset=0.5,roce=0.3,numa=0.2 [DSEXT_WEIGHTS].")
@click.option(
    "--watch/--no-watch",
    default=None,
    help="Keep a watch-backed Node/Pod cache, needed for nodeCacheCapable [DSEXT_WATCH].",
)
@click.option("--kubeconfig", default=None, help="Kubeconfig for --watch outside a cluster [DSEXT_KUBECONFIG].")
@click.option(
    "--partial-datasets/--no-partial-datasets",
    default=None,
    help="Credit nodes holding some of a pod's datasets [DSEXT_PARTIAL_DATASETS].",
)
@click.option(
    "--whole-nodes/--no-whole-nodes",
    default=None,
    help="Keep nodes with every GPU free for waiting multi-worker jobs (needs --watch) [DSEXT_WHOLE_NODES].",
)
@click.option(
    "--log-format", type=click.Choice(LOG_FORMATS), default=None, help="text, or JSON lines [DSEXT_LOG_FORMAT]."
)
@click.option("--access-log/--no-access-log", default=None, help="One log line per request [DSEXT_ACCESS_LOG].")
def serve(
    host: str | None,
    port: int | None,
    base_path: str | None,
    weights: str | None,
    watch: bool | None,
    kubeconfig: str | None,
    partial_datasets: bool | None,
    whole_nodes: bool | None,
    log_format: str | None,
    access_log: bool | None,
) -> None:
    """Serve filter and prioritize verbs for kube-scheduler over HTTP."""
    from scheduler_plugin.__main__ import serve as run
    from scheduler_plugin.settings import Settings, refuse_unknown

    refuse_unknown()
    settings = Settings.from_env(
        host=host,
        port=port,
        base_path=base_path,
        weights=weights,
        watch=watch,
        kubeconfig=kubeconfig,
        partial_datasets=partial_datasets,
        whole_nodes=whole_nodes,
        log_format=log_format,
        access_log=access_log,
    )
    run(settings)
