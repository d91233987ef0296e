"""Settling the heap: collect once and freeze after bulk loads, only when enabled."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx
import pytest

from scheduler_plugin.app import create_app
from scheduler_plugin.heap import Heap
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import args_body, node, pod, topology_json
from tests.scheduler_plugin.server import serving


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Every test leaves the test runner's collector as it found it."""
    yield
    gc.unfreeze()


def test_a_disabled_heap_never_freezes() -> None:
    heap = Heap(False, bulk_reads=1)
    heap.settle()
    heap.after_reads(1_000_000)
    assert heap.settled == 0
    assert gc.get_freeze_count() == 0


def test_settling_freezes_every_surviving_object() -> None:
    heap = Heap(True)
    survivor = [object() for _ in range(10)]
    heap.settle()
    assert heap.settled == 1
    assert gc.get_freeze_count() > len(survivor)


@pytest.mark.parametrize(
    ("reads", "settled"),
    [
        ([], 0),
        ([2], 0),
        ([3], 1),
        ([3, 4, 5], 1),  # counted from the last settle
        ([3, 6], 2),
        ([10], 1),
    ],
)
def test_a_bulk_of_reads_since_the_last_settle_settles_once(reads: list[int], settled: int) -> None:
    heap = Heap(True, bulk_reads=3)
    for count in reads:
        heap.after_reads(count)
    assert heap.settled == settled


def test_the_served_app_settles_after_a_request_that_read_many_new_nodes() -> None:
    app = create_app(Settings(), settle_heap=True)
    app.heap.bulk_reads = 5
    topology = topology_json()
    nodes = [node(f"n{i}", topology=topology, free_gpus=[0, 1], resource_version=str(i + 1)) for i in range(6)]
    body = args_body(pod("p", gpus=1), nodes, node_cache_capable=False)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        first = http.post("/prioritize", content=body)
        again = http.post("/prioritize", content=body)  # the same nodes: no new reads
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert app.heap.settled == 1


def test_apps_made_for_tests_do_not_settle() -> None:
    assert create_app(Settings()).heap.enabled is False
