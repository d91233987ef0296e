"""What a pod bound to this node asks of its agent, read from the pod object alone: whether it
names datasets, whether it has ended, the Datasets its annotation names, and the request its
init-container will send.

Who calls it: :class:`dsagent.nodeagent.clusteragent.ClusterAgent`, for each pod its watch
reports. Pure: no API calls, no service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsagent.cache.task import DatasetRequest
from dsagent.kube.podenv import INIT_CONTAINER, OPTIONS_PREFIX, REQUEST_VARIABLES, datasets_from_env
from dsplatform import errors as platform_errors
from dsplatform.wire import podannotations

TERMINAL_PHASES = ("Succeeded", "Failed")


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def has_ended(pod: Mapping[str, Any]) -> bool:
    """A pod whose containers will not run again (or that is going away)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in TERMINAL_PHASES or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def wants_datasets(pod: Mapping[str, Any]) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return podannotations.DATASETS_ANNOTATION in annotations or init_container(pod) is not None


def init_container(pod: Mapping[str, Any], name: str = INIT_CONTAINER) -> Mapping[str, Any] | None:
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if isinstance(container, Mapping) and container.get("name") == name:
            return container
    return None


def requests_from_init_container(container: Mapping[str, Any]) -> list[DatasetRequest] | None:
    """The request the webhook's init-container will send, read as ``dsctl`` reads it
    (:func:`dsagent.kube.podenv.datasets_from_env`); None when a variable it needs has no
    literal value here (storage options or anything else taken from a Secret)."""
    env = container.get("env") or []
    for e in env:
        name = str(e.get("name"))
        if name.startswith(OPTIONS_PREFIX) or (name in REQUEST_VARIABLES and "value" not in e):
            return None
    literal = {str(e.get("name")): str(e["value"]) for e in env if "value" in e}
    if not literal.get("DSAGENT_DATASETS"):
        return None
    return [DatasetRequest(**item) for item in datasets_from_env(literal)]


def _dataset_names(pod: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """(namespace, name) of each Dataset a pod's annotation names (none when unreadable)."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    try:
        return frozenset((namespace, ref.name) for ref in podannotations.datasets_of(pod))
    except platform_errors.InvalidInput:
        return frozenset()


def pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def datasets_read(pod: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """The Datasets a pod reads now: those its annotation names while it runs, none once it
    has ended."""
    return frozenset() if has_ended(pod) else _dataset_names(pod)


__all__ = [
    "TERMINAL_PHASES", "datasets_read", "has_ended", "init_container", "pod_name", "pod_uid",
    "requests_from_init_container", "wants_datasets",
]  # fmt: skip
