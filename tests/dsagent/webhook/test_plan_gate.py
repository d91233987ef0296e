"""The scheduling gate at admission for the workers of multi-worker jobs that ask for an
applied deadline plan (docs/design.md#deadline-plans): real AdmissionReview JSON in, a
JSONPatch out; the plan itself is the controller's (tests/dsagent/controller/test_plan_gates.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dsagent.webhook.deadlineplan import PlanPolicy
from dsagent.webhook.mutation import Injection
from dsagent.webhook.plangate import GatePolicy, multi_worker
from dsagent.webhook.server import WebhookSettings
from dsagent.webhook.server import decide as webhook_decide
from tools.support.fake_apiserver import json_patch, make_pod

GATE = {"name": "dsagent.io/deadline-plan"}
JOB = {
    "dsagent.io/deadline-plan": "apply",
    "dsagent.io/workers": "2",
    "dsagent.io/gradient-bytes": "1kB",
    "dsagent.io/step-seconds": "1s",
    "dsagent.io/steps": "8000",
    "dsagent.io/deadline-factor": "normal",
}


def worker(annotations: dict[str, str] | None = None, **labels: str) -> dict[str, Any]:
    pod = make_pod(
        "resnet-worker-0",
        namespace="ml",
        gpus=4,
        labels=labels or {"training.kubeflow.org/job-name": "resnet"},
        annotations={**JOB, **(annotations or {})},
    )
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "resnet-worker-"  # as a job controller creates its pods
    return pod


def admit(pod: dict[str, Any], gates: GatePolicy | None = GatePolicy(clock=lambda: 1e9)) -> tuple[Any, ...]:
    decision = webhook_decide(pod, "ml", Injection(image="img:1"), lambda ns, n: pytest.fail(), gates=gates)
    return json_patch(copy.deepcopy(pod), decision.patch), decision.warnings


def test_a_worker_of_a_multi_worker_job_gets_the_gate_and_nothing_else() -> None:
    pod = worker()
    admitted, warnings = admit(pod)
    assert warnings == ()
    assert admitted["spec"].pop("schedulingGates") == [GATE]
    assert admitted == pod


def test_gates_a_pod_already_has_are_kept() -> None:
    pod = worker()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    admitted, _ = admit(pod)
    assert admitted["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, GATE]


def test_a_job_named_only_by_its_controlling_owner_is_gated() -> None:
    pod = worker(**{"app": "resnet"})
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "resnet", "uid": "0b9c", "controller": True}
    ]
    admitted, warnings = admit(pod)
    assert warnings == () and admitted["spec"]["schedulingGates"] == [GATE]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("no-job", "names no job"),
        ("no-gpus", "asks for no GPUs"),
        ("anti-affinity", "podAntiAffinity"),
        ("bound", "already bound"),
    ],
)
def test_a_worker_the_loop_could_not_read_is_admitted_as_it_asked(change: str, reason: str) -> None:
    pod = worker(**({"app": "resnet"} if change == "no-job" else {}))
    if change == "no-gpus":
        pod["spec"]["containers"][0]["resources"] = {}
    if change == "anti-affinity":
        term = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
        pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    if change == "bound":
        pod["spec"]["nodeName"] = "gpu-1"
    admitted, warnings = admit(pod)
    assert admitted == pod
    (warning,) = warnings
    assert warning.startswith("dsplatform: deadline plan not applied") and reason in warning


def test_without_the_loop_a_multi_worker_job_keeps_its_request_with_a_warning() -> None:
    admitted, warnings = admit(worker(), gates=None)
    assert "schedulingGates" not in admitted["spec"]
    (warning,) = warnings
    assert "several workers" in warning and "DSAGENT_WEBHOOK_PLAN_GATES" in warning
    plans = PlanPolicy(lambda: [], lambda: 1e9)  # applied plans on, the loop off
    decision = webhook_decide(worker(), "ml", Injection(image="img:1"), lambda ns, n: pytest.fail(), plans=plans)
    assert decision.patch == []
    (warning,) = decision.warnings
    assert "2 workers" in warning and "DSAGENT_WEBHOOK_PLAN_GATES" in warning


@pytest.mark.parametrize(
    "annotations",
    [
        {"dsagent.io/workers": "1"},
        {"dsagent.io/deadline-plan": "advise"},
        {"dsagent.io/deadline-plan": "soon"},
        {"dsagent.io/steps": "-5"},
    ],
)
def test_only_a_multi_worker_job_asking_for_a_plan_is_gated(annotations: dict[str, str]) -> None:
    pod = worker(annotations)
    assert not multi_worker(pod)
    admitted, _ = admit(pod)
    assert "schedulingGates" not in admitted["spec"]


def test_the_gate_is_a_setting_off_unless_the_loop_runs() -> None:
    env = {"DSAGENT_WEBHOOK_INJECTION_FILE": "/nonexistent"}
    assert WebhookSettings.read(env, injection=Injection(image="img:1")).plan_gates is False
    on = WebhookSettings.read({**env, "DSAGENT_WEBHOOK_PLAN_GATES": "true"}, injection=Injection(image="img:1"))
    assert on.plan_gates is True
