"""Step 5 (migration) run by the Dataset controller, against the fake API server.

The controller's leader, with ``DSAGENT_CONTROLLER_MIGRATE=on``, reads the Nodes as the
agents publish them (topology, free GPUs, inventory annotations) and the running pods,
and evicts the pods of a job that opted in (``dsagent.io/migratable``) when it ends sooner
on free GPUs elsewhere (docs/design.md#deadline-migration). Off by default; a replica
that does not hold the Lease evicts nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsagent.nodeagent.publisher import desired_annotations
from scheduler_plugin.testing import topology_json
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer, make_node, make_pod

NS = "dsplatform"
STARTED = datetime.fromisoformat("2026-11-23T08:00:00+00:00").timestamp()
NOW = STARTED + 3600  # an hour into the jobs' 10 GPU-hours


def inventory(node: str, *, holds: bool) -> dict[str, Any]:
    datasets = {"imagenet": {"digest": "ab" * 16, "state": "ready", "sizeBytes": 10**11}} if holds else {}
    return {"version": 1, "node": node, "capacityBytes": 4 * 10**12, "freeBytes": 10**12, "datasets": datasets}


def node(name: str, free: list[int] | None, *, holds: bool = True) -> dict[str, Any]:
    """A Node as its agent publishes it: the two-class test topology (two NVLinked quads)."""
    return make_node(name, annotations=desired_annotations(inventory(name, holds=holds), topology_json(), free))


def worker(name: str, node_name: str, *, job: str, gpus: int = 2, migratable: bool = True) -> dict[str, Any]:
    annotations = {
        "dsagent.io/gradient-bytes": "10GB",
        "dsagent.io/step-seconds": "1s",
        "dsagent.io/steps": "36000",
        "dsagent.io/workers": "2",
        "dsagent.io/datasets": "imagenet",
    }
    labels = {"training.kubeflow.org/job-name": job}
    if migratable:
        labels["dsagent.io/migratable"] = "true"
    pod = make_pod(
        name, namespace="ml", node_name=node_name, annotations=annotations, labels=labels, gpus=gpus, phase="Running"
    )
    pod["status"]["startTime"] = "2026-11-23T08:00:00Z"
    return pod


def controller(api_client: Any, *, migrate: bool, identity: str = "c-1") -> DatasetController:
    settings = ControllerSettings(namespace=NS, identity=identity, pack_image="registry.example/dsp:1", migrate=migrate)
    return DatasetController(api_client, settings, clock=Clock(NOW))


def pass_if_leading(ctl: DatasetController) -> bool:
    """One turn of :meth:`DatasetController.run_forever`: a pass only while it leads."""
    leading = ctl.elector.try_acquire()
    if leading:
        ctl.reconcile_all()
    return leading


def cluster_with_a_job_that_should_move(apiserver: FakeApiServer) -> None:
    """A 4-GPU job split 2 + 2 over two nodes; a third node has a free NVLinked quad and the data."""
    apiserver.create(node("n1", []))
    apiserver.create(node("n2", []))
    apiserver.create(node("n3", [0, 1, 2, 3]))
    apiserver.create(worker("mover-0", "n1", job="mover"))
    apiserver.create(worker("mover-1", "n2", job="mover"))
    apiserver.create(worker("stay-0", "n1", job="stay", migratable=False))
    apiserver.create(worker("stay-1", "n2", job="stay", migratable=False))


def test_the_setting_is_read_from_the_environment_and_known() -> None:
    assert "DSAGENT_CONTROLLER_MIGRATE" in ControllerSettings.env_names()
    assert ControllerSettings.from_env({}).migrate is False
    assert ControllerSettings.from_env({"DSAGENT_CONTROLLER_MIGRATE": "on"}).migrate is True
    assert ControllerSettings.from_env({"DSAGENT_CONTROLLER_MIGRATE": "off"}).migrate is False


def test_the_leader_evicts_the_pods_of_a_job_that_moves_and_nothing_else(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    cluster_with_a_job_that_should_move(apiserver)
    # off by default: a pass moves nothing
    assert pass_if_leading(controller(api_client, migrate=False))
    assert apiserver.evictions == []
    leader = controller(api_client, migrate=True)
    other = controller(api_client, migrate=True, identity="c-2")
    assert pass_if_leading(leader)
    assert not pass_if_leading(other)  # the Lease is c-1's: c-2 makes no pass
    assert sorted(apiserver.evictions) == ["ml/mover-0", "ml/mover-1"]
    left = sorted(p["metadata"]["name"] for p in apiserver.list("pods"))
    assert left == ["stay-0", "stay-1"]
    # the next pass finds nothing to move (the job's pods are gone until re-created)
    assert pass_if_leading(leader)
    assert sorted(apiserver.evictions) == ["ml/mover-0", "ml/mover-1"]


def test_free_gpus_count_the_pods_on_a_node_that_publishes_none(apiserver: FakeApiServer, api_client: Any) -> None:
    """A node without the free-GPUs annotation has its allocatable GPUs minus the active
    pods' requests free, as the extender counts them: 6 of 8 used leaves no quad to move to."""
    apiserver.create(node("n1", []))
    apiserver.create(node("n2", []))
    apiserver.create(node("n3", None))
    apiserver.create(worker("mover-0", "n1", job="mover"))
    apiserver.create(worker("mover-1", "n2", job="mover"))
    apiserver.create(worker("big", "n3", job="big", gpus=6, migratable=False))
    leader = controller(api_client, migrate=True)
    assert pass_if_leading(leader)
    assert apiserver.evictions == []
    apiserver.delete("pods", "big", "ml")  # the big job ends: n3's GPUs are free
    assert pass_if_leading(leader)
    assert sorted(apiserver.evictions) == ["ml/mover-0", "ml/mover-1"]


def test_a_refused_eviction_leaves_the_job_where_it_is(apiserver: FakeApiServer, api_client: Any) -> None:
    cluster_with_a_job_that_should_move(apiserver)
    apiserver.blocked_evictions.add("ml/mover-0")  # a PodDisruptionBudget
    leader = controller(api_client, migrate=True)
    assert pass_if_leading(leader)
    assert apiserver.evictions == []
    assert sorted(p["metadata"]["name"] for p in apiserver.list("pods")) == ["mover-0", "mover-1", "stay-0", "stay-1"]


def test_pods_asking_for_class_resources_of_another_prefix_are_counted(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """With the chart's gpuClasses.resourcePrefix the webhook writes ``example.com/gpu-roce1-2``;
    the controller is told the same prefix, so such a job is seen and moved (it was invisible:
    no GPUs under the default names)."""
    apiserver.create(node("n1", []))
    apiserver.create(node("n2", []))
    apiserver.create(node("n3", [0, 1, 2, 3]))
    for name, where in (("mover-0", "n1"), ("mover-1", "n2")):
        pod = worker(name, where, job="mover")
        for entries in pod["spec"]["containers"][0]["resources"].values():
            entries["example.com/gpu-roce1-2"] = entries.pop("nvidia.com/gpu")
        apiserver.create(pod)
    env = {"DSAGENT_CONTROLLER_MIGRATE": "on", "DSAGENT_CONTROLLER_CLASS_PREFIX": "example.com"}
    settings = ControllerSettings.from_env({**env, "DSAGENT_CONTROLLER_NAMESPACE": NS})
    assert pass_if_leading(DatasetController(api_client, settings, clock=Clock(NOW)))
    assert sorted(apiserver.evictions) == ["ml/mover-0", "ml/mover-1"]
