"""Whether NVIDIA's device plugin still serves this node, and the wait for it to leave.

Who calls it: :func:`dsagent.nodeagent.nodeparts.start_when_handed_over`, before the agent's
own device plugin registers (docs/design.md#defaults). Two plugins that both hand out a
node's GPUs would give one GPU to two pods: NVIDIA's knows nothing of the class resources'
allocations, and the kubelet keeps only the last plugin registered for ``nvidia.com/gpu``.
So where the agent takes over a node, it first waits until NVIDIA's plugin has gone.

The rule: NVIDIA's plugin serves the node while a socket named ``nvidia*.sock`` in the
kubelet's device-plugins directory accepts a connection (its plugin names each socket after
its resource, ``nvidia-gpu.sock``; a socket left behind by a killed plugin refuses the
connection and does not count). Nothing is sent on the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from pathlib import Path

#: the names NVIDIA's device plugin gives its sockets in the device-plugins directory
NVIDIA_SOCKETS = "nvidia*.sock"
CONNECT_TIMEOUT = 1.0  # seconds one probe of a socket may take


def live_foreign_plugins(plugin_dir: Path) -> list[str]:
    """The names of NVIDIA's plugin sockets in ``plugin_dir`` that accept a connection now."""
    try:
        candidates = sorted(plugin_dir.glob(NVIDIA_SOCKETS))
    except OSError:
        return []
    return [path.name for path in candidates if _accepts(path)]


def _accepts(path: Path) -> bool:
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as sock:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(str(path))
        except OSError:  # refused (a stale socket), not a socket, gone meanwhile, too long a path
            return False
    return True


async def wait_until_gone(
    plugin_dir: Path,
    timeout: float,
    *,
    poll: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    seen: list[str] | None = None,
) -> list[str]:
    """Wait up to ``timeout`` seconds for NVIDIA's plugin sockets to stop answering; the
    ones still answering then (empty: it has gone). ``seen``: what a probe just found (the
    caller's), taken as the first answer instead of probing again at once."""
    deadline = clock() + timeout
    live = seen
    while True:
        if live is None:
            live = await asyncio.to_thread(live_foreign_plugins, plugin_dir)
        if not live or clock() >= deadline:
            return live
        await asyncio.sleep(min(poll, max(0.0, deadline - clock())))
        live = None


__all__ = ["NVIDIA_SOCKETS", "live_foreign_plugins", "wait_until_gone"]
