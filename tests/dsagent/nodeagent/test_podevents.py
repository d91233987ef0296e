"""The agent's pod Events against the fake API server: repeats counted on one Event reach
the API server from the agent's own loop, as a controller's do at the end of its pass."""

from __future__ import annotations

import asyncio
from typing import Any

from dsagent.kube.events import EventRecorder, ObjectRef
from dsagent.nodeagent.podevents import EVENTS_CONTROLLER, PodEvents
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer


def test_the_agents_loop_writes_the_repeats_its_recorder_counted_once_they_are_due(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    clock = Clock()
    recorder = EventRecorder(api_client, controller=EVENTS_CONTROLLER, instance="node-1", clock=clock, refresh_s=1800)
    events = PodEvents(recorder, "node-1")
    pod = ObjectRef("v1", "Pod", "team-a", "trainer-0", "uid-0")
    for _ in range(5):  # the Event, its series' start (written), three repeats counted
        clock.now += 60
        assert recorder.record(pod, type="Warning", reason="DatasetFailed", action="Cache", note="disk full")
    [event] = apiserver.list("events")
    assert event["series"]["count"] == 2

    async def no_task(uid: str) -> Any:
        raise AssertionError(f"no pod is watched, yet {uid} was asked for")

    asyncio.run(events.tick(no_task))  # not due yet
    assert apiserver.list("events")[0]["series"]["count"] == 2
    clock.now += 1800
    asyncio.run(events.tick(no_task))
    assert apiserver.list("events")[0]["series"]["count"] == 5
