"""The node agent's process (``dsagent serve``): its composition root, from settings to a stop.

Given the settings (read by :mod:`dsagent.cli.agent`), binds the unix socket (and the
TCP listener when asked), takes the companions that run beside the cache service (the
cluster agent in Kubernetes mode; :func:`dsagent.nodeagent.nodeparts.node_parts`, which owns
that choice) and the hooks the service is built with (cluster mode's task guard and peer
list, :mod:`dsagent.cache.servicehooks`: built first, so the service takes them in its
constructor), and runs the FastAPI app under
uvicorn on one event loop. With ``DSAGENT_CSI_SOCKET`` set, the CSI node plugin
(:mod:`dsagent.nodeplugins.csi.driver`) is a companion too: it serves on that socket, on the
same loop and the same service, once the service has started. This module and
:mod:`dsagent.nodeagent.nodeparts` are the one place that wires the edges together: the API
layer never imports ``dsagent.nodeagent`` or ``dsagent.nodeplugins``.

On the way out (SIGTERM, Ctrl-C or a failed start-up) it removes its socket file. That
happens in the server's ``shutdown``, not after ``serve`` returns: uvicorn re-raises the
signal it caught once ``serve`` ends, and a re-raised SIGTERM kills the process before any
``finally`` of ours runs. The agent also records
its root and socket among the user's running agents (:func:`dsagent.envsettings.agent_records`,
one record per root), so that ``dsctl`` finds an agent started with ``--root X`` without
``DSAGENT_SOCKET`` and refuses to guess between several; it removes its record on exit.
On SIGTERM the process is gone within :data:`STOP_DEADLINE` seconds whatever its threads are
doing: a watchdog ends it if the orderly shutdown has not by then. An agent serving stripe
share bundles to peers first hands them off (:meth:`dsagent.cache.striped.stophandoff.StripeHandoff.run`,
docs/design-striping.md#churn): it takes no new task, fails readiness and keeps serving the
peers for at most ``DSAGENT_STRIPE_HANDOFF_GRACE``; the deadline counts from the hand-off's
end, so the process is gone within that bound plus :data:`STOP_DEADLINE`. A second signal
ends the hand-off at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsagent.cache.service import CacheService
from dsagent.cache.settings import Settings
from dsagent.envsettings import agent_record_name, agent_records
from dsagent.errors import DsagentError, SettingsError
from dsagent.format import native
from dsagent.nodeagent.handover import live_foreign_plugins
from dsagent.nodeagent.nodeparts import (
    SETTINGS,
    decide_device_plugin,
    node_parts,
    publish_links,
    require_kubelet_extra,
    start_device_plugin,
    start_when_handed_over,
)
from dsplatform import logs
from dsplatform.errors import PlatformError, exit_with
from dsplatform.serving import BACKLOG, CannotListen, StartupWatch, listening_socket, unix_socket_answers


def refuse_unknown_settings() -> None:
    """Refuse ``DSAGENT_*`` variables the node agent does not read (a typo is not ignored)."""
    from dsagent.kube.envnames import refuse_unknown

    refuse_unknown(SETTINGS)


def run(settings: Settings) -> None:
    """Run the node agent with ``settings`` until SIGTERM or Ctrl-C; a failed start-up
    raises its error (the command line's edge prints it with its exit code)."""
    if settings.kubernetes and importlib.util.find_spec("dsagent.nodeagent.clusteragent") is None:
        raise SettingsError(
            "cluster mode (--kubernetes) needs dsagent.nodeagent.clusteragent, which this build lacks",
            hint="run without --kubernetes",
        )
    require_kubelet_extra(settings)
    native.use_native(settings.native, why_off=f"{Settings.env_name('native')}=0")  # this process and its forks
    if settings.kubernetes:
        _check_cluster_mode(settings)
    _check_local_sources(settings)
    sockets = _bind(settings)
    pointer = _record_socket(settings)
    logs.configure(settings.log_level, settings.log_format)  # one handler and format, uvicorn's too
    failure = asyncio.run(_run(settings, sockets, pointer))
    if _stuck_threads():
        # a worker stuck in a blocking call (a hanging source, a dead NFS mount) would hold
        # the interpreter's exit forever: leave it behind
        _exit_now("leaving threads stuck in blocking calls behind", failure)
    if failure is not None:
        raise failure  # the start-up's own error: main's edge prints it with its exit code


#: From SIGTERM to the process being gone, whatever its threads are doing.
STOP_DEADLINE = 9.0


def _stuck_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()]


def _exit_now(why: str, failure: PlatformError | None = None) -> None:
    """End the process now, threads or not: 0, or ``failure``'s line and exit code."""
    logging.getLogger("dsagent").warning("exiting: %s", why)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    if failure is not None:
        exit_with(failure, "dsagent", now=True)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(os.EX_OK)  # stopped: not an error


def _watchdog(seconds: float) -> None:
    """Exit ``seconds`` from now if the orderly shutdown has not finished by then."""
    timer = threading.Timer(seconds, _exit_now, (f"shutdown took over {seconds:.0f} s",))
    timer.daemon = True
    timer.start()


def _check_cluster_mode(settings: Settings) -> None:
    """Cluster mode without the node's name, or outside a cluster with no kubeconfig either,
    is a configuration error: one line and exit 2 before anything is bound, not a failed
    start-up worth retrying."""
    from dsagent.errors import InvalidInput
    from dsagent.kube import apiclient

    if not settings.node_name:
        raise InvalidInput(
            "cluster mode needs the node's name", hint="set DSAGENT_NODE_NAME (downward API: spec.nodeName)"
        )

    try:
        apiclient.load()
    except apiclient.KubeUnavailable as exc:
        raise SettingsError(exc.message, hint=exc.hint) from None


def _make_dir(path: Path, what: str, setting: str) -> None:
    """``path`` as a directory, or one line saying why it cannot be (not a traceback)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise SettingsError(f"the {what} {path} is not a directory", hint=f"give a directory: {setting}") from None
    except OSError as exc:
        raise SettingsError(
            f"cannot create the {what} {path}: {exc.strerror}", hint=f"give a writable directory: {setting}"
        ) from None


def _check_local_sources(settings: Settings) -> None:
    """Every allowed local source is a directory: a mistyped one would otherwise refuse, at
    request time, every dataset the operator meant to allow ("outside the directories")."""
    for path in settings.local_sources:
        if not path.is_dir():
            state = "is not a directory" if path.exists() else "does not exist"
            raise SettingsError(
                f"the local source {path} {state}",
                hint="give existing directories: --local-source or DSAGENT_LOCAL_SOURCES",
            )


def _bind(settings: Settings) -> list[socket.socket]:
    _make_dir(settings.root, "cache root", "--root or DSAGENT_ROOT")
    path = settings.socket
    _make_dir(path.parent, "socket's directory", "--socket or DSAGENT_SOCKET")
    if path.exists() or path.is_symlink():
        if unix_socket_answers(path):
            raise SettingsError(f"another agent is already serving {path}", hint="stop it first, or use --socket")
        path.unlink()
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)  # rw for owner and group: the socket's permissions are its access control
    try:
        unix.bind(str(path))
    except OSError as exc:
        unix.close()
        raise SettingsError(
            f"cannot serve the socket {path}: {exc.strerror}", hint="choose another path: --socket or DSAGENT_SOCKET"
        ) from None
    finally:
        os.umask(old)
    unix.listen(BACKLOG)
    unix.set_inheritable(True)
    sockets = [unix]
    if settings.listen is not None:
        host, port = settings.listen
        try:
            sockets.append(listening_socket(host, port, hint="choose another --listen (DSAGENT_LISTEN)"))
        except CannotListen:
            unix.close()
            raise
    return sockets


async def _run(
    settings: Settings, sockets: list[socket.socket], pointer: AgentRecord | None = None
) -> PlatformError | None:
    """Serve until stopped; None, or the error that kept the server from starting."""
    import uvicorn

    from dsagent.api import create_app
    from dsagent.api.identity import peer_credentials_protocol

    plugin = None
    handover: asyncio.Task[Any] | None = None
    try:
        wanted, topology = await decide_device_plugin(settings)
        nvidia: list[str] = await asyncio.to_thread(live_foreign_plugins, settings.device_plugin_dir) if wanted else []
        if nvidia:
            # NVIDIA's plugin is still leaving this node: datasets are served meanwhile
            logging.getLogger("dsagent").info(
                "device plugin: waiting up to %g s for NVIDIA's to leave node %s",
                settings.device_plugin_handover, settings.node_name,
            )  # fmt: skip
            handover = asyncio.create_task(
                start_when_handed_over(settings, topology, seen=nvidia), name="dsagent-handover"
            )
            handover.add_done_callback(_say_failed_start)
        elif wanted:
            plugin = await start_device_plugin(settings, topology=topology, sysfs_root=settings.sysfs_root)
    except DsagentError as exc:
        _cleanup(settings, list(sockets), pointer)
        exc.message = f"the device plugin cannot start: {exc.message}"  # main's edge says it, with its exit code
        raise

    def plugin_state() -> str:
        if handover is None:
            return "on" if plugin is not None else "off"
        if not handover.done():
            return "waiting for NVIDIA's to leave"
        started = not handover.cancelled() and handover.exception() is None and handover.result() is not None
        return "on" if started else "off"

    async def stop_plugin() -> None:
        nonlocal plugin, handover
        if handover is not None:
            waiting, handover = handover, None
            waiting.cancel()
            try:
                plugin = await waiting
            except (asyncio.CancelledError, Exception):  # cancelled while waiting, or said by _say_failed_start
                plugin = None
        if plugin is not None:
            stopping, plugin = plugin, None
            await stopping.stop()

    class Server(uvicorn.Server):
        handing_off = False
        handed_signal: int | None = None  # the stop signal, passed on to uvicorn once the hand-off ends
        serving_loop: asyncio.AbstractEventLoop | None = None  # where a signal starts the hand-off
        links_said: asyncio.Task[None] | None = None  # the Node told which links (kept while it runs)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            self.serving_loop = asyncio.get_running_loop()
            if self.started:
                logging.getLogger("dsagent").info("%s", startup_line(settings, plugin_state()))
                if settings.kubernetes and settings.fetch_links:  # which links, on the Node (in the background)
                    self.links_said = asyncio.create_task(asyncio.to_thread(publish_links, settings, svc.link_choice))

        def handle_exit(self, sig: int, frame: Any) -> None:
            loop, first = self.serving_loop, not self.should_exit and not self.handing_off
            if loop is not None and first and svc.started and svc.handoff.wanted():
                # keep serving the peers moving this node's stripe shares (docs/design-striping.md#churn);
                # the watchdog's STOP_DEADLINE counts from the hand-off's end, and this one
                # holds the total even if the loop never runs the hand-off's end
                self.handing_off, self.handed_signal = True, sig
                _watchdog(settings.stripe_handoff_grace + STOP_DEADLINE)
                loop.call_soon_threadsafe(self._start_hand_off)
                return
            if not self.should_exit:
                _watchdog(STOP_DEADLINE)
            super().handle_exit(sig, frame)

        def _start_hand_off(self) -> None:
            task = asyncio.create_task(svc.handoff.run(lambda: self.should_exit), name="dsagent-handoff")
            task.add_done_callback(self._handed_off)

        def _handed_off(self, task: asyncio.Task[Any]) -> None:
            if not task.cancelled() and task.exception() is not None:
                logging.getLogger("dsagent").error("the stripe hand-off failed", exc_info=task.exception())
            if not self.should_exit and self.handed_signal is not None:
                _watchdog(STOP_DEADLINE)
                super().handle_exit(self.handed_signal, None)  # uvicorn's own stop: it re-raises the signal

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            try:
                await super().shutdown(sockets)
            finally:
                await stop_plugin()
                _cleanup(settings, bound, pointer)

    bound = list(sockets)
    parts = node_parts(settings)
    app = create_app(settings, hooks=parts.hooks, companions=parts.companions)
    svc: CacheService = app.state.service

    watched = StartupWatch(app)
    config = uvicorn.Config(
        watched,
        http=peer_credentials_protocol(settings.proc_root),
        **logs.uvicorn_options(settings),
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = Server(config)
    try:
        with watched.serving("the agent", lambda: server.started):  # a failed start: its error, not exit 3
            await server.serve(sockets=sockets)
    except PlatformError as failure:
        return failure
    finally:
        await stop_plugin()
        _cleanup(settings, bound, pointer)
    return None


def _say_failed_start(task: asyncio.Task[Any]) -> None:
    """Log a device plugin that could not start after the hand-over (the agent goes on serving)."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    message = exc.message if isinstance(exc, DsagentError) else repr(exc)
    logging.getLogger("dsagent").error("the device plugin cannot start: %s", message)


def startup_line(settings: Settings, device_plugin: str) -> str:
    """The one line an operator reads first: what runs, where it keeps data, where it
    answers, how much it may hold, and whether the native loops run (and why not)."""
    from dsagent import __version__
    from dsplatform.units import format_size

    try:
        disk = shutil.disk_usage(settings.root)
        room = f"disk {format_size(disk.free)} free of {format_size(disk.total)}"
    except OSError as exc:
        room = f"disk unreadable ({exc.strerror or exc})"
    capacity = format_size(settings.capacity_bytes) if settings.capacity_bytes is not None else "the disk"
    tcp = f"{settings.listen[0]}:{settings.listen[1]}" if settings.listen else "off"
    return (
        f"dsagent {__version__} serving: root {settings.root}, socket {settings.socket}, tcp {tcp}, "
        f"capacity {capacity} ({room}), cluster mode {'on' if settings.kubernetes else 'off'}, "
        f"device plugin {device_plugin}, native loops {native.describe()}"
    )


@dataclass(frozen=True)
class AgentRecord:
    """This agent's record among the user's running agents (one file per root), and what it says."""

    path: Path
    text: str


def _record_socket(settings: Settings) -> AgentRecord | None:
    """Record this agent's root and socket for ``dsctl`` (:func:`dsagent.envsettings.agent_records`)."""
    folder = agent_records()
    path = folder / agent_record_name(settings.root)
    text = json.dumps({"root": str(settings.root.absolute()), "socket": str(settings.socket.absolute())})
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:  # a convenience only: dsctl can still be told DSAGENT_SOCKET or DSAGENT_ROOT
        logging.getLogger("dsagent").warning("cannot record this agent in %s: %s", folder, exc)
        return None
    return AgentRecord(path, text)


def _cleanup(settings: Settings, sockets: list[socket.socket], record: AgentRecord | None = None) -> None:
    """Close the listeners, remove the socket file, and remove this agent's record unless a
    later agent of the same root replaced it."""
    for sock in sockets:
        sock.close()
    with contextlib.suppress(FileNotFoundError):
        settings.socket.unlink()
    if record is None:
        return
    with contextlib.suppress(OSError):
        if record.path.read_text(encoding="utf-8").strip() == record.text:
            record.path.unlink()
