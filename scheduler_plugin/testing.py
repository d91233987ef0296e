"""Builders for the raw Kubernetes JSON kube-scheduler sends the extender.

Shared by this package's tests, ``tools/bench/extender.py`` and users who test their
own scheduler configuration. Nodes and pods are shaped like real ``kubectl get -o
json`` objects (conditions, addresses, images, tolerations...), so wire tests and the
benchmark parse what a real cluster sends, not a minimal stub.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpu_topology import Gpu, Link, Nic, Topology
from gpu_topology.contract import topology_to_dict

GIB = 1 << 30


def two_class_topology() -> Topology:
    """8 GPUs: 0-3 on NUMA 0 with mlx5_0, 4-7 on NUMA 1 with mlx5_1 (two RoCE classes).

    Within a quad every pair has 12 NVLinks (NV12); across quads the path is SYS. Each
    NIC sits under its quad's PCIe switches (PXB) and is SYS from the other quad.
    """
    gpus = tuple(Gpu(index=i, numa_node=0 if i < 4 else 1, cpu_affinity="0-31" if i < 4 else "32-63") for i in range(8))
    nics = tuple(  # mlx5_0 on 10.1.0.0/24 beside quad 0, mlx5_1 on 10.2.0.0/24 beside quad 1
        Nic(
            name=f"mlx5_{quad}",
            numa_node=quad,
            link_layer="Ethernet",
            state="ACTIVE",
            addresses=(f"10.{quad + 1}.0.5/24",),
            subnets=(f"10.{quad + 1}.0.0/24",),
        )
        for quad in (0, 1)
    )
    links: dict[str, dict[str, Link]] = {}
    for a in range(8):
        row = links.setdefault(f"GPU{a}", {})
        for b in range(a + 1, 8):
            row[f"GPU{b}"] = Link.parse("NV12" if (a < 4) == (b < 4) else "SYS")
        row["mlx5_0"] = Link.parse("PXB" if a < 4 else "SYS")
        row["mlx5_1"] = Link.parse("SYS" if a < 4 else "PXB")
    return Topology(gpus=gpus, nics=nics, links=links)


def topology_json(topology: Topology | None = None) -> str:
    return json.dumps(topology_to_dict(topology or two_class_topology()), separators=(",", ":"))


def holding(
    digest: str = "a" * 32,
    *,
    state: str = "ready",
    in_use: bool = False,
    size: int = GIB,
    versions: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "digest": digest,
        "sizeBytes": size,
        "files": 1000,
        "state": state,
        "inUse": in_use,
        "lastUsed": "2026-11-21T10:00:00Z",
    }
    if versions is not None:
        entry["versions"] = list(versions)
    return entry


def inventory_json(
    node: str = "gpu-node-1",
    datasets: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    capacity: int = 2000 * GIB,
    free: int = 1000 * GIB,
) -> str:
    return json.dumps(
        {"version": 1, "node": node, "capacityBytes": capacity, "freeBytes": free, "datasets": dict(datasets or {})},
        separators=(",", ":"),
    )


def node(
    name: str,
    *,
    inventory: str | None = None,
    topology: str | None = None,
    free_gpus: Iterable[int] | str | None = None,
    gpus: int | None = 8,
    resource_version: str | None = None,
    extra_allocatable: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A v1.Node as kube-scheduler marshals it."""
    annotations = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    }
    if inventory is not None:
        annotations["dsagent.io/inventory"] = inventory
    if topology is not None:
        annotations["dsagent.io/topology"] = topology
    if free_gpus is not None:
        annotations["dsagent.io/free-gpus"] = free_gpus if isinstance(free_gpus, str) else ",".join(map(str, free_gpus))
    allocatable = {"cpu": "254", "memory": "2113429052Ki", "ephemeral-storage": "3441236412Ki", "pods": "110"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = str(gpus)
    allocatable.update(extra_allocatable or {})
    if resource_version is None:  # like the API server: a new version for new content
        resource_version = str(zlib.crc32(json.dumps([name, annotations, allocatable]).encode()))
    return {
        "metadata": {
            "name": name,
            "uid": f"6c1d0f0e-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
            "resourceVersion": resource_version,
            "creationTimestamp": "2026-10-01T08:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "topology.kubernetes.io/zone": "zone-a",
            },
            "annotations": annotations,
        },
        "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"], "providerID": f"baremetal://{name}"},
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "lastHeartbeatTime": "2026-11-21T10:00:00Z",
                    "lastTransitionTime": "2026-10-01T08:00:00Z",
                    "reason": r,
                    "message": m,
                }
                for t, s, r, m in (
                    (
                        "MemoryPressure",
                        "False",
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                )
            ],
            "addresses": [{"type": "InternalIP", "address": "192.168.10.7"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "0" * 32,
                "systemUUID": "4c4c4544-0000-0000-0000-000000000000",
                "bootID": "1" * 32,
                "kernelVersion": "5.15.0-91-generic",
                "osImage": "Ubuntu 22.04.3 LTS",
                "containerRuntimeVersion": "containerd://1.7.2",
                "kubeletVersion": "v1.30.2",
                "kubeProxyVersion": "v1.30.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {
                    "names": [f"nvcr.io/nvidia/pytorch@sha256:{i:064x}", f"nvcr.io/nvidia/pytorch:24.0{i}-py3"],
                    "sizeBytes": 9_000_000_000 + i,
                }
                for i in range(6)
            ],
        },
    }


def pod(
    name: str = "train-worker-0",
    *,
    namespace: str = "ml",
    datasets: str | Sequence[Mapping[str, Any]] | None = None,
    gpus: int = 0,
    gpu_resource: str = "nvidia.com/gpu",
    job: str | None = None,
    job_label: str = "dsagent.io/job",
) -> dict[str, Any]:
    """A v1.Pod as kube-scheduler marshals it for an extender."""
    annotations: dict[str, str] = {}
    if datasets is not None:
        annotations["dsagent.io/datasets"] = datasets if isinstance(datasets, str) else json.dumps(list(datasets))
    labels = {"app": "trainer"}
    if job is not None:
        labels[job_label] = job
    resources: dict[str, Any] = {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}}
    if gpus:
        resources["requests"][gpu_resource] = str(gpus)
        resources["limits"][gpu_resource] = str(gpus)
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "resourceVersion": "5001",
            "creationTimestamp": "2026-11-21T10:00:00Z",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["torchrun", "train.py"],
                    "resources": resources,
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "initContainers": [
                {
                    "name": "dsctl-cache",
                    "image": "dsplatform/dsctl:0.1.0",
                    "command": ["dsctl", "cache"],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "priority": 0,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def args_body(pod_obj: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], *, node_cache_capable: bool) -> bytes:
    """An ExtenderArgs body exactly as kube-scheduler's HTTPExtender marshals it.

    Go leaves the unused pointer field nil (``null``); a fresh NodeList marshals its
    ListMeta as ``{}`` and a nil ``Items`` slice as ``null``.
    """
    if node_cache_capable:
        doc = {"Pod": pod_obj, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in nodes]}
    else:
        doc = {"Pod": pod_obj, "Nodes": {"metadata": {}, "items": list(nodes) or None}, "NodeNames": None}
    return json.dumps(doc, separators=(",", ":")).encode()
