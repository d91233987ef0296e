"""The filter rules out nodes only on hard facts, each with a reason."""

from __future__ import annotations

from scheduler_plugin.filter import check
from scheduler_plugin.testing import GIB, holding, inventory_json, node, topology_json
from scheduling.nodeinfo import NodeReader
from scheduling.podspec import DatasetWant, PodRequest

READER = NodeReader()


def test_too_few_free_gpus_fails_resolvably() -> None:
    facts = READER.read(node("n1", topology=topology_json(), free_gpus=[0, 1]))
    failure = check(PodRequest("ml/p", gpus=4), facts, {})
    assert failure is not None and not failure.unresolvable
    assert failure.reason == "2 free GPUs, pod needs 4"


def test_too_few_free_gpus_of_the_requested_class_fails() -> None:
    facts = READER.read(node("n1", topology=topology_json(), free_gpus=[0, 1, 2, 4]))
    assert check(PodRequest("ml/p", gpus=3, gpu_class="gpu-roce1"), facts, {}) is None
    failure = check(PodRequest("ml/p", gpus=2, gpu_class="gpu-roce2"), facts, {})
    assert failure is not None and "1 free GPUs in class gpu-roce2" in failure.reason


def test_a_class_the_node_lacks_is_unresolvable() -> None:
    facts = READER.read(node("n1", topology=topology_json(), free_gpus=[0]))
    failure = check(PodRequest("ml/p", gpus=1, gpu_class="gpu-roce9"), facts, {})
    assert failure is not None and failure.unresolvable and "no GPU-RoCE class gpu-roce9" in failure.reason


def test_a_dataset_larger_than_the_whole_cache_is_unresolvable() -> None:
    facts = READER.read(node("n1", inventory=inventory_json(capacity=10 * GIB)))
    failure = check(PodRequest("ml/p", datasets=(DatasetWant("huge"),)), facts, {"huge": 11 * GIB})
    assert failure is not None and failure.unresolvable
    assert failure.reason == "dataset huge (11.0 GiB) is larger than the node's whole cache (10.0 GiB)"


def test_affinity_and_unknowns_never_filter() -> None:
    pod = PodRequest("ml/p", datasets=(DatasetWant("imagenet"),), gpus=2)
    bare = READER.read(node("bare", gpus=None))  # no GPU facts at all
    no_data = READER.read(node("n2", inventory=inventory_json(), gpus=8))  # holds nothing
    holds = READER.read(
        node("n3", inventory=inventory_json(capacity=GIB, datasets={"imagenet": holding(size=5 * GIB)}))
    )
    assert check(pod, None, {}) is None
    assert check(pod, bare, {}) is None
    assert check(pod, no_data, {"imagenet": GIB}) is None
    assert check(pod, holds, {"imagenet": 5 * GIB}) is None  # already held, however small the cache
