"""Job-level class sets in the extender, over real HTTP (docs/design.md#class-sets).

Two node layouts: the DGX A100 fixture (four classes of two GPUs, one per NIC pair) and
the two-class test topology (two classes of four). A job's workers must all use one class
set, so that every worker's NICs sit on the same subnets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_topology.dumps import load_dump
from scheduler_plugin.app import create_app
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import args_body, node, pod, topology_json
from tests.scheduler_plugin.server import serving

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
A100 = topology_json(load_dump(FIXTURES / "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt"))
QUADS = topology_json()


def worker(name: str, job: str, gpus: int, workers: int, placement: str | None = None) -> dict[str, Any]:
    obj = pod(name, gpus=gpus, job=job)
    obj["metadata"]["annotations"]["dsagent.io/workers"] = str(workers)
    if placement is not None:
        obj["metadata"]["annotations"]["dsagent.io/subnet-placement"] = placement
    return obj


def filtered(http: httpx.Client, pod_obj: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    response = http.post("/filter", content=args_body(pod_obj, nodes, node_cache_capable=False))
    assert response.status_code == 200
    result = response.json()
    result["passed"] = [n["metadata"]["name"] for n in (result["Nodes"] or {}).get("items") or []]
    return result


def test_every_worker_is_kept_on_nodes_serving_the_jobs_class_set() -> None:
    cluster = [
        node("a100-0", topology=A100, free_gpus=range(8)),
        node("a100-1", topology=A100, free_gpus=range(8)),
        node("quad-0", topology=QUADS, free_gpus=range(8)),
        node("quad-1", topology=QUADS, free_gpus=[4, 5, 6, 7]),
    ]
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        # Three 4-GPU workers: no single class holds three (only quad-0's class 1 and
        # quad-1's class 2 have four free); classes 1+2, two GPUs each, hold all three.
        first = filtered(http, worker("llm-0", "llm", 4, 3), cluster)
        assert first["passed"] == ["a100-0", "a100-1", "quad-0"]
        assert "gpu-roce1+gpu-roce2" in first["FailedNodes"]["quad-1"]
        # Later, quad-1 frees class 1 too, and a fresh choice would take class 2 alone
        # (quad-0 and quad-1 each have four free there); the job keeps its set.
        later = [
            node("a100-0", topology=A100, free_gpus=[0, 1, 4, 5, 6, 7]),
            node("quad-0", topology=QUADS, free_gpus=[4, 5, 6, 7]),
            node("quad-1", topology=QUADS, free_gpus=[0, 1, 4, 5, 6, 7]),
        ]
        second = filtered(http, worker("llm-1", "llm", 4, 3), later)
        assert second["passed"] == ["quad-1"]
        assert set(second["FailedNodes"]) == {"a100-0", "quad-0"}
        # The score steers within the set too: only quad-1 can serve it.
        scores = http.post(
            "/prioritize/roce", content=args_body(worker("llm-1", "llm", 4, 3), later, node_cache_capable=False)
        )
        assert [h["Score"] for h in scores.json()] == [0, 0, 10]


def test_a_layout_that_can_never_serve_the_set_is_unresolvable_for_a_job_that_requires_it() -> None:
    # Two 8-GPU workers: the quads serve them as classes 1+2 (4 + 4), the A100 as 1+2+3+4.
    # Only one quad has room now, only one A100 exists: no set holds both workers.
    cluster = [
        node("a100-0", topology=A100, free_gpus=range(8)),
        node("quad-0", topology=QUADS, free_gpus=range(8)),
        node("quad-1", topology=QUADS, free_gpus=[0, 1, 2, 3]),
    ]
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        required = filtered(http, worker("big-0", "big", 8, 2, "required"), cluster)
        assert required["passed"] == ["quad-0"]  # it waits for the quads rather than mix in the A100
        assert (
            "cannot serve the job's class set gpu-roce1+gpu-roce2" in required["FailedAndUnresolvableNodes"]["a100-0"]
        )
        preferred = filtered(http, worker("wide-0", "wide", 8, 2), cluster)
        assert preferred["passed"] == ["a100-0", "quad-0"]  # placed across layouts, rather than wait
        answer = filtered(http, worker("wide-1", "wide", 8, 2), cluster)
        assert answer["passed"] == ["a100-0", "quad-0"]  # its later workers are not held to a set


def test_a_single_worker_job_and_a_pod_in_no_job_keep_the_per_pod_class_rules() -> None:
    cluster = [node("quad-0", topology=QUADS, free_gpus=[0, 1, 4]), node("a100-0", topology=A100, free_gpus=[0, 2])]
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert filtered(http, pod("solo", gpus=2, job="solo"), cluster)["passed"] == ["quad-0", "a100-0"]
        assert filtered(http, pod("lone", gpus=2), cluster)["passed"] == ["quad-0", "a100-0"]


def test_a_gang_schedulers_pod_group_names_the_job_and_sizes_it() -> None:
    from scheduler_plugin.settings import Settings as S
    from scheduling.podspec import read_pod

    s = S()
    kueue = pod("g-0", gpus=4, job="llm", job_label="kueue.x-k8s.io/pod-group-name")
    kueue["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = "3"
    request = read_pod(kueue, job_labels=s.job_labels, gpu_resource=s.gpu_resource, roce_prefix=s.roce_resource_prefix)
    assert (request.job, request.workers) == ("ml/llm", 3)
    cosched = pod("c-0", gpus=4, job="llm", job_label="scheduling.x-k8s.io/pod-group")
    cosched["metadata"]["annotations"]["dsagent.io/workers"] = "2"
    request = read_pod(
        cosched, job_labels=s.job_labels, gpu_resource=s.gpu_resource, roce_prefix=s.roce_resource_prefix
    )
    assert (request.job, request.workers) == ("ml/llm", 2)


@pytest.mark.parametrize(
    ("text", "workers"), [("4", 4), (" 8 ", 8), ("0", 1), ("-3", 1), ("²", 1), ("9" * 9, 1), ("99999", 4096)]
)
def test_the_worker_count_is_bounded(text: str, workers: int) -> None:
    from dsplatform.jobs import workers_of

    assert workers_of({"dsagent.io/workers": text}) == workers


def test_a_set_resource_names_the_pods_classes() -> None:
    from scheduler_plugin.settings import Settings as S
    from scheduling.podspec import read_pod

    s = S()
    obj = pod("w", gpus=4, gpu_resource="dsagent.io/gpu-roce1-2", job="llm")
    request = read_pod(obj, job_labels=s.job_labels, gpu_resource=s.gpu_resource, roce_prefix=s.roce_resource_prefix)
    assert (request.gpus, request.gpu_class, request.gpu_classes) == (4, None, ("gpu-roce1", "gpu-roce2"))
    # the filter holds it to nodes serving classes 1 and 2 with two free GPUs each
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        cluster = [
            node("a100-0", topology=A100, free_gpus=[0, 1, 2, 4, 5, 6, 7]),
            node("a100-1", topology=A100, free_gpus=[0, 1, 2, 3]),
        ]
        assert filtered(http, obj, cluster)["passed"] == ["a100-1"]
