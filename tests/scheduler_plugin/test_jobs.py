"""The per-job RoCE class memory and its expiry (clock injected)."""

from __future__ import annotations

from scheduler_plugin.jobs import JobClasses
from tests.clock import Clock


def test_a_job_keeps_the_class_of_its_first_worker() -> None:
    jobs = JobClasses(ttl_s=60, clock=Clock(1000.0))
    assert jobs.remember("ml/bert", "gpu-roce2") == "gpu-roce2"
    assert jobs.remember("ml/bert", "gpu-roce1") == "gpu-roce2"
    assert jobs.get("ml/bert") == "gpu-roce2"


def test_a_job_is_forgotten_after_its_ttl_without_use() -> None:
    clock = Clock(1000.0)
    jobs = JobClasses(ttl_s=60, clock=clock)
    jobs.remember("ml/bert", "gpu-roce2")
    clock.now += 61
    assert jobs.get("ml/bert") is None
    assert jobs.remember("ml/bert", "gpu-roce1") == "gpu-roce1"


def test_each_use_extends_the_expiry() -> None:
    clock = Clock(1000.0)
    jobs = JobClasses(ttl_s=60, clock=clock)
    jobs.remember("ml/bert", "gpu-roce2")
    for _ in range(5):
        clock.now += 50
        assert jobs.get("ml/bert") == "gpu-roce2"


def test_jobs_are_independent() -> None:
    jobs = JobClasses(ttl_s=60, clock=Clock(1000.0))
    jobs.remember("ml/a", "gpu-roce1")
    jobs.remember("ml/b", "gpu-roce2")
    assert (jobs.get("ml/a"), jobs.get("ml/b"), jobs.get("other/a")) == ("gpu-roce1", "gpu-roce2", None)


def test_a_class_the_pod_requests_replaces_the_cached_one() -> None:
    jobs = JobClasses(ttl_s=60, clock=Clock(1000.0))
    jobs.remember("ml/bert", "gpu-roce2")
    jobs.set("ml/bert", "gpu-roce1")
    assert jobs.get("ml/bert") == "gpu-roce1" and len(jobs) == 1


def test_memory_is_bounded_and_expired_jobs_are_not_counted() -> None:
    clock = Clock(1000.0)
    jobs = JobClasses(ttl_s=60, clock=clock, maxsize=3)
    for i in range(5):
        jobs.remember(f"ml/{i}", "gpu-roce1")
    assert len(jobs) == 3 and jobs.get("ml/0") is None and jobs.get("ml/4") == "gpu-roce1"
    clock.now += 61
    assert len(jobs) == 0
