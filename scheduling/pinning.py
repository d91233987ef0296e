"""What a placement may change on a pod, as RFC 6902 JSON Patch operations.

Who calls it: the admission webhook, which pins a one-pod job to its plan's node and gates
the workers of a multi-worker job (:mod:`dsagent.webhook.deadlineplan`,
:mod:`dsagent.webhook.plangate`), and the Dataset controller's plan loop, which pins each
gated worker to its node and lifts the gate (:mod:`dsagent.controller.plangates`).

The Kubernetes rules these operations keep to (the API server's pod update validation):

- a pod's scheduling gates are set when it is created; afterwards gates can only be
  removed, never added;
- while a pod is gated, its node affinity may only narrow: a required node affinity may be
  set when it has none, and otherwise only new requirements may be added to each existing
  term (``matchExpressions`` or ``matchFields``); terms cannot be added or removed and the
  existing requirements cannot change. :func:`require_node` adds ``matchFields
  metadata.name In [node]`` to every term (terms are ORed, requirements in a term ANDed), so
  every term allows that node only;
- resource requests cannot change after creation: a plan of a gated pod is a choice of
  nodes for the GPUs its workers already ask for.

Each builder changes the pod it is given as the operations will, so that a caller can read
the result, and raises :class:`~dsplatform.errors.InvalidInput` for a pod of a shape no
patch can apply to (pod objects are hostile input). Pure: no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dsplatform.errors import InvalidInput

JSONPatch = list[dict[str, Any]]
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
GATES_PATH = "/spec/schedulingGates"
MAX_GATES = 64  # more scheduling gates than this on one pod is not a pod this code places


def escape(key: str) -> str:
    """``key`` as one JSON Pointer segment (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


def require_node(pod: dict[str, Any], node: str) -> JSONPatch:
    """A required node affinity to ``node``: a new one, or ``matchFields`` added to every
    existing required term (terms are ORed, expressions in a term ANDed)."""
    field_term = {"key": "metadata.name", "operator": "In", "values": [node]}
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise InvalidInput("the pod's spec is not an object")
    affinity = spec.get("affinity")
    if affinity is not None and not isinstance(affinity, dict):
        raise InvalidInput("the pod's affinity is not an object")
    if not isinstance(affinity, dict):
        terms: list[dict[str, Any]] = [{"matchFields": [field_term]}]
        value = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}
        spec["affinity"] = value
        return [{"op": "add", "path": "/spec/affinity", "value": copy.deepcopy(value)}]
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is not None and not isinstance(node_affinity, dict):
        raise InvalidInput("the pod's nodeAffinity is not an object")
    required = {"nodeSelectorTerms": [{"matchFields": [field_term]}]}
    if not isinstance(node_affinity, dict):
        affinity["nodeAffinity"] = {REQUIRED: required}
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": copy.deepcopy(affinity["nodeAffinity"])}]
    selector = node_affinity.get(REQUIRED)
    if selector is not None and not isinstance(selector, dict):
        raise InvalidInput(f"the pod's nodeAffinity.{REQUIRED} is not an object")
    existing = (selector or {}).get("nodeSelectorTerms")
    if not isinstance(existing, list) or not existing:
        node_affinity[REQUIRED] = required
        return [{"op": "add", "path": f"/spec/affinity/nodeAffinity/{REQUIRED}", "value": copy.deepcopy(required)}]
    if not all(isinstance(term, dict) for term in existing):
        raise InvalidInput("the pod's required node affinity has a term that is not an object")
    ops: JSONPatch = []
    for i, term in enumerate(existing):
        base = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms/{i}/matchFields"
        fields = term.get("matchFields")
        if fields is not None and not isinstance(fields, list):
            raise InvalidInput("the pod's required node affinity has matchFields that are not a list")
        if isinstance(fields, list):
            fields.append(dict(field_term))
            ops.append({"op": "add", "path": base + "/-", "value": dict(field_term)})
        else:
            term["matchFields"] = [dict(field_term)]
            ops.append({"op": "add", "path": base, "value": [dict(field_term)]})
    return ops


def required_node(pod: Mapping[str, Any]) -> str | None:
    """The node every required node-affinity term of ``pod`` names with ``matchFields
    metadata.name In [node]`` (what :func:`require_node` adds), or None."""
    spec = pod.get("spec")
    affinity = spec.get("affinity") if isinstance(spec, dict) else None
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    selector = node_affinity.get(REQUIRED) if isinstance(node_affinity, dict) else None
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, dict) else None
    if not isinstance(terms, list) or not terms:
        return None
    named: set[str] = set()
    for term in terms:
        fields = term.get("matchFields") if isinstance(term, dict) else None
        found = {
            f["values"][0]
            for f in (fields if isinstance(fields, list) else [])
            if isinstance(f, dict)
            and f.get("key") == "metadata.name"
            and f.get("operator") == "In"
            and isinstance(f.get("values"), list)
            and len(f["values"]) == 1
            and isinstance(f["values"][0], str)
        }
        if len(found) != 1:
            return None
        named |= found
    return named.pop() if len(named) == 1 else None


def gates(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's scheduling gates, in order; InvalidInput for another shape."""
    spec = pod.get("spec")
    found = spec.get("schedulingGates") if isinstance(spec, dict) else None
    if found is None:
        return []
    if not isinstance(found, list) or len(found) > MAX_GATES:
        raise InvalidInput(f"the pod's schedulingGates is not a list of at most {MAX_GATES} gates")
    names = []
    for gate in found:
        name = gate.get("name") if isinstance(gate, dict) else None
        if not isinstance(name, str):
            raise InvalidInput("the pod has a scheduling gate without a name")
        names.append(name)
    return names


def add_gate(pod: dict[str, Any], gate: str) -> JSONPatch:
    """``gate`` added to the pod's scheduling gates (at admission: gates cannot be added later)."""
    existing = gates(pod)
    if gate in existing:
        return []
    if not isinstance(pod.get("spec"), dict):
        raise InvalidInput("the pod's spec is not an object")
    if not existing and pod["spec"].get("schedulingGates") is None:
        pod["spec"]["schedulingGates"] = [{"name": gate}]
        return [{"op": "add", "path": GATES_PATH, "value": [{"name": gate}]}]
    pod["spec"]["schedulingGates"].append({"name": gate})
    return [{"op": "add", "path": GATES_PATH + "/-", "value": {"name": gate}}]


def remove_gate(pod: Mapping[str, Any], gate: str) -> JSONPatch:
    """The operations that lift ``gate`` (none when the pod does not carry it): a test that the
    gate is still at its place, then its removal, so a pod changed meanwhile is refused (422)
    rather than losing another gate."""
    existing = gates(pod)
    if gate not in existing:
        return []
    index = existing.index(gate)
    path = f"{GATES_PATH}/{index}"
    return [{"op": "test", "path": path + "/name", "value": gate}, {"op": "remove", "path": path}]


def set_annotation(pod: dict[str, Any], key: str, value: str) -> JSONPatch:
    """``metadata.annotations[key] = value`` (the map created when the pod has none)."""
    meta = pod.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise InvalidInput("the pod's metadata is not an object")
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        raise InvalidInput("the pod's annotations are not an object")
    if annotations is None:
        meta["annotations"] = {key: value}
        return [{"op": "add", "path": "/metadata/annotations", "value": {key: value}}]
    annotations[key] = value
    return [{"op": "add", "path": "/metadata/annotations/" + escape(key), "value": value}]


__all__ = [
    "GATES_PATH",
    "JSONPatch",
    "add_gate",
    "escape",
    "gates",
    "remove_gate",
    "require_node",
    "required_node",
    "set_annotation",
]
