"""Which nodes a pod's own placement rules allow: kube-scheduler's node filters that a plan
must respect before it pins a pod to a node.

Who calls it: the Dataset controller's plan loop (:mod:`scheduling.gatedjobs`), which pins
each worker of a gated job with a required node affinity: a node the pod's ``nodeSelector``,
required node affinity or tolerations rule out would leave the worker pending for good.

What is read, as kube-scheduler reads it (``NodeAffinity``, ``TaintToleration`` and
``NodeUnschedulable`` plugins): ``spec.nodeSelector`` (every label equal), the required node
affinity (terms ORed, each term's requirements ANDed; an empty term matches nothing;
``matchExpressions`` on labels with ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``,
``Lt``; ``matchFields`` on ``metadata.name`` with ``In`` and ``NotIn``), the node's
``NoSchedule`` and ``NoExecute`` taints against the pod's tolerations, and a cordoned node
(``spec.unschedulable``). What is not read: inter-pod affinity and topology spread (the caller
refuses pods that require them), CPU, memory and other resources, ports and volumes.

Pods and nodes are hostile input: a rule of a shape the API server would not accept raises
:class:`~dsplatform.errors.InvalidInput`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsplatform.errors import InvalidInput

MAX_RULES = 256  # terms, requirements, values, tolerations, taints: more is not a pod we plan


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_RULES:
        raise InvalidInput(f"the pod's {what} is not a list of at most {MAX_RULES}")
    return value


def _dict(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"the pod's {what} is not an object")
    return value


def _strings(value: Any, what: str) -> list[str]:
    items = _list(value, what)
    if not all(isinstance(v, str) for v in items):
        raise InvalidInput(f"the pod's {what} has a value that is not a string")
    return items


def node_allowed(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler's node filters (see the module docstring) let ``pod`` on ``node``."""
    spec = _dict(pod.get("spec"), "spec")
    meta = _node_part(node, "metadata")
    name = meta["name"] if isinstance(meta.get("name"), str) else ""
    raw_labels = meta.get("labels")
    labels = {k: v for k, v in raw_labels.items() if isinstance(v, str)} if isinstance(raw_labels, dict) else {}
    node_spec = _node_part(node, "spec")
    if node_spec.get("unschedulable") is True:
        return False
    selector = _dict(spec.get("nodeSelector"), "nodeSelector")
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    affinity = _dict(_dict(spec.get("affinity"), "affinity").get("nodeAffinity"), "nodeAffinity")
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        terms = _list(_dict(required, "required node affinity").get("nodeSelectorTerms"), "nodeSelectorTerms")
        if not any(_term_matches(_dict(t, "node selector term"), name, labels) for t in terms):
            return False
    tolerations = [_dict(t, "toleration") for t in _list(spec.get("tolerations"), "tolerations")]
    taints = node_spec.get("taints")
    for taint in taints[:MAX_RULES] if isinstance(taints, list) else []:
        if not isinstance(taint, dict) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _node_part(node: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = node.get(key)
    return value if isinstance(value, dict) else {}


def _term_matches(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    expressions = _list(term.get("matchExpressions"), "matchExpressions")
    fields = _list(term.get("matchFields"), "matchFields")
    met = []  # every requirement is read (and checked) before the answer
    for expression in expressions:
        e = _dict(expression, "node selector requirement")
        key = e.get("key")
        if not isinstance(key, str):
            raise InvalidInput("the pod's node selector requirement has no key")
        met.append(_requirement(str(e.get("operator")), labels.get(key), _strings(e.get("values"), "values")))
    for field in fields:
        f = _dict(field, "node selector requirement")
        if f.get("key") != "metadata.name" or f.get("operator") not in ("In", "NotIn"):
            raise InvalidInput("the pod's matchFields may name only metadata.name, with In or NotIn")
        met.append((name in _strings(f.get("values"), "values")) == (f.get("operator") == "In"))
    return bool(met) and all(met)  # an empty term matches no node


def _requirement(operator: str, value: str | None, values: list[str]) -> bool:
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        if len(values) != 1 or not _integer(values[0]):
            raise InvalidInput(f"the pod's {operator} requirement needs one whole number")
        if value is None or not _integer(value):
            return False
        return int(value) > int(values[0]) if operator == "Gt" else int(value) < int(values[0])
    raise InvalidInput(f"the pod's node selector operator {operator[:32]!r} is not one Kubernetes knows")


def _integer(text: str) -> bool:
    stripped = text[1:] if text[:1] == "-" else text
    return 0 < len(stripped) <= 18 and stripped.isascii() and stripped.isdigit()


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """A toleration matches a taint as kube-scheduler's ``ToleratesTaint`` does."""
    effect = toleration.get("effect")
    if effect not in (None, "") and effect != taint.get("effect"):
        return False
    key, operator = toleration.get("key"), toleration.get("operator") or "Equal"
    if key not in (None, "") and key != taint.get("key"):
        return False
    if key in (None, "") and operator != "Exists":
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def check_rules(pod: Mapping[str, Any]) -> None:
    """:class:`InvalidInput` when one of the pod's node rules (node selector, required node
    affinity, tolerations) cannot be read; every rule is read, whatever a node would answer."""
    spec = _dict(pod.get("spec"), "spec")
    _dict(spec.get("nodeSelector"), "nodeSelector")
    affinity = _dict(_dict(spec.get("affinity"), "affinity").get("nodeAffinity"), "nodeAffinity")
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        terms = _list(_dict(required, "required node affinity").get("nodeSelectorTerms"), "nodeSelectorTerms")
        for term in terms:
            _term_matches(_dict(term, "node selector term"), "", {})
    for toleration in _list(spec.get("tolerations"), "tolerations"):
        _dict(toleration, "toleration")


def inter_pod_rules(pod: Mapping[str, Any]) -> str | None:
    """What the pod requires of the other pods' placement, which a plan over free GPUs cannot
    honour (required pod affinity or anti-affinity, a ``DoNotSchedule`` topology spread), or None."""
    spec = _dict(pod.get("spec"), "spec")
    affinity = _dict(spec.get("affinity"), "affinity")
    for kind in ("podAffinity", "podAntiAffinity"):
        if _list(_dict(affinity.get(kind), kind).get("requiredDuringSchedulingIgnoredDuringExecution"), kind):
            return f"a required {kind}"
    for constraint in _list(spec.get("topologySpreadConstraints"), "topologySpreadConstraints"):
        if _dict(constraint, "topology spread constraint").get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
            return "a DoNotSchedule topology spread constraint"
    return None


__all__ = ["check_rules", "inter_pod_rules", "node_allowed"]
