"""Holding a TCP port without serving it: the one way the test tools keep a port from others.

Who uses it: :func:`tools.support.harness.held_port` (a port chosen for servers that bind it
later) and :class:`tools.support.fake_apiserver.FakeApiServer` (its port while it is stopped).
"""

from __future__ import annotations

import socket


def port_holder(port: int = 0, host: str = "0.0.0.0") -> socket.socket:
    """A socket bound to ``host``:``port`` (0: a free port) with SO_REUSEADDR and never
    listening. It holds the port: a connection to it is refused, and another socket's bind
    there, or an outgoing socket's ephemeral port, is refused too, while a listener that also
    sets SO_REUSEADDR binds beside it. The caller closes it."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((host, port))
    except OSError:
        holder.close()
        raise
    return holder
