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

The extender asks the same question of many nodes at once (which nodes a waiting job's pods
may use, docs/design.md#whole-nodes): :func:`placement_key` is what these filters read of a
node, less its own name (the ``kubernetes.io/hostname`` label), so that the nodes of a pool
share one key and a pod's rules (:func:`pod_rules`) are asked once per key
(:func:`allowed_on`), not once per node. Rules that name nodes one by one (``matchFields``,
or the hostname label) have no answer per key: :func:`pod_rules` gives None for them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from dsplatform.errors import InvalidInput

MAX_RULES = 256  # terms, requirements, values, tolerations, taints: more is not a pod we plan
#: the label the kubelet sets to the node's own name: no part of a node's placement key
HOSTNAME_LABEL = "kubernetes.io/hostname"


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


class PlacementKey(NamedTuple):
    """What :func:`node_allowed` reads of a node but its name: nodes with equal keys are
    allowed to the same pods (whose rules do not name nodes one by one)."""

    labels: tuple[tuple[str, str], ...]  # in order, but the hostname label
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect), NoSchedule and NoExecute only
    cordoned: bool


class PodRules(NamedTuple):
    """A pod's node rules (node selector, required node affinity, tolerations) as
    :func:`node_allowed` reads them; ``key``: the same, as one canonical string."""

    key: str
    pod: Mapping[str, Any]


def placement_key(node: Mapping[str, Any], pairs: dict[tuple[str, str], tuple[str, str]] | None = None) -> PlacementKey:
    """``node``'s (raw v1.Node, hostile) :class:`PlacementKey`. ``pairs``: where a caller
    keeping many keys holds each label pair once (the nodes of a pool share them all)."""
    meta, spec = _node_part(node, "metadata"), _node_part(node, "spec")
    raw = meta.get("labels")
    found = sorted(
        (k, v) for k, v in (raw.items() if isinstance(raw, dict) else ()) if isinstance(v, str) and k != HOSTNAME_LABEL
    )
    labels = tuple(found if pairs is None else (pairs.setdefault(pair, pair) for pair in found))
    raw_taints = spec.get("taints")
    taints = sorted(
        (str(t.get("key") or ""), str(t.get("value") or ""), str(t["effect"]))
        for t in (raw_taints[:MAX_RULES] if isinstance(raw_taints, list) else [])
        if isinstance(t, dict) and t.get("effect") in ("NoSchedule", "NoExecute")
    )
    return PlacementKey(labels, tuple(taints), spec.get("unschedulable") is True)


def pod_rules(pod: Mapping[str, Any]) -> PodRules | None:
    """``pod``'s node rules, or None where they name nodes one by one (``matchFields``, or
    the hostname label): no answer per :class:`PlacementKey` then. :class:`InvalidInput`
    as :func:`check_rules` raises it."""
    check_rules(pod)
    spec = _dict(pod.get("spec"), "spec")
    selector = _dict(spec.get("nodeSelector"), "nodeSelector")
    affinity = _dict(_dict(spec.get("affinity"), "affinity").get("nodeAffinity"), "nodeAffinity")
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = _list(_dict(required, "required node affinity").get("nodeSelectorTerms"), "nodeSelectorTerms")
    keys = set(selector)
    for term in terms:
        if _list(term.get("matchFields"), "matchFields"):
            return None
        keys.update(e.get("key") for e in _list(term.get("matchExpressions"), "matchExpressions"))
    if HOSTNAME_LABEL in keys:
        return None
    rules: dict[str, Any] = {}
    if selector:
        rules["nodeSelector"] = selector
    if required is not None:
        rules["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    if spec.get("tolerations"):
        rules["tolerations"] = spec["tolerations"]
    return PodRules(json.dumps(rules, sort_keys=True, separators=(",", ":")), {"spec": rules})


def allowed_on(rules: PodRules, key: PlacementKey) -> bool:
    """:func:`node_allowed` for a pod of ``rules`` on any node of placement ``key``."""
    taints = [{"key": k, "value": v, "effect": e} for k, v, e in key.taints]
    node = {"metadata": {"labels": dict(key.labels)}, "spec": {"taints": taints, "unschedulable": key.cordoned}}
    return node_allowed(rules.pod, node)


__all__ = [
    "HOSTNAME_LABEL", "PlacementKey", "PodRules", "allowed_on", "check_rules", "inter_pod_rules", "node_allowed",
    "placement_key", "pod_rules",
]  # fmt: skip
