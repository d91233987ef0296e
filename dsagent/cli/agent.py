"""``dsagent``: the node agent's own entry point (``dsagent serve``).

Reads settings once (``DSAGENT_*``, overridden by flags), binds the unix socket (and the
TCP listener when asked), and runs the FastAPI app under uvicorn on one event loop. On
SIGTERM the process is gone within :data:`STOP_DEADLINE` seconds whatever its threads are
doing: a watchdog ends it if the orderly shutdown has not by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import click

from dsagent.errors import DsagentError, SettingsError
from dsagent.cache.settings import Settings


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def agent() -> None:
    """dsagent: the dsplatform node agent (a DaemonSet on every GPU node)."""


def _register_webhook() -> None:
    from dsagent.cli.webhook import webhook

    agent.add_command(webhook)


_register_webhook()


@agent.command()
@click.option("--root", type=click.Path(path_type=Path), help="Cache root [DSAGENT_ROOT].")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help="Unix socket [DSAGENT_SOCKET, default ROOT/dsagent.sock].")
@click.option("--listen", help="Also serve TCP on HOST:PORT [DSAGENT_LISTEN].")
@click.option("--capacity", help="Cap the cache at this size, e.g. 500GB [DSAGENT_CAPACITY].")
@click.option("--local-source", "local_sources", multiple=True, type=click.Path(path_type=Path), help="A local directory requests may cache from (repeatable) [DSAGENT_LOCAL_SOURCES].")
@click.option("--node-name", help="This node's name [DSAGENT_NODE_NAME].")
@click.option("--kubernetes/--no-kubernetes", default=None, help="Cluster mode: publish to the Node, watch pods [DSAGENT_KUBERNETES].")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), help="[DSAGENT_LOG_LEVEL]")
def serve(root: Path | None, socket_path: Path | None, listen: str | None, capacity: str | None, local_sources: tuple[Path, ...], node_name: str | None, kubernetes: bool | None, log_level: str | None) -> None:
    """Run the agent until SIGTERM or Ctrl-C."""
    try:
        settings = _settings(root, socket_path, listen, capacity, local_sources, node_name, kubernetes, log_level)
        if settings.kubernetes and importlib.util.find_spec("dsagent.kube") is None:
            raise SettingsError("cluster mode (--kubernetes) needs dsagent.kube, which this build lacks", hint="run without --kubernetes")
        sockets = _bind(settings)
    except DsagentError as exc:
        click.echo(f"dsagent: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = asyncio.run(_run(settings, sockets))
    if _stuck_threads():
        # a worker stuck in a blocking call (a hanging source, a dead NFS mount) would hold
        # the interpreter's exit forever: leave it behind
        _exit_now(code, "leaving threads stuck in blocking calls behind")
    sys.exit(code)


#: From SIGTERM to the process being gone, whatever its threads are doing (issue 10 finding 3).
STOP_DEADLINE = 9.0


def _stuck_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()]


def _exit_now(code: int, why: str) -> None:
    logging.getLogger("dsagent").warning("exiting: %s", why)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _watchdog(seconds: float) -> None:
    """Exit ``seconds`` from now if the orderly shutdown has not finished by then."""
    timer = threading.Timer(seconds, _exit_now, (0, f"shutdown took over {seconds:.0f} s"))
    timer.daemon = True
    timer.start()


def _settings(root: Path | None, socket_path: Path | None, listen: str | None, capacity: str | None, local_sources: tuple[Path, ...], node_name: str | None, kubernetes: bool | None, log_level: str | None) -> Settings:
    """``DSAGENT_*`` with the flags given on the command line winning; one error lists every bad value."""
    return Settings.from_env(
        root=root, socket_path=socket_path, listen=listen, capacity_bytes=capacity, local_sources=local_sources or None,
        node_name=node_name, kubernetes=kubernetes, log_level=log_level,
    )


def _bind(settings: Settings) -> list[socket.socket]:
    settings.root.mkdir(parents=True, exist_ok=True)
    path = settings.socket
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if _listening(path):
            raise SettingsError(f"another agent is already serving {path}", hint="stop it first, or use --socket")
        path.unlink()
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)  # rw for owner and group: the socket's permissions are its access control
    try:
        unix.bind(str(path))
    finally:
        os.umask(old)
    sockets = [unix]
    if settings.listen is not None:
        host, port = settings.listen
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            tcp.bind((host, port))
        except OSError as exc:
            raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        sockets.append(tcp)
    for sock in sockets:
        sock.listen(128)
        sock.set_inheritable(True)
    return sockets


def _listening(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


async def _run(settings: Settings, sockets: list[socket.socket]) -> int:
    import uvicorn

    from dsagent.api import create_app
    from dsagent.api.identity import peer_credentials_protocol

    app = create_app(settings)
    config = uvicorn.Config(app, http=peer_credentials_protocol(), log_level=settings.log_level, access_log=settings.log_level == "debug", lifespan="on", timeout_graceful_shutdown=5)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                _watchdog(STOP_DEADLINE)
            super().handle_exit(sig, frame)

    server = Server(config)
    try:
        await server.serve(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            settings.socket.unlink()
    return 0 if server.started else 3


def main(argv: list[str] | None = None) -> None:
    agent.main(args=argv, prog_name="dsagent")
