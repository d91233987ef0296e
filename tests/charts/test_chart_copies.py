"""The chart's wiring of the controller's cluster-side policies. Cluster-aware eviction
(docs/design.md#cluster-eviction): the controller may write one ConfigMap of copy counts and
is told its name; each agent may only read that one ConfigMap and is told where it is;
switching it off removes both sides."""

from __future__ import annotations

from typing import Any

import pytest

from dsagent.nodeagent.clustersettings import ClusterSettings
from dsplatform.wire import copycounts
from tests.charts.test_chart import NAMESPACE, agent_container, find, render, rules_of

pytestmark = pytest.mark.slow

Docs = list[dict[str, Any]]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def controller_env(docs: Docs) -> dict[str, str]:
    deployment = find(docs, "Deployment", "-controller")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return env_of(container)


def settings_env(docs: Docs) -> dict[str, str]:
    """The controller's variables its settings can read here: the admin token file is the pod's mounted Secret."""
    return {k: v for k, v in controller_env(docs).items() if k != "DSAGENT_ADMIN_TOKEN_FILE"}


def namespaced_rules(docs: Docs, suffix: str) -> list[dict[str, Any]]:
    return [rule for rule in find(docs, "Role", suffix)["rules"] if "configmaps" in rule["resources"]]


def test_the_agent_reads_only_the_controllers_configmap_and_the_controller_writes_it() -> None:
    docs = render()
    env = env_of(agent_container(docs))
    assert env["DSAGENT_COPIES_CONFIGMAP"] == f"{NAMESPACE}/{copycounts.CONFIGMAP}"
    cluster = ClusterSettings.from_env(env)
    assert cluster.copies_configmap == f"{NAMESPACE}/{copycounts.CONFIGMAP}" and cluster.copies_interval == 30
    assert namespaced_rules(docs, "-agent") == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [copycounts.CONFIGMAP], "verbs": ["get"]}
    ]
    assert find(docs, "RoleBinding", "-agent")["roleRef"]["name"] == find(docs, "Role", "-agent")["metadata"]["name"]
    assert controller_env(docs)["DSAGENT_CONTROLLER_COPIES_CONFIGMAP"] == copycounts.CONFIGMAP
    writes = namespaced_rules(docs, "-controller")
    assert {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]} in writes
    assert {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [copycounts.CONFIGMAP],
        "verbs": ["get", "patch"],
    } in writes


def test_switched_off_neither_side_touches_the_configmap() -> None:
    docs = render({"agent": {"clusterEviction": {"enabled": False}}})
    assert "DSAGENT_COPIES_CONFIGMAP" not in env_of(agent_container(docs))
    assert not [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-agent")]
    assert controller_env(docs)["DSAGENT_CONTROLLER_COPIES_CONFIGMAP"] == "off"


def test_next_job_preparation_is_auto_by_default_true_reads_the_queues_and_false_is_off() -> None:
    from dsagent.controller.controllersettings import ControllerSettings

    default = render()
    assert controller_env(default)["DSAGENT_CONTROLLER_PREPARE"] == "auto"
    auto = ControllerSettings.from_env(settings_env(default))
    assert auto.prepare is not None and auto.prepare_named_only  # the named follow-ups only
    off = render({"controller": {"prepare": {"enabled": False}}})
    assert controller_env(off)["DSAGENT_CONTROLLER_PREPARE"] == "off"
    assert ControllerSettings.from_env(settings_env(off)).prepare is None
    docs = render({"controller": {"prepare": {"enabled": True, "window": "1h", "fillFraction": "0.8"}}})
    on = ControllerSettings.from_env(settings_env(docs))
    presets = on.prepare
    assert not on.prepare_named_only
    assert presets is not None and (presets.window_s, presets.fetch_lead_s, presets.fill_fraction) == (3600, 600, 0.8)
    assert presets.subtasks_remaining == 2
    # the queue systems' order (Kueue Workloads, Volcano Jobs): listed only to prepare every waiting pod
    queue_rules = {("kueue.x-k8s.io", "workloads", "list"), ("batch.volcano.sh", "jobs", "list")}
    assert queue_rules <= rules_of(docs, "-controller")
    assert not queue_rules & rules_of(default, "-controller")
    assert not queue_rules & rules_of(off, "-controller")
    assert ("", "pods", "list") in rules_of(default, "-controller")  # the named follow-ups' namespaces
    crd = find(docs, "CustomResourceDefinition", "datasets.dsagent.io")
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["preparation"]["x-kubernetes-preserve-unknown-fields"] is True


def test_spec_replicas_is_auto_or_a_number_in_the_crd() -> None:
    import jsonschema
    import pytest

    from tests.charts.test_chart import dataset_schema
    from tools.support.fake_apiserver import make_dataset

    schema = dataset_schema(render())
    for good in ("auto", 0, 3):
        jsonschema.validate({**make_dataset("x"), "spec": {"source": "s3://x", "replicas": good}}, schema)
    for bad in ("AUTO", "3", -1, 10_001):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**make_dataset("x"), "spec": {"source": "s3://x", "replicas": bad}}, schema)


def test_migration_is_off_by_default_and_on_may_evict_pods() -> None:
    """The controller's migration (docs/design.md#deadline-migration) needs the
    Eviction API; the permission is there only when migration or the plan loop (which evicts
    a worker it pinned to a node that is gone) is on."""
    from dsagent.controller.controllersettings import ControllerSettings

    def evictions(docs: Docs) -> list[dict[str, Any]]:
        rules = find(docs, "ClusterRole", "-controller")["rules"]
        return [r for r in rules if any(res.startswith("pods/") for res in r["resources"])]

    off = render({"controller": {"planGates": {"enabled": False}}})
    assert "DSAGENT_CONTROLLER_MIGRATE" not in controller_env(off)
    assert ControllerSettings.from_env(settings_env(off)).migrate is False
    assert evictions(off) == []
    on = render({"controller": {"migration": {"enabled": True}}, "gpuClasses": {"resourcePrefix": "example.com"}})
    settings = ControllerSettings.from_env(settings_env(on))
    assert settings.migrate is True and settings.class_prefix == "example.com"  # as the webhook writes them
    assert evictions(on) == [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]


def test_the_stripe_drain_timeout_reaches_the_controllers_settings() -> None:
    """A leaving member serves its share for ``controller.stripeDrainTimeout`` (10m by default)."""
    from dsagent.controller.controllersettings import ControllerSettings

    assert ControllerSettings.from_env(settings_env(render())).stripe_drain_timeout_s == 600
    docs = render({"controller": {"stripeDrainTimeout": "45m"}})
    assert ControllerSettings.from_env(settings_env(docs)).stripe_drain_timeout_s == 45 * 60
