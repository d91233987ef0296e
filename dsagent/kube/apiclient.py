"""The one place dsagent meets the ``kubernetes`` client: configuration and error mapping.

``load()`` builds an :class:`kubernetes.client.ApiClient` from the in-cluster service
account when running in a pod, else from a kubeconfig (``KUBECONFIG`` or ``~/.kube/config``).
``translated(what)`` turns the client's exceptions into the dsagent error tree where they
enter: 404 -> :class:`NotFound`, 409 -> :class:`Conflict`, 400/422 -> :class:`InvalidInput`,
401/403 -> :class:`KubeForbidden`, everything else (5xx, 410, connection failures) ->
:class:`KubeUnavailable` (transient: worth retrying).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from dsagent.errors import Conflict, Forbidden, InvalidInput, NotFound, TransientError
from dsplatform.heap import collector_paused

_T = TypeVar("_T")


class KubeUnavailable(TransientError):
    """The API server failed or could not be reached: worth retrying."""

    code = "kubernetes_unavailable"


class KubeForbidden(Forbidden):
    """The API server refused this process's service account (403, exit 9)."""

    code = "kubernetes_forbidden"


def loads_list(data: bytes | str) -> Any:
    """A list's JSON parsed with the cyclic garbage collector paused
    (:func:`dsplatform.heap.collector_paused`: a list of thousands of objects is millions of
    containers, none of them in a reference cycle)."""
    with collector_paused():
        return json.loads(data)


def load(kubeconfig: str | None = None) -> Any:
    """An ApiClient for this process: in-cluster, else kubeconfig."""
    from kubernetes import client, config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    try:
        configuration = client.Configuration()
        # The client reads KUBECONFIG once, at import; read it now so the call sees the
        # environment it runs in (a colon-separated list is merged by the client).
        config_file = kubeconfig or os.environ.get("KUBECONFIG") or None
        config.load_kube_config(config_file=config_file, client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        raise KubeUnavailable(
            f"no Kubernetes configuration: {exc}",
            hint="run in a pod with a service account, or set KUBECONFIG",
        ) from exc
    return client.ApiClient(configuration)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a client exception (None for connection-level failures)."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and status > 0 else None


def evict(core: Any, namespace: str, name: str, *, timeout: float | None = None) -> int | None:
    """Evict pod ``namespace/name`` through the Eviction API (``core``: a ``CoreV1Api``), so
    that PodDisruptionBudgets hold; None when it was evicted, else the status the API server
    refused it with (429: a budget; 404: the pod is gone)."""
    from kubernetes.client.exceptions import ApiException

    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    extra: dict[str, Any] = {"_request_timeout": timeout} if timeout is not None else {}
    try:
        core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False, **extra)
    except ApiException as exc:
        return exc.status  # type: ignore[no-any-return]
    return None


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Map the client's exceptions raised inside the block to dsagent errors about ``what``."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        status = status_of(exc)
        reason = f"{what}: HTTP {status} {exc.reason or ''}".rstrip()
        if status == 404:
            raise NotFound(f"{what}: not found") from exc
        if status == 409:
            raise Conflict(f"{what}: conflict (changed meanwhile)") from exc
        if status in (400, 415, 422):
            raise InvalidInput(reason) from exc
        if status in (401, 403):
            raise KubeForbidden(reason, hint="check the service account's RBAC rules in the chart") from exc
        raise KubeUnavailable(reason) from exc
    except (HTTPError, OSError) as exc:
        raise KubeUnavailable(f"{what}: the API server is unreachable ({type(exc).__name__})") from exc


async def in_daemon_thread(call: Callable[[], _T]) -> _T:
    """``call()`` (a blocking API call) in a daemon thread of its own: awaiting it can be
    abandoned (a timeout), and a call that never returns holds up neither the default
    executor nor the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def run() -> None:
        try:
            result = call()
        except BaseException as exc:  # handed to the awaiting side, whatever it is
            error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(settle, lambda: future.set_exception(error))
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, lambda: future.set_result(result))

    threading.Thread(target=run, name="dsagent-kube-call", daemon=True).start()
    return await future


__all__ = ["KubeForbidden", "KubeUnavailable", "evict", "in_daemon_thread", "load", "status_of", "translated"]
