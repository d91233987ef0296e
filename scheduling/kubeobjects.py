"""The Kubernetes objects the scheduling model reads, as plain JSON types: the fields of a Pod
and a Node that the extender and the Dataset controller look at, nothing more.

Who uses it: :mod:`scheduling.podspec` and :mod:`scheduling.nodeinfo` (reading), the
extender's wire format (:mod:`scheduler_plugin.wire`, which decodes them from kube-scheduler's
bodies) and the controller's migration (:mod:`dsagent.controller.migration`). Every field is
optional (``total=False``): the objects are hostile input and readers check each value.
"""

from __future__ import annotations

from typing import TypedDict


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]


class ResourceRequirements(TypedDict, total=False):
    requests: dict[str, str]
    limits: dict[str, str]


class Container(TypedDict, total=False):
    name: str
    resources: ResourceRequirements


class PodSpec(TypedDict, total=False):
    nodeName: str
    containers: list[Container]
    initContainers: list[Container]


class PodStatus(TypedDict, total=False):
    phase: str


class Pod(TypedDict, total=False):
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus


class NodeStatus(TypedDict, total=False):
    capacity: dict[str, str]
    allocatable: dict[str, str]


class Node(TypedDict, total=False):
    metadata: ObjectMeta
    status: NodeStatus


__all__ = ["Container", "Node", "NodeStatus", "ObjectMeta", "Pod", "PodSpec", "PodStatus", "ResourceRequirements"]
