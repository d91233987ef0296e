"""A node's placement key and a pod's node rules (scheduling/nodefit.py): asked once per key,
the rules answer as kube-scheduler's node filters answer for every node of that key."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dsplatform.errors import InvalidInput
from scheduling.nodefit import HOSTNAME_LABEL, allowed_on, node_allowed, placement_key, pod_rules


def node(
    name: str, labels: dict[str, str], taints: tuple[dict[str, str], ...] = (), cordoned: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": list(taints)}
    if cordoned:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": {HOSTNAME_LABEL: name, **labels}}, "spec": spec}


NODES = [
    node("a1", {"pool": "h100", "zone": "z1"}),
    node("a2", {"pool": "h100", "zone": "z1"}),
    node("b1", {"pool": "a100", "zone": "z2"}),
    node("r1", {"pool": "h100", "zone": "z1"}, ({"key": "reserved", "value": "infra", "effect": "NoSchedule"},)),
    node("p1", {"pool": "h100", "zone": "z1"}, ({"key": "soft", "effect": "PreferNoSchedule"},)),
    node("c1", {"pool": "h100", "zone": "z1"}, cordoned=True),
    node("g1", {"pool": "h100", "zone": "z1", "gen": "5"}),
]

PODS = [
    {"spec": {}},
    {"spec": {"nodeSelector": {"pool": "h100"}}},
    {"spec": {"nodeSelector": {"pool": "h100"}, "tolerations": [{"key": "reserved", "operator": "Exists"}]}},
    {"spec": {"tolerations": [{"operator": "Exists"}]}},
    {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z2"]}]},
                            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]},
                        ]
                    }
                }
            }
        }
    },
]


def test_nodes_that_differ_only_in_their_names_share_a_key() -> None:
    a1, a2, b1, r1, p1, c1, _ = (placement_key(n) for n in NODES)
    assert a1 == a2 and len({a1, b1, r1, c1}) == 4
    assert p1 == a1  # a PreferNoSchedule taint filters no pod out: not part of the key
    assert (HOSTNAME_LABEL, "a1") not in a1.labels


@pytest.mark.parametrize(("pod", "n"), list(itertools.product(PODS, NODES)))
def test_the_answer_per_key_is_the_answer_per_node(pod: dict[str, Any], n: dict[str, Any]) -> None:
    rules = pod_rules(pod)
    assert rules is not None
    assert allowed_on(rules, placement_key(n)) == node_allowed(pod, n)


def test_equal_rules_have_equal_keys_whatever_their_order() -> None:
    one = pod_rules({"spec": {"nodeSelector": {"pool": "h100", "zone": "z1"}}})
    two = pod_rules({"spec": {"nodeSelector": {"zone": "z1", "pool": "h100"}}})
    assert one is not None and two is not None and one.key == two.key
    assert one.key != pod_rules({"spec": {}}).key  # type: ignore[union-attr]


def test_rules_that_name_nodes_one_by_one_have_no_answer_per_key() -> None:
    assert pod_rules({"spec": {"nodeSelector": {HOSTNAME_LABEL: "a1"}}}) is None
    by_field = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a1"]}]}
    by_label = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["b1"]}]}
    for term in (by_field, by_label):
        required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        assert pod_rules({"spec": {"affinity": {"nodeAffinity": required}}}) is None


def test_unreadable_rules_are_refused() -> None:
    with pytest.raises(InvalidInput):
        pod_rules({"spec": {"nodeSelector": ["pool"]}})
    hostile = {"metadata": {"labels": ["x"]}, "spec": {"taints": "all", "unschedulable": "yes"}}
    assert placement_key(hostile) == placement_key({})  # a hostile node reads as one without labels or taints
