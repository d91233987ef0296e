"""The chart's tenancy bounds (docs/operator-guide/tenancy.md): the Dataset CRD refuses absurd specs at
admission, by its OpenAPI bounds and by its ``x-kubernetes-validations`` rules, and the
chart passes the same limits to the agents and the controller.

Each Dataset is checked against the rendered CRD itself: the OpenAPI schema with
``jsonschema``, the CEL rules with a CEL evaluator (``celpy``) at the place in the object
where the API server evaluates them, with ``self`` bound to that value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
import pytest

from tests.charts.test_chart import agent_container, dataset_schema, render
from tools.support.fake_apiserver import make_dataset

JSON = dict[str, Any]


def cel_messages(schema: JSON, value: Any) -> list[str]:
    """The messages of every ``x-kubernetes-validations`` rule ``value`` breaks, as the API server
    evaluates them: a rule runs where its schema node has a value, with ``self`` that value."""
    env = celpy.Environment()
    out = []
    for node, here in _walk(schema, value):
        for rule in node.get("x-kubernetes-validations") or []:
            program = env.program(env.compile(rule["rule"]))
            if not bool(program.evaluate({"self": celpy.json_to_cel(here)})):
                out.append(rule["message"])
    return out


def _walk(schema: JSON, value: Any) -> Iterator[tuple[JSON, Any]]:
    yield schema, value
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                yield from _walk(sub, value[key])


def refused(schema: JSON, spec: JSON) -> tuple[bool, list[str]]:
    """Whether the OpenAPI schema refuses a Dataset with ``spec``, and the CEL rules' messages."""
    ds = make_dataset("imagenet", namespace="tenant-evil")
    ds["spec"] = {"source": "s3://bucket/imagenet", **spec}
    try:
        jsonschema.validate(ds, schema)
        openapi = False
    except jsonschema.ValidationError:
        openapi = True
    return openapi, cel_messages(schema, ds)


@pytest.fixture(scope="module")
def schema() -> JSON:
    return dataset_schema(render())


def test_the_issues_absurd_specs_are_refused_by_both_the_bounds_and_the_rules(schema: JSON) -> None:
    openapi, messages = refused(schema, {"warm": {"nodes": 1_000_000_000, "nodeSelector": {}}})
    assert openapi
    assert "spec.warm.nodes may be at most 8 (this cluster's limit of warm-up nodes per Dataset)" in messages
    assert any("empty selector matches every node" in m for m in messages)
    openapi, messages = refused(schema, {"replicas": 10000})
    assert openapi
    assert messages == ['spec.replicas may be at most 8 (this cluster\'s limit of copies per Dataset), or "auto"']


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"warm": {"nodes": 8}},
        {"warm": {"nodes": 0}},
        {"warm": {"nodeSelector": {"pool": "a100"}}},
        {"warm": {"nodes": 3, "nodeSelector": {"pool": "a100"}}},
        {"replicas": "auto"},
        {"replicas": 8},
        {"replicas": 0},
    ],
)
def test_specs_within_the_bounds_pass_both(schema: JSON, spec: JSON) -> None:
    assert refused(schema, spec) == (False, [])


@pytest.mark.parametrize(
    "spec",
    [
        {"warm": {"nodes": 9}},
        {"warm": {"nodeSelector": {}}},
        {"replicas": 9},
        {"replicas": "all"},
        {"source": "s3://" + "x" * 5000},
    ],
)
def test_specs_over_the_bounds_are_refused(schema: JSON, spec: JSON) -> None:
    openapi, messages = refused(schema, spec)
    assert openapi


def test_the_bounds_follow_the_charts_values() -> None:
    schema = dataset_schema(render({"tenancy": {"warmNodesMax": 100, "replicasMax": 50}}))
    assert refused(schema, {"warm": {"nodes": 100}, "replicas": 50}) == (False, [])
    openapi, messages = refused(schema, {"warm": {"nodes": 101}, "replicas": 51})
    assert openapi and len(messages) == 2
    assert any("at most 100" in m for m in messages) and any("at most 50" in m for m in messages)


def test_the_agents_get_the_namespace_share() -> None:
    env = {e["name"]: e.get("value") for e in agent_container(render()).get("env", [])}
    assert env["DSAGENT_NAMESPACE_SHARE"] == "0.5"
    env = {
        e["name"]: e.get("value") for e in agent_container(render({"tenancy": {"nodeShare": "0.25"}})).get("env", [])
    }
    assert env["DSAGENT_NAMESPACE_SHARE"] == "0.25"
    from dsagent.cache.settings import Settings

    assert Settings.read({"DSAGENT_NAMESPACE_SHARE": "0.25"}).namespace_share == 0.25


def test_a_share_outside_zero_to_one_is_refused_by_the_values_schema() -> None:
    import helm_python as helm

    from tests.charts.test_chart import CHART, NAMESPACE

    for bad in ("0", "1.5", "half"):
        with pytest.raises(Exception, match="nodeShare"):
            helm.Chart.load(str(CHART)).render({"tenancy": {"nodeShare": bad}}, name="r", namespace=NAMESPACE)


def test_the_controller_gets_the_limits_and_may_write_events() -> None:
    from dsagent.controller.controllersettings import ControllerSettings
    from tests.charts.test_chart import find

    docs = render({"tenancy": {"clusterBytes": "20Ti", "warmNodesMax": 4}})
    deployment = find(docs, "Deployment", "-controller")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"] != "DSAGENT_ADMIN_TOKEN_FILE"}
    settings = ControllerSettings.from_env(env)
    assert (settings.warm_nodes_max, settings.replicas_max, settings.namespace_share) == (4, 8, 0.5)
    assert (settings.namespace_bytes, settings.namespace_tasks, settings.inventory_max_age) == (20 << 40, 64, 300)
    assert "DSAGENT_CONTROLLER_NAMESPACE_BYTES" not in {
        e["name"]
        for e in find(render(), "Deployment", "-controller")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    rules = find(docs, "ClusterRole", "-controller")["rules"]
    assert {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]} in rules


STRIPE_MESSAGE = (
    'spec.stripe is "auto" or {members: N} with N from 1 to 4096 (for example {members: 4});'
    " anything else would leave striping off"
)


@pytest.mark.parametrize("stripe", ["auto", {"members": 1}, {"members": 4}, {"members": 4096}])
def test_a_stripe_spec_the_controller_acts_on_passes(schema: JSON, stripe: Any) -> None:
    from dsagent.kube.datasets import parse_stripe

    assert parse_stripe(stripe) is not None  # the controller reads it as striping
    assert refused(schema, {"stripe": stripe}) == (False, [])


@pytest.mark.parametrize(
    "stripe",
    ["Auto", "on", {"member": 3}, {"members": 0}, {"members": 5000}, {"members": "3"}, {"members": True}, {}],
)
def test_a_stripe_spec_that_would_mean_off_is_refused_at_admission(schema: JSON, stripe: Any) -> None:
    """``{member: 3}`` or ``Auto`` was accepted and silently meant "off"."""
    from dsagent.kube.datasets import parse_stripe

    assert parse_stripe(stripe) is None  # what the controller would have made of it
    assert STRIPE_MESSAGE in refused(schema, {"stripe": stripe})[1]
