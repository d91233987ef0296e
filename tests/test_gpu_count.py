"""Every component counts a pod's GPUs alike (``dsplatform.gpus.pod_gpus``).

The webhook's GPU class policy, the agent's publisher and the controller's preparation, and
the scheduler extender each read the same raw pods; before the one rule they disagreed on
init containers (the publisher ignored them), sidecars (everyone ran them as init containers)
and class-set resources (the publisher's regex missed ``gpu-roce1-2``, the policy took the
largest container rather than the sum).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dsagent.controller import podfacts
from dsagent.nodeagent import publisher
from dsagent.webhook import gpurequest
from dsplatform.gpus import GpuResources
from scheduler_plugin.settings import DEFAULT_JOB_LABELS
from scheduling.podspec import read_pod
from tools.support.fake_apiserver import make_pod

GPU = "nvidia.com/gpu"
CLASS_SET = "dsagent.io/gpu-roce1-2"


def _container(name: str, gpus: int, resource: str = GPU, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "resources": {"limits": {resource: str(gpus)}}, **extra}


def _pod(app: int, *init: dict[str, Any], resource: str = GPU) -> dict[str, Any]:
    pod = make_pod("w", gpus=0)
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(app)}, "requests": {resource: str(app)}}
    pod["spec"]["initContainers"] = list(init)
    return pod


PODS = {
    # a regular init container holding more GPUs than the app: it is the pod's request
    "gpu-init-container": (_pod(2, _container("warmup", 4)), 4),
    # a sidecar runs beside the app (2 + 1); the init container after it beside it too (4 + 1)
    "sidecar": (_pod(2, _container("proxy", 1, restartPolicy="Always"), _container("warmup", 4)), 5),
    # a class-set worker (docs/design.md#class-sets) with a sidecar of the same set
    "class-set-sidecar": (_pod(2, _container("proxy", 1, CLASS_SET, restartPolicy="Always"), resource=CLASS_SET), 3),
}


@pytest.mark.parametrize(("pod", "expected"), PODS.values(), ids=PODS.keys())
def test_the_webhook_the_agent_and_the_extender_count_a_pods_gpus_alike(pod: dict[str, Any], expected: int) -> None:
    counts = {
        "webhook class policy": gpurequest.gpu_request(copy.deepcopy(pod), gpurequest.GpuClassSettings(enabled=True)),
        "publisher": publisher.gpu_request(copy.deepcopy(pod), GpuResources()),
        "controller preparation": podfacts.pod_gpus(copy.deepcopy(pod)),
        "extender": read_pod(
            copy.deepcopy(pod), job_labels=DEFAULT_JOB_LABELS, gpu_resource=GPU, roce_prefix="dsagent.io/gpu-roce"
        ).gpus,
    }
    assert counts == dict.fromkeys(counts, expected)
