"""The Dataset controller's process: ``python -m dsagent.controller``.

Who runs it: the chart's controller Deployment (through :mod:`dsagent.controller.__main__`).
It refuses unknown ``DSAGENT_CONTROLLER_*`` variables and bad settings in one line with their
exit code, configures the logs, serves the metrics where ``DSAGENT_CONTROLLER_METRICS_PORT``
asks, starts the node watch, lets the first pass that reads every pod start their watch,
and runs :class:`~dsagent.controller.reconcile.DatasetController` until stopped.
"""

from __future__ import annotations

import logging

from dsagent.controller.controllermetrics import serve_metrics
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsplatform.errors import exit_on_error

log = logging.getLogger("dsagent.controller")


def main() -> None:  # pragma: no cover - the container's entry point
    from dsagent.envsettings import AgentLogSettings
    from dsplatform import logs

    with exit_on_error("dsagent controller"):  # bad settings, no API server: one line and its exit code
        from dsagent.controller.controllersettings import SETTINGS
        from dsagent.kube.envnames import refuse_unknown

        refuse_unknown(SETTINGS)
        log_settings = AgentLogSettings.from_env()  # DSAGENT_LOG_LEVEL, _LOG_FORMAT (docs/design.md#logs)
        # only once the settings are good: configure() replaces the root logger's handlers
        logs.configure(log_settings.log_level, log_settings.log_format)
        _run_controller()


def _run_controller() -> None:
    from dsagent.kube import apiclient

    settings = ControllerSettings.from_env()
    s = settings
    log.info(
        "Dataset controller %s starting (lease %s/%s, resync %.0f s)", s.identity, s.namespace, s.lease_name, s.resync_s
    )
    controller = DatasetController(apiclient.load(), settings)
    if settings.metrics_port:
        serve_metrics(settings.metrics_port, controller.metrics.registry)
    if controller.node_watch is not None:
        controller.node_watch.start()
    controller.pods.start_watch = True
    controller.run_forever()


__all__ = ["main"]
