"""Sockets made in another network namespace: the node's, for an agent on the pod network.

The NICs' addresses are the node's network namespace's: the fetch links (docs/design.md#links)
bind each connection to one of them, RoCE classes by subnet are built from them, and a VF's
address is set on a netdev there. A process on the pod network sees none of them. Rather
than moving the whole agent onto the host's network (its port would then be open to every
pod on the node, and no NetworkPolicy applies to host-network pods), the agent makes only
those sockets in the node's namespace: a socket belongs to the namespace it was created in
for the rest of its life, whichever thread uses it afterwards, while the agent's own server
stays on the pod network.

:class:`Namespace` keeps a few threads that entered the namespace once (``setns(2)`` acts
on the calling thread only; :func:`os.setns` where Python has it, else libc's) and runs
calls there: a socket's creation, a TCP connect, a child process (a child inherits the
namespaces of the thread that forks it: ``ip -j address show`` lists the node's addresses).
Entering needs ``CAP_SYS_ADMIN`` (the chart's agent is privileged where it mounts datasets
into pods) and the namespace's file: ``/proc/1/ns/net`` with the host's pids
(``hostPID``, which the agent has). :func:`entered` gives one :class:`Namespace` per path
and process. The path is the operator's setting (``DSAGENT_NODE_NETNS``), never a pod's.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dsplatform.errors import InvalidInput

_T = TypeVar("_T")

#: ``CLONE_NEWNET`` (linux/sched.h): setns joins the file's network namespace
CLONE_NEWNET = 0x40000000

#: threads that entered it, made as needed: a peer link's connect runs whole in one (up to
#: its timeout), so as many as an agent's fetches connect at once by default (4 versions x
#: 8 workers): a peer that does not answer holds one thread, not the others' connects
THREADS = 32


class NamespaceError(InvalidInput):
    """The namespace cannot be entered (no such file, not a network namespace, no right)."""

    code = "netns_refused"


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    import ctypes  # Python before 3.12: libc's setns
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


class Namespace:
    """Calls run in the network namespace of ``path`` (see the module docstring)."""

    def __init__(self, path: str, *, threads: int = THREADS) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise NamespaceError(f"cannot open the network namespace {path}: {exc.strerror}") from None
        self._entered = threading.local()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="netns", initializer=self._enter)
        try:
            self.call(lambda: None)  # entered once now: a refusal is the caller's error at start-up
        except NamespaceError:
            self.close()
            raise

    def _enter(self) -> None:
        try:
            _setns(self._fd)
        except OSError as exc:
            self._entered.error = NamespaceError(f"cannot enter the network namespace {self.path}: {exc.strerror}")
        else:
            self._entered.error = None

    def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` in one of the namespace's threads, its result or its error."""

        def inside() -> _T:
            error = getattr(self._entered, "error", None)
            if error is not None:
                raise error
            return fn(*args, **kwargs)

        return self._pool.submit(inside).result()

    def socket(self, family: int, kind: int, proto: int = 0) -> socket.socket:
        """A new socket of the namespace."""
        return self.call(socket.socket, family, kind, proto)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        os.close(self._fd)

    def __repr__(self) -> str:
        return f"Namespace({self.path!r})"


@functools.cache
def entered(path: str) -> Namespace:
    """The process's one :class:`Namespace` of ``path`` (made on first use)."""
    return Namespace(path)


__all__ = ["CLONE_NEWNET", "THREADS", "Namespace", "NamespaceError", "entered"]
