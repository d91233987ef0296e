"""A multi-worker job's class set, kept in its Lease, through the admission webhook (fake API server).

Nodes of two layouts: the DGX A100 fixture (four classes of two GPUs) and the two-class
test topology (two classes of four). docs/design.md#class-sets.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsagent.errors import SettingsError
from dsagent.webhook.gpurequest import NETWORKS_ANNOTATION, GpuClassSettings, lease_name, networks_value
from dsagent.webhook.roceclass import GpuClassPolicy, KubeGpuClasses
from gpu_topology.dumps import load_dump
from scheduler_plugin.testing import topology_json
from tests.dsagent.webhook.test_roceclass import OWNER, gpu_node, resources, worker
from tools.support.fake_apiserver import FakeApiServer, json_patch

SETTINGS = GpuClassSettings(enabled=True)
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topology"
A100 = topology_json(load_dump(FIXTURES / "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt"))


def member(index: int, workers: int, *, gpus: int = 4, placement: str | None = None, job: str = "bert") -> Any:
    pod = worker(index, gpus=gpus, job=job, owner={**OWNER, "name": job, "uid": f"uid-{job}"})
    pod["metadata"].setdefault("annotations", {})["dsagent.io/workers"] = str(workers)
    if placement is not None:
        pod["metadata"]["annotations"]["dsagent.io/subnet-placement"] = placement
    return pod


@pytest.fixture
def policy(apiserver: FakeApiServer) -> Iterator[GpuClassPolicy]:
    client = apiserver.api_client()
    try:
        yield GpuClassPolicy(SETTINGS, KubeGpuClasses(client, SETTINGS))
    finally:
        client.close()


def admitted(policy: GpuClassPolicy, pod: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    decision = policy.decide(pod, "ml", annotations_exist=pod["metadata"].get("annotations") is not None)
    return json_patch(copy.deepcopy(pod), decision.patch), decision.warnings


def test_the_job_gets_one_class_set_in_its_lease_and_every_worker_its_resource(
    apiserver: FakeApiServer, policy: GpuClassPolicy
) -> None:
    # three 4-GPU workers: class 1 alone is free on one quad node, class 2 alone on two;
    # classes 1+2 (two GPUs each) on both A100 nodes and quad-0: that set holds all three
    apiserver.create(gpu_node("a100-0", list(range(8)), topology=A100))
    apiserver.create(gpu_node("a100-1", list(range(8)), topology=A100))
    apiserver.create(gpu_node("quad-0", list(range(8))))
    apiserver.create(gpu_node("quad-1", [4, 5, 6, 7]))
    first, warnings = admitted(policy, member(0, 3))
    assert warnings == ()
    assert resources(first)["limits"] == resources(first)["requests"] == {"dsagent.io/gpu-roce1-2": "4"}
    assert first["metadata"]["annotations"]["dsagent.io/gpu-class"] == "gpu-roce1+gpu-roce2"
    lease = apiserver.get("leases", lease_name("ml/bert"), "ml")
    assert lease is not None and lease["spec"]["holderIdentity"] == "gpu-roce1+gpu-roce2"
    # the cluster changes so that class 2 alone would hold the job now: the job keeps its set
    for name in ("a100-0", "a100-1", "quad-0"):
        apiserver.patch("nodes", name, {"metadata": {"annotations": {"dsagent.io/free-gpus": "4,5,6,7"}}})
    second, _ = admitted(policy, member(1, 3))
    assert resources(second)["limits"] == {"dsagent.io/gpu-roce1-2": "4"}
    assert len(apiserver.list("leases")) == 1


def test_a_job_no_set_can_hold_is_split_with_a_reason_unless_it_requires_one(
    apiserver: FakeApiServer, policy: GpuClassPolicy
) -> None:
    # two 8-GPU workers: the quads serve them as classes 1+2, the A100 as 1+2+3+4; one of each has room
    apiserver.create(gpu_node("a100-0", list(range(8)), topology=A100))
    apiserver.create(gpu_node("quad-0", list(range(8))))
    apiserver.create(gpu_node("quad-1", [0, 1, 2, 3]))
    split, warnings = admitted(policy, member(0, 2, gpus=8, job="wide"))
    assert len(warnings) == 1 and "placed across class layouts" in warnings[0]
    assert (
        "no class set can hold 2 workers of 8 GPUs now"
        in split["metadata"]["annotations"]["dsagent.io/class-set-split"]
    )
    assert resources(split)["limits"] == {"nvidia.com/gpu": "8"}  # a whole-node worker, as before
    lease = apiserver.get("leases", lease_name("ml/wide"), "ml")
    assert lease is not None and lease["spec"]["holderIdentity"] == "*"
    later, warnings = admitted(policy, member(1, 2, gpus=8, job="wide"))
    assert warnings and "dsagent.io/class-set-split" in later["metadata"]["annotations"]

    waits, warnings = admitted(policy, member(0, 2, gpus=8, job="strict", placement="required"))
    assert warnings == () and resources(waits)["limits"] == {"dsagent.io/gpu-roce1-2": "8"}  # the quads' set
    lease = apiserver.get("leases", lease_name("ml/strict"), "ml")
    assert lease is not None and lease["spec"]["holderIdentity"] == "gpu-roce1+gpu-roce2"


def test_with_networks_every_class_of_the_set_gets_its_multus_attachment(apiserver: FakeApiServer) -> None:
    settings = GpuClassSettings.from_env(
        {"DSAGENT_WEBHOOK_GPU_CLASSES": "true", "DSAGENT_WEBHOOK_NETWORKS": "dsplatform/dsp-{class}"}
    )
    apiserver.create(gpu_node("a100-0", list(range(8)), topology=A100))
    apiserver.create(gpu_node("a100-1", list(range(8)), topology=A100))
    client = apiserver.api_client()
    try:
        policy = GpuClassPolicy(settings, KubeGpuClasses(client, settings))
        pod = member(0, 2)
        pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] = "ml/storage-net"
        patched, _ = admitted(policy, pod)
        assert resources(patched)["limits"] == {"dsagent.io/gpu-roce1-2": "4"}
        assert patched["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == (
            "ml/storage-net,dsplatform/dsp-gpu-roce1,dsplatform/dsp-gpu-roce2"
        )
        bare = member(0, 1, gpus=2, job="solo")
        del bare["metadata"]["annotations"]
        patched, _ = admitted(policy, bare)
        assert patched["metadata"]["annotations"] == {
            "dsagent.io/gpu-class": "gpu-roce1",
            "k8s.v1.cni.cncf.io/networks": "dsplatform/dsp-gpu-roce1",
        }
    finally:
        client.close()


def test_the_multus_value_keeps_the_pods_own_entries_in_either_form() -> None:
    wanted = ["dsplatform/dsp-gpu-roce1"]
    assert networks_value(None, wanted) == "dsplatform/dsp-gpu-roce1"
    assert networks_value({NETWORKS_ANNOTATION: "dsplatform/dsp-gpu-roce1"}, wanted) == "dsplatform/dsp-gpu-roce1"
    as_json = '[{"name": "storage-net", "interface": "net9"}]'
    assert json.loads(networks_value({NETWORKS_ANNOTATION: as_json}, wanted)) == [
        {"name": "storage-net", "interface": "net9"},
        {"name": "dsp-gpu-roce1", "namespace": "dsplatform"},
    ]


@pytest.mark.parametrize("template", ["dsp-gpu", "Bad/{class}", "a/b/{class}", "{class}/x/y"])
def test_a_bad_network_template_is_refused(template: str) -> None:
    with pytest.raises(SettingsError, match="DSAGENT_WEBHOOK_NETWORKS"):
        GpuClassSettings.from_env({"DSAGENT_WEBHOOK_GPU_CLASSES": "true", "DSAGENT_WEBHOOK_NETWORKS": template})
