"""The audit line: who pinned, released or evicted what, and for which Dataset.

Who calls it: :func:`dsagent.api.create_app` installs :class:`OperatorAudit` inside the
route timing. What it owns: one log line (logger ``dsagent.audit``) and one count
(``dsplatform_agent_operator_requests_total``) per operator request that changes what the
node holds: ``pin`` (``PUT /v1/tasks/{id}``), ``release`` (``DELETE /v1/tasks/{id}``) and
``evict`` (``DELETE /v1/datasets/{name}``, ``POST /v1/evict``). A pod acting on its own
task is not an operator and is not audited here (its task is its pod UID).

The line names the Dataset the request acts for, from the controller's
``X-Dsagent-For: namespace/name`` header (:mod:`dsplatform.tenancy`; ``-`` when an
operator acts by hand), so an operator can tell which Dataset evicted or pinned what
(docs/operator-guide/tenancy.md)::

    audit action=evict for=team-a/imagenet task=- target=/v1/evict status=200 caller="admin token" client=10.0.0.7
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dsagent.api.middleware import HttpMiddleware
from dsplatform.tenancy import ACTING_FOR_HEADER, NO_DATASET, parse_acting_for

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Scope

    from dsagent.cache.metrics import Metrics

log = logging.getLogger("dsagent.audit")

#: (method, route template) -> action
ACTIONS = {
    ("PUT", "/v1/tasks/{task_id}"): "pin",
    ("DELETE", "/v1/tasks/{task_id}"): "release",
    ("DELETE", "/v1/datasets/{name}"): "evict",
    ("POST", "/v1/evict"): "evict",
}


class OperatorAudit(HttpMiddleware):
    """Log and count each operator request that pins, releases or evicts (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    def wants(self, scope: Scope) -> bool:
        return scope["method"] in ("PUT", "DELETE", "POST")

    def answered(self, scope: Scope, status: int, seconds: float) -> None:
        self._record(scope, status)

    def _record(self, scope: Scope, status: int) -> None:
        route = getattr(scope.get("route"), "path", None)
        action = ACTIONS.get((scope["method"], route or ""))
        if action is None:
            return
        from starlette.requests import Request

        from dsagent.api.identity import caller_identity

        request = Request(scope)
        try:
            who = caller_identity(request)
        except Exception:  # the caller could not be told: the route refused it, nothing to audit
            return
        if not who.operator:
            return
        dataset = parse_acting_for(request.headers.get(ACTING_FOR_HEADER))
        namespace = dataset[0] if dataset is not None else NO_DATASET
        named = f"{dataset[0]}/{dataset[1]}" if dataset is not None else NO_DATASET
        params = scope.get("path_params") or {}
        client = scope.get("client")
        self.metrics.operator_request(action, namespace, status)
        log.info(
            "audit action=%s for=%s task=%s target=%s status=%d caller=%r client=%s",
            action,
            named,
            params.get("task_id", NO_DATASET),
            scope.get("path", ""),
            status,
            who.why,
            client[0] if client else "local",
        )


__all__ = ["ACTIONS", "OperatorAudit"]
