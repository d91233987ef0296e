"""Copy counts (docs/design.md#cluster-eviction): how many nodes hold each dataset version
ready, counted from the agents' inventories and written to the ConfigMap
``dsplatform-dataset-copies`` in the controller's namespace (:mod:`dsagent.policy.copies`).

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile_all`, each pass.
Agents read the ConfigMap to keep the cluster's last copy of a version when they evict: one
object for every agent to read, rather than every agent listing every Node. Rewritten each
resync with its time, so an agent can tell a controller that stopped (stale counts are
ignored: plain LRU again).
"""

from __future__ import annotations

from typing import Any

from dsagent.controller.controllermetrics import ControllerMetrics
from dsagent.kube.datasets import MERGE_PATCH
from dsagent.policy import copies
from dsplatform.wire import copycounts as wire


def publish_copies(
    core: Any,
    tallied: copies.Tally,
    *,
    configmap: str | None,
    namespace: str,
    now: float,
    metrics: ControllerMetrics,
) -> None:
    """Write each version's ready copies and keeper (``tallied`` from the pass's
    inventories, :func:`dsagent.policy.copies.tally`) to ``configmap`` (None: not published)."""
    counts = tallied.counts
    for label, low, high in (("1", 1, 1), ("2", 2, 2), ("3+", 3, None)):
        metrics.versions_by_copies.labels(copies=label).set(
            sum(1 for c in counts.values() if c >= low and (high is None or c <= high))
        )
    if configmap is None:
        return
    from kubernetes.client.exceptions import ApiException

    data = {wire.DATA_KEY: wire.copies_document(counts, at=now, keepers=tallied.keepers)}
    try:
        core.patch_namespaced_config_map(configmap, namespace, {"data": data}, _content_type=MERGE_PATCH)
    except ApiException as exc:
        if exc.status != 404:
            raise
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": configmap,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/part-of": "dsplatform", "app.kubernetes.io/component": "controller"},
            },
            "data": data,
        }
        core.create_namespaced_config_map(namespace, body)


__all__ = ["publish_copies"]
