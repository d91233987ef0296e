"""Who is calling the agent: an operator, a pod (and which), or an anonymous network client.

Who calls it: :mod:`dsagent.api.routes` (every route that acts on a task or evicts), and
``dsagent serve``, which installs :func:`peer_credentials_protocol` so that each unix-socket
connection carries its peer's credentials. A later per-pod socket (the kubelet
integration) names its pod by setting :data:`POD_UID_KEY` in the connection's state;
:func:`caller_identity` is the one place that turns a request into a :class:`Caller`.

The rules (issue 10, finding 7: any pod on the node had operator rights):

- a valid ``Authorization: Bearer $DSAGENT_ADMIN_TOKEN`` is an **operator**, on any transport;
- a per-pod listener's pod UID (:data:`POD_UID_KEY`) is that **pod**;
- on the unix socket, the peer's pid (``SO_PEERCRED``) names its cgroup
  (``/proc/<pid>/cgroup``), and a cgroup under ``kubepods`` names the **pod** UID. The
  agent's own pod (``kubectl exec`` into it) and processes outside any pod (``dsctl`` on
  the node, root's tools) are **operators**: the socket's file mode already limits those
  to root and the socket's group. A peer whose pid the agent cannot see (pid 0: the agent
  lacks ``hostPID``) or whose cgroup cannot be read is **unidentified**: it may read, not act;
- over TCP without the token: **anonymous**, reads only.

A pod may create, read and release only the task whose id is its own UID; evictions,
``force`` and other tasks need an operator.
"""

from __future__ import annotations

import hmac
import re
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
#: The connection-state key under which :func:`peer_credentials_protocol` stores ``(pid, uid, gid)``.
PEER_KEY = "dsagent.peer"

# the pod UID rule with systemd's '_' for '-' (kubepods-besteffort-pod<uid with _>.slice)
_POD_IN_CGROUP = re.compile(f"pod({pod_uid_pattern('[-_]')})")
_CRED = struct.Struct("3i")

Kind = Literal["operator", "pod", "unidentified", "anonymous"]


@dataclass(frozen=True)
class Caller:
    kind: Kind
    pod_uid: str | None = None
    why: str = ""

    @property
    def operator(self) -> bool:
        return self.kind == "operator"


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
    peer = state.get(PEER_KEY)
    if peer is None:  # an in-process transport (tests, tools): no socket, no pod
        return Caller("operator", why="in-process")
    pid = peer[0]
    if pid <= 0:
        return Caller("unidentified", why="the peer's pid is not visible to the agent (run it with hostPID)")
    proc = Path(settings.proc_root)
    try:
        uid = pod_uid_of_pid(pid, proc)
    except OSError:
        return Caller("unidentified", why=f"cannot read the cgroup of pid {pid}")
    if uid is None or uid == request.app.state.own_pod_uid:
        return Caller("operator", why="a process on the node outside any pod" if uid is None else "the agent's own pod")
    return Caller("pod", uid, why=f"pid {pid} in pod {uid}")


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
    """The Dataset an operator's request acts for (``X-Dsagent-For: namespace/name``, docs/tenancy.md).

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


def peer_credentials_protocol() -> type:
    """uvicorn's HTTP protocol class, storing each unix-socket connection's peer credentials
    (pid, uid, gid from ``SO_PEERCRED``) in its state under :data:`PEER_KEY`."""
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    base: type = import_from_string(HTTP_PROTOCOLS["auto"])

    class PeerCredentials(base):  # type: ignore[misc]  # uvicorn picks its protocol class at run time
        def connection_made(self, transport: Any) -> None:
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                try:
                    peer = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
                except OSError:
                    peer = (0, -1, -1)
                state: dict[str, Any] = getattr(self, "app_state", {})
                self.app_state = {**state, PEER_KEY: peer}
            super().connection_made(transport)

    return PeerCredentials


__all__ = [
    "POD_UID_KEY",
    "PEER_KEY",
    "Caller",
    "acting_for",
    "caller_identity",
    "own_pod_uid",
    "peer_credentials_protocol",
    "pod_uid_of_pid",
    "require_operator",
    "require_task",
]
