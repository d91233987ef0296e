"""``python -m scheduler_plugin``: serve the extender with settings from ``DSEXT_*``."""

from __future__ import annotations

import logging
import sys

from scheduler_plugin.errors import SchedulerPluginError
from scheduler_plugin.settings import Settings

#: seconds uvicorn waits for open requests after SIGTERM before closing them
SHUTDOWN_GRACE_S = 5


def serve(settings: Settings) -> None:
    """Run the extender under uvicorn until interrupted."""
    import uvicorn

    from scheduler_plugin.app import create_app

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings, settle_heap=True),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        lifespan="on",
        # kube-scheduler's transport drops idle connections after 90 s; keeping ours open
        # longer means the client always closes first, so a POST never races a server
        # close (Go does not retry a POST that hits a connection closed under it).
        timeout_keep_alive=120,
        # a client stalled mid-request must not hold SIGTERM (it did, indefinitely)
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )


def main() -> None:
    try:
        settings = Settings.from_env()
    except SchedulerPluginError as exc:
        print(f"scheduler_plugin: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    serve(settings)


if __name__ == "__main__":
    main()
