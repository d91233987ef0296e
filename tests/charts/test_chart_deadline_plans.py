"""The chart's switch for applied deadline plans (docs/user-guide/gpu-placement.md#deadline-plans)."""

from __future__ import annotations

from typing import Any

import pytest

from dsagent.webhook.mutation import Injection
from dsagent.webhook.server import WebhookSettings
from tests.charts.test_chart import render

pytestmark = pytest.mark.slow


def webhook_parts(values: dict[str, Any] | None = None) -> tuple[dict[str, str], list[dict[str, Any]], str]:
    """The webhook's env, its ClusterRole's rules and its match condition's expression."""
    docs = render(values or {})
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("webhook"))
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("webhook"))
    admission = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    (condition,) = admission["webhooks"][0]["matchConditions"]
    return env, role["rules"], condition["expression"]


def lists_nodes(rules: list[dict[str, Any]]) -> bool:
    return any("nodes" in r.get("resources", []) and "list" in r.get("verbs", []) for r in rules)


def test_on_by_default_the_webhook_plans_the_pods_that_ask_and_reads_the_nodes() -> None:
    env, rules, expression = webhook_parts()
    own = {k: v for k, v in env.items() if k.startswith("DSAGENT_WEBHOOK_") and not k.endswith("_FILE")}
    settings = WebhookSettings.read(own, injection=Injection(image="img:1"))
    assert settings.deadline_plans and settings.plan_formula == "efficiency"
    # it lists the nodes for the plans even where the class rewrite does not
    assert lists_nodes(rules) and lists_nodes(webhook_parts({"gpuClasses": {"enabled": False}})[1])
    # the plan loop is on by default too: a pod that asks for a plan reaches the webhook
    assert env["DSAGENT_WEBHOOK_PLAN_GATES"] == "true"
    assert "'dsagent.io/deadline-plan' in object.metadata.annotations" in expression
    off, _, quiet = webhook_parts({"controller": {"planGates": {"enabled": False}}})
    assert off["DSAGENT_WEBHOOK_PLAN_GATES"] == "false"
    assert "'dsagent.io/deadline-plan' in object.metadata.annotations" in quiet  # for the applied plans


def test_off_the_webhook_neither_plans_nor_lists_nodes_for_plans() -> None:
    values = {"webhook": {"deadlinePlans": {"enabled": False}}}
    env, _, _ = webhook_parts(values)
    assert env["DSAGENT_WEBHOOK_DEADLINE_PLANS"] == "false"
    # nodes are then listed by the class rewrite (auto by default) only
    assert not lists_nodes(webhook_parts({**values, "gpuClasses": {"enabled": False}})[1])
    off = {**values, "controller": {"planGates": {"enabled": False}}}
    assert "dsagent.io/deadline-plan" not in webhook_parts(off)[2]


def test_enabled_the_webhook_plans_lists_nodes_and_sees_pods_that_opt_in() -> None:
    env, rules, expression = webhook_parts(
        {"webhook": {"deadlinePlans": {"enabled": True, "formula": "slack-per-gpu"}}}
    )
    # the webhook accepts what the chart sets (its files are mounted in the cluster, not here)
    own = {k: v for k, v in env.items() if k.startswith("DSAGENT_WEBHOOK_") and not k.endswith("_FILE")}
    settings = WebhookSettings.read(own, injection=Injection(image="img:1"))
    assert settings.deadline_plans and settings.plan_formula == "slack-per-gpu"
    assert lists_nodes(rules) and "'dsagent.io/deadline-plan' in object.metadata.annotations" in expression


def test_the_schema_refuses_an_unknown_formula() -> None:
    with pytest.raises(Exception, match="deadlinePlans"):
        render({"webhook": {"deadlinePlans": {"formula": "fastest"}}})


def controller_parts(values: dict[str, Any] | None = None) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The controller's env and its ClusterRole's rules."""
    docs = render(values or {})
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("controller"))
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("controller"))
    return env, role["rules"]


def patches_pods(rules: list[dict[str, Any]]) -> bool:
    return any(r.get("resources") == ["pods"] and "patch" in r.get("verbs", []) for r in rules)


def test_the_plan_loop_runs_by_default_with_the_rights_it_needs() -> None:
    """On by default (it acts only on pods that opt in): the controller runs the loop, may
    patch pods (pin, record, lift the gate) and write Events; the webhook gates only where the
    loop runs, and the loop ranks plans by the webhook's formula."""
    from dsagent.controller.controllersettings import ControllerSettings

    env, rules = controller_parts({"webhook": {"deadlinePlans": {"formula": "slack-per-gpu"}}})
    own = {k: v for k, v in env.items() if k.startswith("DSAGENT_CONTROLLER_") and v is not None}
    settings = ControllerSettings.read(own)
    assert settings.plan_gates and settings.plan_formula == "slack-per-gpu" and settings.plan_gates_wait_s == 600.0
    assert patches_pods(rules)
    assert any("events" in r.get("resources", []) and "create" in r.get("verbs", []) for r in rules)
    off_env, off_rules = controller_parts({"controller": {"planGates": {"enabled": False}}})
    assert (
        ControllerSettings.read({"DSAGENT_CONTROLLER_PLAN_GATES": off_env["DSAGENT_CONTROLLER_PLAN_GATES"]}).plan_gates
        is False
    )
    assert not patches_pods(off_rules)
    # the loop evicts a worker pinned to a node that is gone (migration, off by default, too)
    assert evicts_pods(rules) and not evicts_pods(off_rules)
    webhook_env, _, _ = webhook_parts({"controller": {"enabled": False}})
    assert webhook_env["DSAGENT_WEBHOOK_PLAN_GATES"] == "false"  # nothing would lift the gate


def evicts_pods(rules: list[dict[str, Any]]) -> bool:
    return any("pods/eviction" in r.get("resources", []) and "create" in r.get("verbs", []) for r in rules)


def test_the_schema_refuses_a_wait_that_is_not_a_duration() -> None:
    with pytest.raises(Exception, match="planGates"):
        render({"controller": {"planGates": {"wait": "soon"}}})
