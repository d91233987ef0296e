"""``python -m scheduler_plugin``: serve the extender with settings from ``DSEXT_*``."""

from __future__ import annotations

import socket

from dsplatform import logs
from dsplatform.errors import exit_on_error
from scheduler_plugin.errors import SettingsError
from scheduler_plugin.settings import Settings, refuse_unknown

#: seconds uvicorn waits for open requests after SIGTERM before closing them
SHUTDOWN_GRACE_S = 5


def listen(host: str, port: int) -> socket.socket:
    """The extender's listening socket, bound before anything starts: a busy or forbidden
    address is one line and exit 2 (uvicorn would log it and exit as if nothing was found)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SettingsError(
            f"cannot listen on {host}:{port}: {exc.strerror}",
            hint="choose another --port (DSEXT_PORT) or stop what holds this one",
        ) from None
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings) -> None:
    """Run the extender under uvicorn until interrupted."""
    import uvicorn

    from scheduler_plugin.app import create_app

    sock = listen(settings.host, settings.port)
    logs.configure(settings.log_level, settings.log_format)  # one handler and format, uvicorn's too
    config = uvicorn.Config(
        create_app(settings, settle_heap=True),
        **logs.uvicorn_options(settings),
        lifespan="on",
        # kube-scheduler's transport drops idle connections after 90 s; keeping ours open
        # longer means the client always closes first, so a POST never races a server
        # close (Go does not retry a POST that hits a connection closed under it).
        timeout_keep_alive=120,
        # a client stalled mid-request must not hold SIGTERM (it did, indefinitely)
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    uvicorn.Server(config).run(sockets=[sock])


def main() -> None:
    """The extender process; a deliberate error (bad settings, a busy port) is one line and its exit code."""
    with exit_on_error("scheduler_plugin"):
        refuse_unknown()
        serve(Settings.from_env())


if __name__ == "__main__":
    main()
