"""``python -m scheduler_plugin``: serve the extender with settings from ``DSEXT_*``."""

from __future__ import annotations

import socket

from dsplatform import logs
from dsplatform.errors import exit_on_error
from dsplatform.serving import StartupWatch, listening_socket
from scheduler_plugin.settings import Settings, refuse_unknown

#: seconds uvicorn waits for open requests after SIGTERM before closing them
SHUTDOWN_GRACE_S = 5


def listen(host: str, port: int) -> socket.socket:
    """The extender's listening socket, bound before anything starts: a busy or forbidden
    address is one line and exit 2 (uvicorn would log it and exit as if nothing was found)."""
    return listening_socket(host, port, hint="choose another --port (DSEXT_PORT) or stop what holds this one")


def serve(settings: Settings) -> None:
    """Run the extender under uvicorn until interrupted."""
    import uvicorn

    from scheduler_plugin.app import create_app

    sock = listen(settings.host, settings.port)
    try:  # a failed start (a bad kubeconfig) must not leak the bound socket
        logs.configure(settings.log_level, settings.log_format)  # one handler and format, uvicorn's too
        app = StartupWatch(create_app(settings, settle_heap=True))
        config = uvicorn.Config(
            app,
            **logs.uvicorn_options(settings),
            lifespan="on",
            # kube-scheduler's transport drops idle connections after 90 s; keeping ours open
            # longer means the client always closes first, so a POST never races a server
            # close (Go does not retry a POST that hits a connection closed under it).
            timeout_keep_alive=120,
            # a client stalled mid-request must not hold SIGTERM (it did, indefinitely)
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        server = uvicorn.Server(config)
        with app.serving("the extender", lambda: server.started):  # a failed start: its error, not exit 3
            server.run(sockets=[sock])
    finally:
        sock.close()


def main() -> None:
    """The extender process; a deliberate error (bad settings, a busy port) is one line and its exit code."""
    with exit_on_error("scheduler_plugin"):
        refuse_unknown()
        serve(Settings.from_env())


if __name__ == "__main__":
    main()
