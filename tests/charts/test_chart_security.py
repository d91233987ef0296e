"""The chart's limits on the agent's rights: node writes only to its own
Node, through a ValidatingAdmissionPolicy as the kubelet's NodeRestriction does.

No CEL library is in the lock, so the policy's expressions are checked for their shape
(what they compare, with balanced brackets and quotes), and kubernetes-validate checks the
objects for every version >= 1.30 in test_chart.py. That the agent itself only ever writes
its own Node and lists pods by its node is tested against the fake API server
(tests/dsagent/nodeagent/test_cluster_agent.py, "granted_by_the_chart").
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.charts.test_chart import NAMESPACE, find, kinds, render

pytestmark = pytest.mark.slow

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render({})


def balanced(expression: str) -> bool:
    depth = 0
    quoted = False
    for ch in expression:
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch in "([{":
            depth += 1
        elif not quoted and ch in ")]}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0 and not quoted


def test_the_node_restriction_policy_judges_only_the_agents_requests_and_binds_deny(
    default: list[dict[str, Any]],
) -> None:
    policy = find(default, "ValidatingAdmissionPolicy", "-agent-node-restriction")
    binding = find(default, "ValidatingAdmissionPolicyBinding", "-agent-node-restriction")
    account = find(default, "ServiceAccount", "-agent")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and "nodes" in rule["resources"]
    assert set(rule["operations"]) >= {"UPDATE", "CREATE", "DELETE"}
    [condition] = spec["matchConditions"]
    username = f"system:serviceaccount:{NAMESPACE}:{account['metadata']['name']}"
    assert condition["expression"] == f"request.userInfo.username == '{username}'"


def test_the_policy_compares_the_written_node_with_the_node_name_in_the_agents_token(
    default: list[dict[str, Any]],
) -> None:
    spec = find(default, "ValidatingAdmissionPolicy", "-agent-node-restriction")["spec"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    expressions = [v["expression"] for v in spec["validations"]]
    for expression in [*variables.values(), *expressions, *(c["expression"] for c in spec["matchConditions"])]:
        assert balanced(expression), expression
    # the node name comes from the token's extra, set by the API server from the pod binding
    assert f"request.userInfo.extra['{NODE_NAME_EXTRA}']" in variables["nodeNames"]
    assert "size(variables.nodeNames) > 0" in expressions  # no claim: no write (1.29, feature off)
    assert "request.name in variables.nodeNames" in expressions  # only its own Node
    assert "request.operation == 'UPDATE'" in expressions  # never create or delete a Node
    [fields] = [e for e in expressions if "object.spec == oldObject.spec" in e]
    assert "request.subResource in ['', 'status']" in fields  # no other subresource, no spec change
    # labels: only the two that say which device plugin serves the node
    [labels] = [e for e in expressions if "variables.ownLabels" in e]
    assert "variables.newLabels.all(" in labels and "variables.oldLabels.all(" in labels
    own = {v["name"]: v["expression"] for v in spec["variables"]}["ownLabels"]
    assert own == "['dsagent.io/device-plugin', 'nvidia.com/gpu.deploy.device-plugin']"
    # status: its own conditions only; the kubelet's conditions, capacity and addresses as they were
    [status] = [e for e in expressions if "request.subResource != 'status'" in e]
    assert "!(c.type in ['DsplatformRoceClasses', 'DsplatformFetchLinks'])" in status
    assert "object.status.capacity" in status
    [annotations] = [e for e in expressions if "startsWith('dsagent.io/')" in e]
    assert "variables.newAnnotations.all(" in annotations and "variables.oldAnnotations.all(" in annotations
    for validation in spec["validations"]:
        assert validation["message"] and validation["reason"] == "Forbidden"


def test_the_nodecache_policy_lets_an_agent_write_only_its_own_nodecache_and_delete_none(
    default: list[dict[str, Any]],
) -> None:
    """RBAC cannot narrow create to one name: the policy does (docs/design.md#node-state)."""
    policy = find(default, "ValidatingAdmissionPolicy", "-agent-nodecache-restriction")
    binding = find(default, "ValidatingAdmissionPolicyBinding", "-agent-nodecache-restriction")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["dsagent.io"] and rule["resources"] == ["nodecaches"]
    assert set(rule["operations"]) == {"UPDATE", "CREATE", "DELETE"}
    assert (
        spec["matchConditions"]
        == find(default, "ValidatingAdmissionPolicy", "-agent-node-restriction")["spec"]["matchConditions"]
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    expressions = [v["expression"] for v in spec["validations"]]
    for expression in [*variables.values(), *expressions]:
        assert balanced(expression), expression
    assert f"request.userInfo.extra['{NODE_NAME_EXTRA}']" in variables["nodeNames"]
    assert "size(variables.nodeNames) > 0" in expressions
    assert "request.name in variables.nodeNames" in expressions  # only its own node's
    assert "request.operation != 'DELETE'" in expressions
    for validation in spec["validations"]:
        assert validation["message"] and validation["reason"] == "Forbidden"


def test_the_policy_is_switched_off_by_value_and_with_the_agent() -> None:
    off = render({"agent": {"nodeRestriction": {"enabled": False}}})
    assert not {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} & kinds(off)
    assert "ValidatingAdmissionPolicy" not in kinds(render({"agent": {"enabled": False}}))


def test_the_agent_may_not_get_single_pods(default: list[dict[str, Any]]) -> None:
    """RBAC cannot narrow a list to one node's pods (no field selectors in RBAC): the agent
    keeps list/watch (always with spec.nodeName) and loses get, which it never used."""
    role = find(default, "ClusterRole", "-agent")
    [pods] = [r for r in role["rules"] if "pods" in r["resources"]]
    assert pods["verbs"] == ["list", "watch"]


def test_the_notes_say_whether_node_writes_are_restricted() -> None:
    import helm_python as helm

    from tests.charts.test_chart import CHART, NAMESPACE, RELEASE

    def notes(values: dict[str, Any]) -> str:
        out = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        return " ".join(text for path, text in out.items() if path.endswith("NOTES.txt")).replace("\n", " ")

    on = notes({})
    assert "may annotate only its own Node" in on and "ValidatingAdmissionPolicy" in on and "NOT enforced" not in on
    assert "its own Node" not in notes({"agent": {"nodeRestriction": {"enabled": False}}})
