"""The one place dsagent meets the ``kubernetes`` client: configuration and error mapping.

``load()`` builds an :class:`kubernetes.client.ApiClient` from the in-cluster service
account when running in a pod, else from a kubeconfig (``KUBECONFIG`` or ``~/.kube/config``).
``translated(what)`` turns the client's exceptions into the dsagent error tree where they
enter: 404 -> :class:`NotFound`, 409 -> :class:`Conflict`, 400/422 -> :class:`InvalidInput`,
401/403 -> :class:`KubeForbidden`, everything else (5xx, 410, connection failures) ->
:class:`KubeUnavailable` (transient: worth retrying).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from dsagent.errors import Conflict, Forbidden, InvalidInput, NotFound, TransientError


class KubeUnavailable(TransientError):
    """The API server failed or could not be reached: worth retrying."""

    code = "kubernetes_unavailable"


class KubeForbidden(Forbidden):
    """The API server refused this process's service account (403, exit 9)."""

    code = "kubernetes_forbidden"


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


__all__ = ["KubeForbidden", "KubeUnavailable", "load", "status_of", "translated"]
