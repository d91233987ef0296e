"""The Events recorder against the fake API server (``events.k8s.io/v1``, the real wire format)."""

from __future__ import annotations

from typing import Any

from dsagent.kube.events import EventRecorder, ObjectRef
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer, make_dataset


def _recorder(apiserver: FakeApiServer, api_client: Any, **kwargs: Any) -> tuple[dict[str, Any], Clock, EventRecorder]:
    """A Dataset, a clock, and a recorder of the controller's name on that clock."""
    ds = apiserver.create(make_dataset("imagenet", namespace="team-a"))
    clock = Clock()
    controller = "dsagent.io/dataset-controller"
    return ds, clock, EventRecorder(api_client, controller=controller, instance="c-1", clock=clock, **kwargs)


def test_a_repeated_event_is_one_event_with_a_count_and_a_new_note_is_another(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    ds, clock, events = _recorder(apiserver, api_client)
    ref = ObjectRef.of(ds)
    note = "spec.warm.nodes asks for 40 nodes; at most 8 are warmed"
    assert events.record(ref, type="Warning", reason="WarmNodesOverLimit", action="Warm", note=note)
    clock.now += 30
    assert events.record(ref, type="Warning", reason="WarmNodesOverLimit", action="Warm", note=note)
    [event] = apiserver.list("events")
    assert event["metadata"]["namespace"] == "team-a" and event["metadata"]["name"].startswith("imagenet.")
    assert event["regarding"] == {
        "apiVersion": "dsagent.io/v1alpha1",
        "kind": "Dataset",
        "namespace": "team-a",
        "name": "imagenet",
        **({"uid": ds["metadata"]["uid"]} if ds["metadata"].get("uid") else {}),
    }
    assert (event["type"], event["reason"], event["action"], event["note"]) == (
        "Warning",
        "WarmNodesOverLimit",
        "Warm",
        note,
    )
    assert event["reportingController"] == "dsagent.io/dataset-controller" and event["reportingInstance"] == "c-1"
    assert event["series"]["count"] == 2
    assert events.record(ref, type="Warning", reason="WarmNodesOverLimit", action="Warm", note="another " + "x" * 2000)
    assert len(apiserver.list("events")) == 2
    assert max(len(e["note"]) for e in apiserver.list("events")) == 1024
    clock.now += 3600  # past the series window: a new Event
    assert events.record(ref, type="Warning", reason="WarmNodesOverLimit", action="Warm", note=note)
    assert len(apiserver.list("events")) == 3


def test_an_event_the_api_server_refuses_is_false_never_an_error(apiserver: FakeApiServer, api_client: Any) -> None:
    ds = apiserver.create(make_dataset("imagenet", namespace="team-a"))
    events = EventRecorder(api_client, controller="dsagent.io/dataset-controller", instance="c-1")
    apiserver.fail(lambda r: "/events" in r.path, code=403)
    try:
        assert not events.record(ObjectRef.of(ds), type="Warning", reason="Refused", action="Warm", note="n")
    finally:
        apiserver.heal()
    assert apiserver.list("events") == []
    assert events.record(ObjectRef.of(ds), type="Warning", reason="Refused", action="Warm", note="n")


def test_a_series_is_written_when_it_starts_then_at_most_once_a_refresh(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """As client-go's recorder: a refusal repeated at every resync is not one write a pass
    to the API server; the repeats are counted and written with the series' next write."""
    ds, clock, events = _recorder(apiserver, api_client, refresh_s=1800)
    ref = ObjectRef.of(ds)

    def record() -> None:
        clock.now += 60  # a resync
        assert events.record(ref, type="Warning", reason="QuotaExceeded", action="Warm", note="over the quota")

    writes = len(apiserver.requests)
    record()  # the Event
    record()  # its series starts: written at once
    [event] = apiserver.list("events")
    assert event["series"]["count"] == 2
    for _ in range(9):
        record()  # counted, not written
        events.flush()  # nothing due yet
    clock.now += 1200
    record()  # past the refresh since the series was written: written at once
    assert apiserver.list("events")[0]["series"]["count"] == 12
    for _ in range(10):
        record()
        events.flush()
    assert apiserver.list("events")[0]["series"]["count"] == 12
    assert len(apiserver.requests) - writes == 3  # the create, the series' start, the refresh
    clock.now += 1200
    events.flush()  # due: the 22 occurrences written, stamped with the last one's time
    [event] = apiserver.list("events")
    assert event["series"]["count"] == 22
    events.flush()  # nothing new: nothing written
    assert len(apiserver.requests) - writes == 4


def test_between_begin_and_settle_events_are_written_on_several_threads(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """A controller's pass records thousands of Events on its first pass: each a round trip
    to the API server, written on threads while the pass goes on, all of them by settle()."""
    import threading
    import time

    from dsagent.kube.events import LANES

    datasets = [apiserver.create(make_dataset(f"ds-{i:02d}", namespace="team-a")) for i in range(2 * LANES)]
    events = EventRecorder(api_client, controller="c", instance="c-1", clock=Clock())

    def creating(r: Any) -> bool:
        return bool(r.method == "POST" and r.path.endswith("/events"))

    apiserver.hang(creating)
    events.begin()
    try:
        started = time.monotonic()
        for ds in datasets:  # answered at once: the writes wait on their threads
            assert events.record(ObjectRef.of(ds), type="Normal", reason="Caching", action="Cache", note="n")
        assert time.monotonic() - started < 15  # at once, while the writes hang until healed
        deadline = time.monotonic() + 30
        while len([r for r in apiserver.requests if creating(r)]) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len([r for r in apiserver.requests if creating(r)]) >= 2  # more than one at once
    finally:
        apiserver.heal()
    settling = threading.Thread(target=events.settle)
    settling.start()
    settling.join(30)
    assert not settling.is_alive()
    assert len(apiserver.list("events")) == 2 * LANES


def test_an_events_creation_and_its_series_keep_their_order_on_threads(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    ds, clock, events = _recorder(apiserver, api_client)
    apiserver.write_latency = 0.05  # a series written before its Event exists would start another
    try:
        events.begin()
        for _ in range(3):
            clock.now += 60
            assert events.record(ObjectRef.of(ds), type="Warning", reason="QuotaExceeded", action="Warm", note="n")
        events.settle()
    finally:
        apiserver.write_latency = 0.0
    [event] = apiserver.list("events")
    assert event["series"]["count"] == 2  # the third repeat counted, written with the next write


def test_a_series_write_the_api_server_refused_is_made_at_the_next_repeat(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    ds, clock, events = _recorder(apiserver, api_client)
    ref = ObjectRef.of(ds)
    assert events.record(ref, type="Warning", reason="QuotaExceeded", action="Warm", note="n")
    apiserver.fail(lambda r: r.method == "PATCH", code=500)
    try:
        clock.now += 60
        assert not events.record(ref, type="Warning", reason="QuotaExceeded", action="Warm", note="n")
    finally:
        apiserver.heal()
    clock.now += 60  # within the refresh: written all the same, the last write having failed
    assert events.record(ref, type="Warning", reason="QuotaExceeded", action="Warm", note="n")
    assert apiserver.list("events")[0]["series"]["count"] == 3


def test_a_series_let_go_of_with_repeats_not_yet_written_is_written_at_the_next_flush(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    """A recorder remembers a bounded number of series; one that leaves its memory between
    two writes keeps the repeats it counted: the next flush writes them."""
    ds, clock, events = _recorder(apiserver, api_client, refresh_s=1800, remembered=2)
    ref = ObjectRef.of(ds)
    for _ in range(5):  # the Event, its series' start (written), three repeats counted
        clock.now += 60
        assert events.record(ref, type="Warning", reason="QuotaExceeded", action="Warm", note="over the quota")
    for note in ("a", "b"):  # two other Events: the first one's series leaves the memory
        assert events.record(ref, type="Warning", reason="Other", action="Warm", note=note)
    quota = next(e for e in apiserver.list("events") if e["reason"] == "QuotaExceeded")
    assert quota["series"]["count"] == 2
    events.flush()
    quota = next(e for e in apiserver.list("events") if e["reason"] == "QuotaExceeded")
    assert quota["series"]["count"] == 5
    writes = len(apiserver.requests)
    events.flush()  # written once: nothing more
    assert len(apiserver.requests) == writes
