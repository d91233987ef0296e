"""``AgentClient``: talk to the local agent's ``/v1`` API over its unix socket or TCP.

Who calls it: ``dsctl`` (cache, ls, evict, status, release, wait) and the Kubernetes
integration's init-container mode. It turns the agent's JSON errors back into the
dsagent error tree (same ``code`` -> same class), and an agent that cannot be reached
into :class:`AgentUnreachable` with one line saying how to start it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import httpx

from dsagent import errors
from dsagent.errors import AgentUnreachable, DsagentError, InvalidInput, StillRunning
from dsplatform.names import TASK_ID_HINT, canonical_task_id
from dsplatform.wire.agenttask import TaskStatusBody, task_request

#: the longest the client asks the agent to hold one request of an operation open
OPERATION_POLL = 20.0

_BY_CODE: dict[str, type[DsagentError]] = {
    cls.code: cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, DsagentError)
}


def agent_url(text: str) -> str:
    """``--agent`` as a base URL: ``127.0.0.1:17420`` means ``http://127.0.0.1:17420``."""
    candidate = text.strip() if "://" in text else f"http://{text.strip()}"
    try:
        parsed = httpx.URL(candidate)
    except (httpx.InvalidURL, ValueError) as exc:
        raise InvalidInput(f"invalid agent URL {text!r}", hint="e.g. http://127.0.0.1:7420 or 127.0.0.1:7420") from exc
    bad_port = parsed.port is not None and not 0 < parsed.port < 65536
    if parsed.scheme not in ("http", "https") or not parsed.host or bad_port:
        raise InvalidInput(
            f"invalid agent URL {text!r}",
            hint="e.g. http://127.0.0.1:7420 or 127.0.0.1:7420 (the unix socket: --socket PATH)",
        )
    return candidate


class AgentClient:
    """A small synchronous client; ``url`` (http://host:port) selects TCP, else ``socket_path``.

    It reads no environment: ``dsctl`` finds the socket and the token at its edge
    (:func:`dsagent.cli.options.default_socket`, ``--socket``/``--agent``/``--token``)."""

    def __init__(
        self,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._grace = timeout  # beyond the time the agent was asked to hold a request
        self._socket: Path | None = None
        if url:
            url = agent_url(url)
            self.where = url
            self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout)
        else:
            if socket_path is None:
                raise TypeError("AgentClient needs url or socket_path")
            path = Path(socket_path)
            self.where = str(path)
            self._socket = path
            self._http = httpx.Client(
                # plain HTTP over the socket, never TLS: no CA bundle loaded (28 ms of dsctl's start)
                transport=httpx.HTTPTransport(uds=str(path), verify=False),
                base_url="http://dsagent",
                headers=headers,
                timeout=timeout,
            )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **request: Any) -> Any:
        """:meth:`_send`'s answer as JSON when it is JSON, else as text."""
        response = self._send(method, path, **request)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if self._socket is not None and not self._socket.exists():
            raise self._unreachable()
        try:
            response = self._http.request(method, path, json=json, params=params, **extra)
        except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise self._unreachable() from exc
        except httpx.TimeoutException as exc:
            raise errors.TransientError(f"the agent at {self.where} did not answer in time") from exc
        if response.status_code >= 400:
            raise _error_from(response)
        return response

    def _operation(
        self,
        method: str,
        path: str,
        *,
        timeout: float | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
        params: Mapping[str, Any] | None = None,
        **request: Any,
    ) -> dict[str, Any]:
        """An action the agent may carry out as an operation (202, :mod:`dsagent.api.operations`):
        its result once finished, its error raised once failed; :class:`StillRunning` when
        ``timeout`` (seconds, ``None``: no limit) passes first, the action going on. ``request``:
        the rest of :meth:`_send`'s arguments (``json``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = _hold(deadline)
        response = self._send(
            method, path, params={**(params or {}), "wait": wait}, timeout=wait + self._grace, **request
        )
        if response.status_code != 202:
            return _object(response.json(), self.where, path)
        op = self._until_done(_object(response.json(), self.where, path), deadline, progress)
        if op.get("state") == "failed":
            raise operation_error(op)
        result = op.get("result")
        return result if isinstance(result, dict) else {}

    def follow_operation(
        self,
        op_id: str,
        *,
        timeout: float | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Operation ``op_id`` once it has finished (succeeded or failed, as the agent says);
        :class:`StillRunning` when ``timeout`` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._until_done(self.operation(op_id), deadline, progress)

    def _until_done(
        self,
        op: dict[str, Any],
        deadline: float | None,
        progress: Callable[[dict[str, Any]], None] | None,
    ) -> dict[str, Any]:
        """Long-poll ``op`` until it is no longer running, showing each running state."""
        while op.get("state") == "running":
            if progress is not None:
                progress(op)
            if deadline is not None and time.monotonic() >= deadline:
                raise still_running(op)
            wait = _hold(deadline)
            op = self._json("GET", str(op["href"]), params={"wait": wait}, timeout=wait + self._grace)
        return op

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """A call whose answer must be a JSON object; anything else is the agent's fault, said so."""
        return _object(self._call(method, path, **kwargs), self.where, path)

    def _unreachable(self) -> AgentUnreachable:
        return AgentUnreachable(
            f"no dsagent is answering at {self.where}",
            hint="start it with 'dsagent serve' (or point DSAGENT_SOCKET / DSAGENT_AGENT at a running agent)",
        )

    # -- tasks ------------------------------------------------------------------------

    def submit_task(self, task_id: str, datasets: Sequence[Mapping[str, Any]], *, wait: float = 0.0) -> TaskStatusBody:
        """Ask the agent to hold ``datasets`` for the task (:mod:`dsplatform.wire.agenttask`)."""
        body = task_request(datasets)
        answer = self._json("PUT", f"/v1/tasks/{_task(task_id)}", json=body, params={"wait": wait}, timeout=wait + 30.0)
        return cast(TaskStatusBody, answer)

    def tasks(self) -> list[TaskStatusBody]:
        """The tasks this caller may read (``GET /v1/tasks``), oldest first."""
        return [cast(TaskStatusBody, t) for t in self._json("GET", "/v1/tasks").get("tasks") or []]

    def get_task(self, task_id: str, *, wait: float = 0.0) -> TaskStatusBody:
        """Where the task stands; ``wait``: the agent holds the answer until the task's
        running work ends, at most that many seconds (an agent that predates ``wait``
        answers at once)."""
        path = f"/v1/tasks/{_task(task_id)}"
        if not wait:
            return cast(TaskStatusBody, self._json("GET", path))
        return cast(TaskStatusBody, self._json("GET", path, params={"wait": wait}, timeout=wait + self._grace))

    def release_task(
        self,
        task_id: str,
        *,
        timeout: float | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Release a task (an operation: see :meth:`_operation` for ``timeout`` and ``progress``)."""
        return self._operation("DELETE", f"/v1/tasks/{_task(task_id)}", timeout=timeout, progress=progress)

    # -- next-task preparations (docs/design.md#next-job-preparation) --------------------

    def prepare(
        self,
        task_id: str,
        datasets: Sequence[Mapping[str, Any]],
        *,
        phase: int = 1,
        first_threshold: float | None = None,
        second_threshold: float | None = None,
    ) -> dict[str, Any]:
        """Prepare (or renew) task ``task_id``'s datasets on the agent's node (operator)."""
        body: dict[str, Any] = {"datasets": [dict(d) for d in datasets], "phase": phase}
        if first_threshold is not None:
            body["firstThreshold"] = first_threshold
        if second_threshold is not None:
            body["secondThreshold"] = second_threshold
        return self._json("PUT", f"/v1/preparations/{_task(task_id)}", json=body)

    def preparation(self, task_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/preparations/{_task(task_id)}")

    def preparations(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/preparations").get("preparations") or [])

    def release_preparation(self, task_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"/v1/preparations/{_task(task_id)}")

    # -- datasets and operator actions -------------------------------------------------

    # -- striped versions (docs/design-striping.md) -------------------------------------

    def hold_stripe(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("PUT", f"/v1/stripes/{quote(name, safe='')}", json=dict(body))

    def release_stripe(self, name: str, digest: str | None = None) -> dict[str, Any]:
        query = f"?digest={quote(digest, safe='')}" if digest else ""
        return self._json("DELETE", f"/v1/stripes/{quote(name, safe='')}{query}")

    def stripe_status(self, name: str, digest: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/stripes/{quote(name, safe='')}/{quote(digest, safe='')}")

    def datasets(self) -> dict[str, Any]:
        return self._json("GET", "/v1/datasets")

    def dataset(self, name: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/datasets/{_segment(name)}")

    def evict_dataset(
        self,
        name: str,
        *,
        force: bool = False,
        dry_run: bool = False,
        timeout: float | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        params = {"force": str(force).lower(), "dryRun": str(dry_run).lower()}
        return self._operation(
            "DELETE", f"/v1/datasets/{_segment(name)}", params=params, timeout=timeout, progress=progress
        )

    def operation(self, op_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        """An operation's state (``GET /v1/operations/{id}``), held up to ``wait`` seconds."""
        return self._json("GET", f"/v1/operations/{_segment(op_id)}", params={"wait": wait}, timeout=wait + self._grace)

    def evict(
        self,
        *,
        mode: str,
        names: Sequence[str] = (),
        bytes: int | None = None,
        force: bool = False,
        dry_run: bool = False,
        timeout: float | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Evict (an operation: see :meth:`_operation` for ``timeout`` and ``progress``)."""
        body = {"mode": mode, "names": list(names), "bytes": bytes, "force": force, "dryRun": dry_run}
        return self._operation("POST", "/v1/evict", json=body, timeout=timeout, progress=progress)

    def inventory(self) -> dict[str, Any]:
        return self._json("GET", "/v1/inventory")

    def health(self) -> bool:
        return bool(self._call("GET", "/healthz").get("status") == "ok")

    def metrics(self) -> str:
        return str(self._call("GET", "/metrics"))


def _task(task_id: str) -> str:
    """``task_id`` as a path segment, refused here when the agent would refuse it: a '/' in
    it reached the agent decoded, as another route, and came back as a bare "Not Found"."""
    if canonical_task_id(task_id) is None:
        raise InvalidInput(f"invalid task id {task_id!r}", hint=TASK_ID_HINT)
    return _segment(task_id)


def _segment(value: str) -> str:
    """A path segment, percent-encoded so a name can never change the route."""
    from urllib.parse import quote

    return quote(value, safe="")


def _hold(deadline: float | None) -> float:
    """How long the agent may hold one request of an operation open (``deadline``: monotonic)."""
    left = OPERATION_POLL if deadline is None else max(0.0, min(OPERATION_POLL, deadline - time.monotonic()))
    return round(left, 3)


def _object(body: Any, where: str, path: str) -> dict[str, Any]:
    """A call's answer that must be a JSON object; anything else is the agent's fault, said so."""
    if not isinstance(body, dict):
        raise errors.DsagentError(f"the agent at {where} answered {path} with something other than a JSON object")
    return body


def _error_from(response: httpx.Response) -> DsagentError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    return _error_from_body(body, status=response.status_code, fallback=f"the agent answered {response.status_code}")


def _error_from_body(body: Any, *, status: int | None = None, fallback: str) -> DsagentError:
    """The error class of an ``ErrorOut`` body (same ``code`` -> same class)."""
    if not isinstance(body, dict):
        body = {}
    cls = _BY_CODE.get(str(body.get("code")))
    if cls is None:
        cls = next((c for c in _BY_CODE.values() if c.http_status == status), DsagentError)
    message = str(body.get("message") or fallback)
    raw = body.get("details")
    details: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return cls(message, hint=body.get("hint"), **details)


def operation_error(op: Mapping[str, Any]) -> DsagentError:
    """The error a failed operation ``op`` carries, as the class its code names."""
    return _error_from_body(op.get("error"), fallback=f"operation {op.get('id')} failed")


def still_running(op: Mapping[str, Any]) -> StillRunning:
    """The client stopped waiting for operation ``op`` (``--timeout``); the action goes on."""
    target = f" {op['target']}" if op.get("target") else ""
    return StillRunning(
        f"{op.get('kind', 'the action')}{target} is still running on the agent "
        f"(operation {op.get('id')}, {float(op.get('elapsedSeconds') or 0):.0f} s so far)",
        hint=f"it goes on without dsctl; follow it with 'dsctl operation {op.get('id')}'",
        operation=str(op.get("id")),
    )


__all__ = ["AgentClient", "agent_url", "operation_error", "still_running"]
