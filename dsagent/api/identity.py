"""Who is calling the agent: an operator, a pod (and which), or an anonymous network client.

Who calls it: :mod:`dsagent.api.routes` (every route that acts on a task or evicts), and
``dsagent serve``, which installs :func:`peer_credentials_protocol` so that each unix-socket
connection carries who its peer was when it was accepted (:class:`PeerIdentity`). A later
per-pod socket (the kubelet integration) names its pod by setting :data:`POD_UID_KEY` in the
connection's state; :func:`caller_identity` is the one place that turns a request into a
:class:`Caller`.

The rules (any pod on the node had operator rights):

- a valid ``Authorization: Bearer $DSAGENT_ADMIN_TOKEN`` is an **operator**, on any transport;
- a per-pod listener's pod UID (:data:`POD_UID_KEY`) is that **pod**;
- on the unix socket, the peer's pid (``SO_PEERCRED``) names its cgroup
  (``/proc/<pid>/cgroup``), and a cgroup under ``kubepods`` names the **pod** UID. The
  agent's own pod (``kubectl exec`` into it) and processes outside any pod (``dsctl`` on
  the node, root's tools) are **operators**: the socket's file mode already limits those
  to root and the socket's group. A peer whose pid the agent cannot see (pid 0: the agent
  lacks ``hostPID``) or whose cgroup cannot be read is **unidentified**: it may read, not act;
- over TCP without the token: **anonymous**, reads only.

A peer is identified **once, when its connection is accepted** (:func:`identify_peer`), and
every request on that connection is that peer's: a pid is a name the kernel hands out again,
so looking it up at each request would take a process that ended, its pid reused, for
whoever holds the pid now. The lookup itself is held to the connecting process: a pidfd
taken first (the peer's own, ``SO_PEERPIDFD``, where the kernel has it; else
``pidfd_open`` of the pid) must still be running after the cgroup is read, and the
process's start time (``/proc/<pid>/stat``, field 22) must read the same before and after.
Either check failing leaves the peer **unidentified** with the reason: never another pod.

A pod may create, read and release only the task whose id is its own UID; evictions,
``force`` and other tasks need an operator.
"""

from __future__ import annotations

import errno
import hmac
import os
import platform
import re
import select
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from starlette.requests import Request

from dsagent.errors import Forbidden, InvalidInput, Unauthorized
from dsplatform.names import canonical_task_id, pod_uid_pattern
from dsplatform.tenancy import ACTING_FOR_HEADER, parse_acting_for

#: The connection-state key under which a per-pod listener names its pod.
POD_UID_KEY = "dsagent.pod_uid"
#: The connection-state key under which :func:`peer_credentials_protocol` stores the peer's
#: :class:`PeerIdentity`, read when the connection was accepted.
PEER_KEY = "dsagent.peer"
#: The connection-state key of the call that cuts the connection (its transport's ``abort``):
#: a stream its reader stopped reading is ended by the agent (:mod:`dsagent.api.striperoutes`).
CUT_KEY = "dsagent.cut"

# the pod UID rule with systemd's '_' for '-' (kubepods-besteffort-pod<uid with _>.slice)
_POD_IN_CGROUP = re.compile(f"pod({pod_uid_pattern('[-_]')})")
_CRED = struct.Struct("3i")
#: ``SO_PEERPIDFD`` (Linux 6.5): a pidfd of the very process that connected. Python names it
#: from 3.13 on; before, its number where the kernel's generic socket options apply
_SO_PEERPIDFD: int | None = getattr(
    socket, "SO_PEERPIDFD", 77 if platform.machine() in ("x86_64", "aarch64", "arm64") else None
)

Kind = Literal["operator", "pod", "unidentified", "anonymous"]


@dataclass(frozen=True)
class Caller:
    kind: Kind
    pod_uid: str | None = None
    why: str = ""

    @property
    def operator(self) -> bool:
        return self.kind == "operator"


@dataclass(frozen=True)
class PeerIdentity:
    """Who the process at the other end of a unix-socket connection was when the connection
    was accepted: its credentials, and its pod (``pod_uid`` None: outside any pod), or why
    it could not be told (``refused``; then it is unidentified)."""

    pid: int
    uid: int = -1
    gid: int = -1
    pod_uid: str | None = None
    refused: str | None = None


def start_time(pid: int, proc: Path = Path("/proc")) -> int:
    """When ``pid``'s process started (field 22 of ``/proc/<pid>/stat``, in clock ticks since
    boot): the same pid with another start time is another process. ``OSError`` if unreadable,
    ``ValueError`` if malformed."""
    text = (proc / str(pid) / "stat").read_text()
    # the command name (field 2) is in parentheses and may hold spaces and parentheses itself
    return int(text[text.rindex(")") + 1 :].split()[19])


def _peer_pidfd(sock: socket.socket, pid: int) -> int | None:
    """A pidfd of the connecting process: the socket's own (exact), else one opened on its pid
    now (a pid reused between the connect and now is not told apart). None where neither can
    be had; ``OSError`` (ESRCH) when the process is gone."""
    if _SO_PEERPIDFD is not None:
        try:
            return int(sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD))
        except OSError as exc:
            if exc.errno == errno.ESRCH:  # the very process that connected is gone
                raise
            # ENOPROTOOPT: a kernel before 6.5
    try:
        return os.pidfd_open(pid)
    except AttributeError:  # no pidfd_open in this build
        return None
    except OSError as exc:
        if exc.errno == errno.ESRCH:  # no process holds the pid: the one that connected is gone
            raise
        return None  # ENOSYS (a kernel before 5.3), EPERM (a seccomp profile): the start time alone tells


def _ended(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has ended (a pidfd turns readable when it does)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def identify_peer(sock: socket.socket, proc: Path = Path("/proc")) -> PeerIdentity:
    """Who is at the other end of the unix socket ``sock`` (see the module docstring):
    read once, when the connection is accepted, and held to the process that connected."""
    try:
        pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    except OSError:
        return PeerIdentity(0, refused="the agent cannot read the peer's credentials (SO_PEERCRED)")
    if pid <= 0:
        return PeerIdentity(pid, uid, gid, refused="the peer's pid is not visible to the agent (run it with hostPID)")
    try:
        pidfd = _peer_pidfd(sock, pid)
    except OSError:
        return PeerIdentity(pid, uid, gid, refused=f"the process that connected (pid {pid}) has ended")
    try:
        try:
            started = start_time(pid, proc)
            pod_uid = pod_uid_of_pid(pid, proc)
        except (OSError, ValueError, IndexError):
            return PeerIdentity(pid, uid, gid, refused=f"cannot read the cgroup of pid {pid}")
        try:
            same = start_time(pid, proc) == started
        except (OSError, ValueError, IndexError):
            same = False
        if not same or (pidfd is not None and _ended(pidfd)):
            return PeerIdentity(pid, uid, gid, refused=f"pid {pid} ended or was reused while the agent read its cgroup")
        return PeerIdentity(pid, uid, gid, pod_uid)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def pod_uid_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The pod UID in ``pid``'s cgroup (``None``: not in a pod). ``OSError`` if unreadable."""
    text = (proc / str(pid) / "cgroup").read_text()
    for line in text.splitlines():
        match = _POD_IN_CGROUP.search(line)
        if match:
            return match.group(1).replace("_", "-")
    return None


def own_pod_uid(proc: Path = Path("/proc")) -> str | None:
    try:
        return pod_uid_of_pid("self", proc)  # type: ignore[arg-type]
    except OSError:
        return None


def bearer_matches(authorization: str, token: str | None) -> bool:
    """Whether an ``Authorization`` header is ``Bearer <token>`` (compared in constant time)."""
    scheme, _, given = authorization.partition(" ")
    return (
        token is not None and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
    )


def _token_ok(request: Request, token: str | None) -> bool:
    return bearer_matches(request.headers.get("authorization", ""), token)


def over_unix_socket(request: Request) -> bool:
    """uvicorn reports no server address for a unix socket connection, a (host, port) for TCP."""
    server = request.scope.get("server")
    return server is None or not isinstance(server, (tuple, list)) or server[1] is None


def caller_identity(request: Request) -> Caller:
    """Who sent ``request`` (see the module docstring for the rules)."""
    settings = request.app.state.settings
    if _token_ok(request, settings.admin_token):
        return Caller("operator", why="admin token")
    state: dict[str, Any] = request.scope.get("state") or {}
    if state.get(POD_UID_KEY):
        return Caller("pod", str(state[POD_UID_KEY]), why="per-pod socket")
    if not over_unix_socket(request):
        return Caller("anonymous", why="TCP without the admin token")
    peer: PeerIdentity | None = state.get(PEER_KEY)
    if peer is None:  # an in-process transport (tests, tools): no socket, no pod
        return Caller("operator", why="in-process")
    if peer.refused is not None:
        return Caller("unidentified", why=peer.refused)
    uid = peer.pod_uid
    if uid is None or uid == request.app.state.own_pod_uid:
        return Caller("operator", why="a process on the node outside any pod" if uid is None else "the agent's own pod")
    return Caller("pod", uid, why=f"pid {peer.pid} in pod {uid}")


def require_operator(caller: Caller) -> None:
    if caller.operator:
        return
    if caller.kind == "anonymous":
        raise Unauthorized(
            "a valid admin token is required for this action",
            hint="send 'Authorization: Bearer <token>' (dsctl: --token or DSAGENT_ADMIN_TOKEN)",
        )
    raise Forbidden(
        f"only an operator may do this ({caller.kind}: {caller.why})",
        hint="evictions and other tasks need the admin token",
    )


def acting_for(request: Request, caller: Caller) -> tuple[str, str] | None:
    """The Dataset an operator's request acts for (``X-Dsagent-For: namespace/name``, docs/operator-guide/tenancy.md).

    Only an operator names one: from anyone else the header is ignored (a pod cannot make
    its request count against, or evict for, another namespace). A malformed value from an
    operator is a 400, so a controller bug never acts unscoped."""
    raw = request.headers.get(ACTING_FOR_HEADER)
    if raw is None or not caller.operator:
        return None
    parsed = parse_acting_for(raw)
    if parsed is None:
        raise InvalidInput(f"{ACTING_FOR_HEADER} must be NAMESPACE/NAME of a Dataset", hint="e.g. 'team-a/imagenet'")
    return parsed


def require_task(caller: Caller, task_id: str, *, write: bool) -> None:
    """An operator may act on any task, a pod only on its own (its UID), anonymous only read."""
    if caller.operator or (caller.kind == "anonymous" and not write):
        return
    if (
        caller.kind == "pod"
        and caller.pod_uid is not None
        and canonical_task_id(caller.pod_uid) == canonical_task_id(task_id)
    ):
        return
    if caller.kind == "anonymous":
        raise Unauthorized(
            "a valid admin token is required for this action",
            hint="send 'Authorization: Bearer <token>' (dsctl: --token or DSAGENT_ADMIN_TOKEN)",
        )
    if caller.kind == "unidentified":
        raise Forbidden(
            f"the agent cannot tell which pod is calling ({caller.why})",
            hint="the agent needs hostPID to identify pods on its socket",
        )
    raise Forbidden(
        f"a pod may only act on its own task ({caller.pod_uid}), not {task_id!r}",
        hint="use the pod's UID as the task id (DSAGENT_TASK_ID)",
    )


def peer_credentials_protocol(proc: Path = Path("/proc")) -> type:
    """uvicorn's HTTP protocol class, storing in each connection's state the call that cuts it
    (:data:`CUT_KEY`) and, for a unix-socket connection, who its peer is (:data:`PEER_KEY`:
    :func:`identify_peer` with the cgroups under ``proc``), read once as it is accepted."""
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    base: type = import_from_string(HTTP_PROTOCOLS["auto"])

    class PeerCredentials(base):  # type: ignore[misc]  # uvicorn picks its protocol class at run time
        def connection_made(self, transport: Any) -> None:
            state: dict[str, Any] = {**getattr(self, "app_state", {}), CUT_KEY: transport.abort}
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                state[PEER_KEY] = identify_peer(sock, proc)
            self.app_state = state
            super().connection_made(transport)

    return PeerCredentials


__all__ = [
    "CUT_KEY",
    "POD_UID_KEY",
    "PEER_KEY",
    "Caller",
    "PeerIdentity",
    "acting_for",
    "caller_identity",
    "identify_peer",
    "own_pod_uid",
    "peer_credentials_protocol",
    "pod_uid_of_pid",
    "require_operator",
    "require_task",
    "start_time",
]
