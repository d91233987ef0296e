"""Deadline plans applied at admission: real AdmissionReview JSON in, a JSONPatch out.

Three DGX-1 nodes publish their topology and free GPUs as the agent does
(``desired_annotations``): n1 has 8 free, n2 4 (GPUs 0-3), n3 3. The job: 8,000 one-GPU steps
of 1 s and gradients of 1 kB (communication is negligible), so ``t_single`` = 8,000 s; with
``dsagent.io/deadline-factor: 0.3`` equation (6) gives ``t_exp`` = 2,400 s. Plans of 1 and 2
GPUs end after 8,000 and 4,000 s (late); 4 GPUs end after 2,000 s and 8 after 1,000 s (both
meet it). The highest running efficiency (the default) takes 4 GPUs, best fit puts them on
n2 (the node with the fewest free GPUs that holds 4); slack per GPU would take 8
((2,400 - 1,000) / 8 = 175 s per GPU against (2,400 - 2,000) / 4 = 100), on n1.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.nodeagent.publisher import desired_annotations
from dsagent.webhook.deadlineplan import KubePlanNodes, PlanPolicy, apply_plan
from dsagent.webhook.mutation import Injection
from dsagent.webhook.server import create_app
from dsagent.webhook.server import decide as webhook_decide
from dsplatform import kubetime
from dsplatform.gpus import GpuResources
from gpu_topology import Topology, to_json
from gpu_topology.dumps import load_dump
from scheduling.nodeinfo import NodeFacts, NodeReader
from tests.scheduler_plugin.server import serving
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_node, make_pod

DGX1 = "dgx1-v100-4ib-nvidia-smi-topo-m.txt"
FREE = {"n1": [0, 1, 2, 3, 4, 5, 6, 7], "n2": [0, 1, 2, 3], "n3": [0, 1, 2]}
NOW = 1_800_000_000.0
JOB = {
    "dsagent.io/gradient-bytes": "1kB",
    "dsagent.io/step-seconds": "1s",
    "dsagent.io/steps": "8000",
    "dsagent.io/deadline-factor": "0.3",
}
NAMES = GpuResources()


@pytest.fixture(scope="module")
def topology(fixtures_dir: Path) -> Topology:
    found = load_dump(fixtures_dir / "topology" / DGX1)
    return dataclasses.replace(
        found,
        gpus=tuple(dataclasses.replace(g, uuid=f"GPU-{g.index:08x}-0000-4000-8000-{g.index:012x}") for g in found.gpus),
    )


@pytest.fixture(scope="module")
def raw_nodes(topology: Topology) -> list[dict[str, Any]]:
    published = to_json(topology)
    return [make_node(name, annotations=desired_annotations(None, published, free)) for name, free in FREE.items()]


@pytest.fixture(scope="module")
def nodes(raw_nodes: list[dict[str, Any]]) -> list[NodeFacts]:
    reader = NodeReader()
    return [reader.read(n) for n in raw_nodes]


@pytest.fixture
def apiserver(raw_nodes: list[dict[str, Any]]) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for node in raw_nodes:
            server.create(copy.deepcopy(node))
        yield server


def training_pod(annotations: dict[str, str] | None = None, gpus: int = 2) -> dict[str, Any]:
    return make_pod(
        "train-0",
        namespace="ml",
        gpus=gpus,
        annotations={"dsagent.io/deadline-plan": "apply", **JOB, **(annotations or {})},
    )


def review(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"],
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kubeflow:training-operator"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def gpus_of(pod: dict[str, Any]) -> tuple[str, str]:
    resources = pod["spec"]["containers"][0]["resources"]
    return resources["limits"]["nvidia.com/gpu"], resources["requests"]["nvidia.com/gpu"]


def required_nodes(pod: dict[str, Any]) -> list[list[str]]:
    """Per required term, the node names its matchFields allow."""
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [
        [
            v
            for f in t.get("matchFields", [])
            if f["key"] == "metadata.name" and f["operator"] == "In"
            for v in f["values"]
        ]
        for t in terms["nodeSelectorTerms"]
    ]


@pytest.mark.parametrize("watched", [False, True], ids=["listed", "watched"])
def test_an_opted_in_pod_gets_the_plans_gpus_and_node_through_the_webhook(
    apiserver: FakeApiServer, watched: bool
) -> None:
    """The same plan from Nodes listed at the call and from Nodes kept by list+watch (the
    webhook's default, dsagent/kube/nodewatch.py), which lists none at the call."""
    from dsagent.kube.nodewatch import NodeWatch

    pod = training_pod()
    client = apiserver.api_client()
    watch = NodeWatch(client, retry_s=0.05, watch_timeout_s=30) if watched else None
    try:
        if watch is not None:
            watch.start()
            assert watch.wait_synced(10)
        lists = len(apiserver.requests_matching("GET", "/api/v1/nodes", watch=False))
        plans = PlanPolicy(KubePlanNodes(client, NodeReader(), watch=watch), lambda: NOW, NAMES)
        app = create_app(Injection(image="img:1"), lambda ns, name: pytest.fail("no datasets"), None, plans)
        with serving(app) as url:
            answer = httpx.post(f"{url}/mutate", json=review(pod), timeout=30).json()
        assert len(apiserver.requests_matching("GET", "/api/v1/nodes", watch=False)) == lists + (0 if watched else 1)
    finally:
        if watch is not None:
            watch.stop()
        client.close()
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch" and "warnings" not in response
    mutated = json_patch(copy.deepcopy(pod), json.loads(base64.b64decode(response["patch"])))
    assert gpus_of(mutated) == ("4", "4")
    assert required_nodes(mutated) == [["n2"]]
    planned = json.loads(mutated["metadata"]["annotations"]["dsagent.io/planned"])
    assert planned == {
        "gpus": 4,
        "nodes": {"n2": 4},
        "branch": "single-expected",
        "formula": "efficiency",
        "deadline": kubetime.format_time(NOW + 0.3 * 8000),
    }
    # only the request, the affinity and the record changed
    assert mutated["spec"]["containers"][0]["command"] == pod["spec"]["containers"][0]["command"]
    assert [r.method for r in apiserver.requests if "/nodes" in r.path and not r.is_watch] == [
        "GET"
    ]  # one list, no write


def test_the_formula_setting_ranks_the_plans(nodes: list[NodeFacts]) -> None:
    slack = apply_plan(training_pod(), nodes, now=NOW, names=NAMES, formula="slack-per-gpu")
    assert slack.plan is not None and slack.plan.allocation == (("n1", 8),)
    assert gpus_of(json_patch(training_pod(), slack.patch)) == ("8", "8")
    efficient = apply_plan(training_pod(), nodes, now=NOW, names=NAMES)
    assert efficient.plan is not None and efficient.plan.allocation == (("n2", 4),)


def test_max_gpus_caps_the_plan_and_a_late_job_gets_the_earliest_end(nodes: list[NodeFacts]) -> None:
    # 1 and 2 GPUs both miss the deadline: the late plan that ends first, 2 GPUs, best fit n3
    outcome = apply_plan(training_pod({"dsagent.io/max-gpus": "2"}), nodes, now=NOW, names=NAMES)
    assert outcome.plan is not None and outcome.plan.allocation == (("n3", 2),) and not outcome.plan.meets_deadline
    assert json.loads(outcome.pod["metadata"]["annotations"]["dsagent.io/planned"])["branch"] == "single-late"


def test_existing_required_node_affinity_is_kept_and_narrowed(nodes: list[NodeFacts]) -> None:
    pod = training_pod()
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]},
                ]
            }
        }
    }
    outcome = apply_plan(pod, nodes, now=NOW, names=NAMES)
    mutated = json_patch(copy.deepcopy(pod), outcome.patch)
    assert mutated == outcome.pod
    terms = mutated["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    first, second = terms["nodeSelectorTerms"]
    assert (
        first["matchExpressions"]
        == pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchExpressions"]
    )
    assert first["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]
    assert second["matchFields"][-1] == {"key": "metadata.name", "operator": "In", "values": ["n2"]}
    assert len(second["matchFields"]) == 2


@pytest.mark.parametrize("mode", [None, "advise"])
def test_a_pod_that_does_not_opt_in_is_not_planned(nodes: list[NodeFacts], mode: str | None) -> None:
    pod = training_pod()
    del pod["metadata"]["annotations"]["dsagent.io/deadline-plan"]
    if mode is not None:
        pod["metadata"]["annotations"]["dsagent.io/deadline-plan"] = mode
    outcome = apply_plan(pod, nodes, now=NOW, names=NAMES)
    assert outcome.patch == [] and outcome.warnings == () and outcome.plan is None
    decision = webhook_decide(
        pod,
        "ml",
        Injection(image="img:1"),
        lambda ns, n: pytest.fail("no datasets"),
        plans=PlanPolicy(lambda: nodes, lambda: NOW),
    )
    assert decision.patch == [] and decision.warnings == ()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"dsagent.io/workers": "2"}, "2 workers"),
        ({"dsagent.io/deadline-plan": "yes"}, "must be 'apply' or 'advise'"),
        ({"dsagent.io/max-gpus": "lots"}, "dsagent.io/max-gpus must be a whole number"),
        ({"dsagent.io/deadline": "1h"}, "not both"),
        ({"dsagent.io/steps": "-5"}, "dsagent.io/steps"),
    ],
)
def test_an_unusable_request_is_admitted_unchanged_with_a_warning(
    nodes: list[NodeFacts], change: dict[str, str], reason: str
) -> None:
    pod = training_pod(change)
    decision = webhook_decide(
        pod,
        "ml",
        Injection(image="img:1"),
        lambda ns, n: pytest.fail("no datasets"),
        plans=PlanPolicy(lambda: nodes, lambda: NOW),
    )
    assert decision.patch == []
    (warning,) = decision.warnings
    assert (
        warning.startswith("dsplatform: deadline plan not applied, the pod keeps its request: ") and reason in warning
    )


def test_a_bound_pod_no_free_gpus_and_plans_off_are_warnings(nodes: list[NodeFacts]) -> None:
    bound = training_pod()
    bound["spec"]["nodeName"] = "n1"
    assert "already bound to n1" in apply_plan(bound, nodes, now=NOW, names=NAMES).warnings[0]
    full = [dataclasses.replace(n, published_free=frozenset()) for n in nodes]
    assert "no node publishes free GPUs" in apply_plan(training_pod(), full, now=NOW, names=NAMES).warnings[0]
    off = webhook_decide(training_pod(), "ml", Injection(image="img:1"), lambda ns, n: pytest.fail("no datasets"))
    assert off.patch == [] and "DSAGENT_WEBHOOK_DEADLINE_PLANS" in off.warnings[0]


def test_the_formula_is_a_setting_of_the_webhook_and_the_extender() -> None:
    from dsagent.errors import SettingsError
    from dsagent.webhook.server import WebhookSettings
    from scheduler_plugin.errors import SettingsError as ExtenderSettingsError
    from scheduler_plugin.settings import Settings as ExtenderSettings

    env = {"DSAGENT_WEBHOOK_INJECTION_FILE": "/nonexistent"}
    with pytest.raises(SettingsError) as refused:
        WebhookSettings.from_env({**env, "DSAGENT_WEBHOOK_PLAN_FORMULA": "fastest"})
    assert "DSAGENT_WEBHOOK_PLAN_FORMULA" in refused.value.message and "efficiency" in refused.value.message
    assert ExtenderSettings().plan_formula == "efficiency"
    assert ExtenderSettings.from_env({"DSEXT_PLAN_FORMULA": "slack-per-gpu"}).plan_formula == "slack-per-gpu"
    with pytest.raises(ExtenderSettingsError):
        ExtenderSettings.from_env({"DSEXT_PLAN_FORMULA": "fastest"})


def test_the_gpu_class_step_follows_the_plan_in_one_patch(topology: Topology) -> None:
    """With GPU classes on, the class rewrite reads the planned pod: the final request is the
    plan's 4 GPUs as a class resource, and the whole patch applies in one sequence."""
    from dsagent.webhook.gpurequest import GpuClassSettings
    from dsagent.webhook.roceclass import GpuClassPolicy, KubeGpuClasses

    published = to_json(topology, mode="numa")
    with FakeApiServer() as server:
        for name, free in FREE.items():
            server.create(make_node(name, annotations=desired_annotations(None, published, free)))
        client = server.api_client()
        try:
            settings = GpuClassSettings(enabled=True)
            gpu = GpuClassPolicy(settings, KubeGpuClasses(client, settings))
            plans = PlanPolicy(KubePlanNodes(client, NodeReader()), lambda: NOW, settings.names)
            pod = training_pod()
            decision = webhook_decide(
                pod, "ml", Injection(image="img:1"), lambda ns, n: pytest.fail("no datasets"), gpu, plans=plans
            )
        finally:
            client.close()
    assert decision.warnings == () and not decision.failed
    mutated = json_patch(copy.deepcopy(pod), decision.patch)
    limits = mutated["spec"]["containers"][0]["resources"]["limits"]
    (resource,) = limits
    assert resource.startswith("dsagent.io/gpu-roce") and limits[resource] == "4"
    assert mutated["spec"]["containers"][0]["resources"]["requests"] == {resource: "4"}
    assert required_nodes(mutated) == [["n2"]]
    assert json.loads(mutated["metadata"]["annotations"]["dsagent.io/planned"])["gpus"] == 4
    assert mutated["metadata"]["annotations"]["dsagent.io/gpu-class"] == resource.split("/", 1)[1]


@pytest.mark.parametrize(
    "hostile",
    [
        {"spec": {"containers": [{"name": "c", "resources": {"limits": ["nvidia.com/gpu"]}}]}},
        {"spec": {"containers": [{"name": "c", "resources": "lots"}]}},
        {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "abc"}}}]}},
        {"spec": {"containers": "train"}},
        {"spec": {"affinity": {"nodeAffinity": []}}},
        {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "n1"}}}},
        {
            "spec": {
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ["n1"]}}
                }
            }
        },
        {"metadata": {"annotations": {"dsagent.io/deadline-plan": ["apply"]}}},
        {"metadata": {"annotations": {"dsagent.io/max-gpus": 4}}},
        {"spec": None},
    ],
)
def test_hostile_pod_shapes_are_warnings_never_errors(nodes: list[NodeFacts], hostile: dict[str, Any]) -> None:
    pod = training_pod()
    for part, fields in hostile.items():
        if fields is None:
            pod[part] = None
            continue
        for key, value in fields.items():
            if key == "containers":
                pod[part][key] = value if isinstance(value, str) else [{**pod[part][key][0], **value[0]}]
            elif key == "annotations":
                pod[part][key].update(value)
            else:
                pod[part][key] = value
    outcome = apply_plan(pod, nodes, now=NOW, names=NAMES)
    assert outcome.patch == [] and outcome.plan is None
    (warning,) = outcome.warnings
    assert warning.startswith("dsplatform: deadline plan not applied")


def test_pods_admitted_in_a_burst_are_not_planned_onto_the_same_gpus(nodes: list[NodeFacts]) -> None:
    clock = [NOW]
    policy = PlanPolicy(lambda: nodes, lambda: clock[0], NAMES, promise_s=60.0)
    first, second, third = (policy.decide(training_pod()).plan for _ in range(3))
    # n2's 4 free GPUs go to the first pod; the second best-fits on n1 (8 free), the third on
    # n1's other 4
    assert first is not None and first.allocation == (("n2", 4),)
    assert second is not None and second.allocation == (("n1", 4),)
    assert third is not None and third.allocation == (("n1", 4),)
    # a minute later the promises are gone: the nodes' published free GPUs count again
    clock[0] += 61.0
    again = policy.decide(training_pod()).plan
    assert again is not None and again.allocation == (("n2", 4),)
    # a node that republished (a new resourceVersion) has counted what it gave
    seen = [dataclasses.replace(n, resource_version="1") for n in nodes]
    listing = [seen]
    moving = PlanPolicy(lambda: listing[0], lambda: clock[0], NAMES)
    assert moving.decide(training_pod()).plan.allocation == (("n2", 4),)  # type: ignore[union-attr]
    assert moving.decide(training_pod()).plan.allocation == (("n1", 4),)  # type: ignore[union-attr]
    # n2 is full by promise and n1 has 4 GPUs left: of two more pods, one would get n1's 4 and
    # the other only n3's. Once n2 publishes again (its free list then counts what it gave;
    # here it shows the same 4 free), both get 4 GPUs
    listing[0] = [dataclasses.replace(n, resource_version="2") if n.name == "n2" else n for n in seen]
    after = [moving.decide(training_pod()).plan for _ in range(2)]
    assert sorted(p.allocation for p in after if p is not None) == [(("n1", 4),), (("n2", 4),)]


def test_a_default_install_plans_a_one_pod_job_that_asks(
    apiserver: FakeApiServer, chart_tls: dict[str, Any], tmp_path: Path
) -> None:
    """The webhook process with the settings the chart's defaults give it: a one-pod job
    that says ``dsagent.io/deadline-plan: apply`` gets its plan's GPUs and node; one that
    does not is left as it asked."""
    from tests.charts.test_chart import render
    from tests.dsagent.webhook.test_webhook import call, webhook_process
    from tests.test_default_install_gpu_path import chart_env

    env = chart_env(render({}), "Deployment", "-webhook")
    assert env["DSAGENT_WEBHOOK_DEADLINE_PLANS"] == "true"
    own = {
        k: v
        for k, v in env.items()
        if k.startswith("DSAGENT_WEBHOOK_") and not k.endswith(("_FILE", "_LISTEN", "_KUBECONFIG"))
    }
    asking, plain = training_pod(), training_pod()
    plain["metadata"]["annotations"].pop("dsagent.io/deadline-plan")
    with webhook_process(chart_tls, apiserver, tmp_path, extra_env=own) as server:
        status, answer = call(server, "POST", "/mutate", review(asking))
        assert status == 200
        _, untouched = call(server, "POST", "/mutate", review(plain))
    response = answer["response"]
    assert response["allowed"] is True and "warnings" not in response, response
    mutated = json_patch(copy.deepcopy(asking), json.loads(base64.b64decode(response["patch"])))
    planned = json.loads(mutated["metadata"]["annotations"]["dsagent.io/planned"])
    assert planned["formula"] == env["DSAGENT_WEBHOOK_PLAN_FORMULA"] and len(planned["nodes"]) == 1
    assert gpus_of(mutated) == (str(planned["gpus"]),) * 2 and required_nodes(mutated) == [list(planned["nodes"])]
    assert (
        "patch" not in untouched["response"]
        or "dsagent.io~1planned" not in base64.b64decode(untouched["response"]["patch"]).decode()
    )
