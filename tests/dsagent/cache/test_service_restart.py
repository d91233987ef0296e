"""After a restart: what resumes by itself and what waits for its requester."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dsagent.cache.service import DatasetRequest
from dsagent.cache.settings import Settings
from tests.dsagent.cache.test_service_races import Gate, running, write_memory_dataset


def test_after_a_restart_a_fetch_needing_storage_options_waits_for_the_request_again(
    tmp_path: Path, memory_root: str
) -> None:
    # the documented gap: credentials are never stored, so only the requester can resume it
    write_memory_dataset(memory_root, 3, b"s")
    settings = Settings(root=tmp_path, sweep_interval=3600, storage_option_keys={"memory": ("skip_instance_cache",)})
    request = DatasetRequest("mem", memory_root, storage_options={"skip_instance_cache": True})

    async def run() -> None:
        async with running(settings) as service:
            copying = Gate(service, "begin_version")
            await service.submit_task("pod", [request])
            await copying.reached.wait()  # the agent stops with the copy done but not yet committed
        async with running(settings) as service:
            waiting = await service.get_task("pod")
            status = waiting.datasets[0]
            assert (status.state, "repeat the request" in (status.error or {}).get("hint", "")) == ("failed", True), (
                status
            )
            assert await service.datasets() == []  # nothing partial is listed, let alone ready
            again = await service.submit_task("pod", [request], wait=30)
            assert again.state == "ready" and Path(again.datasets[0].path or "").is_dir()

    asyncio.run(run())
