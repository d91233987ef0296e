"""The agent's metrics, parsed back with ``prometheus_client.parser`` (in process, memory:// sources).

after 5 good and 6 failed cache requests only
``dsplatform_agent_fetches_total{result="ok"} 5`` was visible. Now every failure is counted by its
error code, failed tasks are not active, and two services keep separate counts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import fsspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsagent import __version__
from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.errors import DsagentError
from tools.support.harness import allocated


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def write(root: str, files: int) -> None:
    fs = fsspec.filesystem("memory")
    for i in range(files):
        fs.pipe(f"{root.split('://', 1)[1]}/f{i}.bin", bytes([i]) * 1000)


def test_after_six_failed_requests_the_failures_are_visible_by_code(tmp_path: Path, memory_root: str) -> None:
    for i in range(5):
        write(f"{memory_root}/good{i}", 3)

    async def run() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        service = CacheService(Settings(root=tmp_path / "a", sweep_interval=3600))
        await service.start()
        try:
            for i in range(5):
                record = await service.submit_task(
                    f"good-{i}", [DatasetRequest(f"good{i}", f"{memory_root}/good{i}")], wait=30
                )
                assert record.state == "ready", record
            again = await service.submit_task("again", [DatasetRequest("good0", f"{memory_root}/good0")], wait=30)
            assert again.state == "ready"
            for i in range(4):  # a source that does not exist: the request settles failed
                record = await service.submit_task(
                    f"bad-{i}", [DatasetRequest(f"missing{i}", f"{memory_root}/nothing-{i}")], wait=30
                )
                assert record.state == "failed", record
            for i in range(2):  # refused before any work
                with pytest.raises(DsagentError):
                    await service.submit_task(f"refused-{i}", [DatasetRequest("Bad Name!", f"{memory_root}/good0")])
            return samples(await service.metrics_text())
        finally:
            await service.stop()

    got = asyncio.run(run())
    failures = {
        labels: v
        for (name, labels), v in got.items()
        if name == "dsplatform_agent_dataset_requests_total" and labels != (("code", "ok"),)
    }
    assert sum(failures.values()) == 6, failures
    assert got[("dsplatform_agent_dataset_requests_total", (("code", "ok"),))] == 6
    assert got[("dsplatform_agent_dataset_requests_total", (("code", "invalid_input"),))] == 2
    assert got[("dsplatform_agent_tasks", (("state", "failed"),))] == 4  # failed tasks are not active
    assert got[("dsplatform_agent_tasks", (("state", "active"),))] == 6
    assert got[("dsplatform_agent_fetches_total", (("result", "ok"),))] == 5
    assert got[("dsplatform_agent_cache_hits_total", ())] == 1
    assert got[("dsplatform_agent_cache_misses_total", ())] == 5
    assert got[("dsplatform_agent_fetch_duration_seconds_count", ())] == 5
    assert got[("dsplatform_agent_fetch_size_bytes_sum", ())] == 5 * 3000
    assert got[("dsplatform_agent_fetch_size_bytes_bucket", (("le", "+Inf"),))] == 5
    assert got[("dsplatform_agent_build_info", (("version", __version__),))] == 1
    assert got[("dsplatform_agent_datasets", (("state", "ready"),))] == 5


def test_each_service_has_its_own_registry_and_evictions_count_by_reason(tmp_path: Path, memory_root: str) -> None:
    write(f"{memory_root}/x", 2)

    async def run() -> tuple[str, str]:
        one = CacheService(Settings(root=tmp_path / "one", sweep_interval=3600))
        two = CacheService(Settings(root=tmp_path / "two", sweep_interval=3600))
        await one.start()
        await two.start()
        try:
            await one.submit_task("t", [DatasetRequest("x", f"{memory_root}/x")], wait=30)
            await one.release_task("t")
            await one.evict(names=["x"])
            return await one.metrics_text(), await two.metrics_text()
        finally:
            await one.stop()
            await two.stop()

    first, second = (samples(t) for t in asyncio.run(run()))
    assert first[("dsplatform_agent_fetches_total", (("result", "ok"),))] == 1
    assert second[("dsplatform_agent_fetches_total", (("result", "ok"),))] == 0
    assert {labels: v for (name, labels), v in first.items() if name == "dsplatform_agent_evictions_total" and v} == {
        (("reason", "operator"),): 1
    }
    assert first[("dsplatform_agent_evicted_bytes_total", (("reason", "operator"),))] == allocated(2000, 2, tmp_path)


def test_a_failed_dataset_is_one_warning_with_code_task_dataset_and_redacted_source(
    tmp_path: Path, memory_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Five failed tasks left no warning line in the agent's log."""

    async def run() -> str:
        service = CacheService(Settings(root=tmp_path / "a", sweep_interval=3600))
        await service.start()
        try:
            record = await service.submit_task(
                "t-missing", [DatasetRequest("gone", f"{memory_root}/nothing-here")], wait=30
            )
            assert record.state == "failed", record
            return await service.metrics_text()
        finally:
            await service.stop()

    with caplog.at_level("WARNING", logger="dsagent"):
        text = asyncio.run(run())
    lines = [r for r in caplog.records if r.levelname == "WARNING" and "dataset failed" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    message = lines[0].getMessage()
    assert "code=not_found" in message and "task=t-missing" in message and "dataset=gone" in message
    assert f"source={memory_root}/nothing-here" in message
    assert samples(text)[("dsplatform_agent_dataset_requests_total", (("code", "not_found"),))] == 1


def test_no_created_twins_and_peer_bytes_visible_before_any_transfer() -> None:
    from dsagent.cache.metrics import Metrics
    from dsagent.controller.controllermetrics import ControllerMetrics
    from scheduler_plugin.metrics import ExtenderMetrics

    agent = Metrics().render()
    extender = ExtenderMetrics().render().decode()
    from prometheus_client import generate_latest

    controller = generate_latest(ControllerMetrics().registry).decode()
    for text in (agent, extender, controller):
        assert "_created" not in text
    got = samples(agent)
    assert got[("dsplatform_agent_peer_bytes_total", (("direction", "served"),))] == 0
    assert got[("dsplatform_agent_peer_bytes_total", (("direction", "fetched"),))] == 0
    assert ("dsplatform_extender_requests_total", (("outcome", "error"), ("verb", "filter"))) in samples(extender)
    assert ("dsplatform_controller_passes_total", (("result", "error"),)) in samples(controller)


@pytest.mark.parametrize("loaded", [True, False])
def test_the_agent_says_whether_its_native_loops_are_loaded(loaded: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsagent.cache.metrics import Metrics
    from dsagent.format import native

    monkeypatch.setattr(native, "AVAILABLE", loaded)
    got = samples(Metrics().render())
    assert got[("dsplatform_agent_native_loops", ())] == (1 if loaded else 0)
