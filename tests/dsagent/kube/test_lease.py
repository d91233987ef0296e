"""The one Lease reader and writer (fake API server), and the controller's election on it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dsagent.controller.leader import LeaseElector
from dsagent.errors import Conflict, InvalidInput
from dsagent.kube.apiclient import KubeUnavailable
from dsagent.kube.lease import Leases, expiry, new_lease, next_transitions
from dsplatform.kubetime import format_micro_time, parse
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer, make_lease

NS = "dsplatform"
T0 = 1_800_000_000.0


def lease_body(name: str = "l", holder: str = "a", **spec: Any) -> dict[str, Any]:
    return new_lease(
        {"name": name, "namespace": NS},
        {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": format_micro_time(T0), **spec},
    )


def test_read_create_replace_round_trip_through_the_api_server(apiserver: FakeApiServer, api_client: Any) -> None:
    leases = Leases(api_client, request_timeout=5.0)
    assert leases.read(NS, "l") is None  # 404 reads as no Lease
    created = leases.create(NS, lease_body())
    assert created["spec"]["holderIdentity"] == "a" and created["kind"] == "Lease"
    assert parse(created["spec"]["renewTime"]) == T0
    read = leases.read(NS, "l")
    assert read == created
    read["spec"]["holderIdentity"] = "b"
    replaced = leases.replace(NS, read)
    assert replaced["spec"]["holderIdentity"] == "b"
    stored = apiserver.get("leases", "l", NS)
    assert stored is not None and stored["spec"]["holderIdentity"] == "b"


def test_a_lost_race_is_a_conflict_on_create_and_on_replace(apiserver: FakeApiServer, api_client: Any) -> None:
    leases = Leases(api_client)
    first = leases.create(NS, lease_body())
    with pytest.raises(Conflict):
        leases.create(NS, lease_body(holder="b"))  # someone else created it first
    leases.replace(NS, {**first, "spec": {**first["spec"], "holderIdentity": "b"}})
    with pytest.raises(Conflict):  # written with the resourceVersion read before b's write
        leases.replace(NS, {**first, "spec": {**first["spec"], "holderIdentity": "c"}})
    stored = apiserver.get("leases", "l", NS)
    assert stored is not None and stored["spec"]["holderIdentity"] == "b"


def test_other_failures_are_not_conflicts(apiserver: FakeApiServer, api_client: Any) -> None:
    leases = Leases(api_client)
    with pytest.raises(InvalidInput):  # the server refuses a time that is not RFC 3339
        leases.create(NS, lease_body(renewTime="2026-11-22 12:00:00"))
    apiserver.stop()
    with pytest.raises(KubeUnavailable):
        leases.read(NS, "l")


def test_expiry_is_the_renewal_plus_the_duration() -> None:
    renewed = format_micro_time(T0)
    assert expiry({"renewTime": renewed, "leaseDurationSeconds": 15}) == T0 + 15
    assert expiry({"acquireTime": renewed, "leaseDurationSeconds": 15}) == T0 + 15  # never renewed
    assert expiry({"renewTime": renewed}, 30) == T0 + 30  # the caller's duration when the Lease has none
    assert expiry({"renewTime": renewed}) is None
    assert expiry({"renewTime": renewed, "leaseDurationSeconds": True}) is None
    assert expiry({"leaseDurationSeconds": 15}) is None
    assert expiry({"renewTime": "yesterday", "leaseDurationSeconds": 15}) is None


def test_transitions_count_takeovers() -> None:
    assert next_transitions(None) == 1
    assert next_transitions({}) == 1
    assert next_transitions({"leaseTransitions": 4}) == 5


# -- the controller's election ----------------------------------------------------------------


def test_a_replica_that_loses_the_create_race_does_not_lead(apiserver: FakeApiServer, api_client: Any) -> None:
    clock = Clock(T0)
    a = LeaseElector(api_client, namespace=NS, name="ctl", identity="a", clock=clock)
    real_read = a.leases.read

    def read_then_lose(namespace: str, name: str) -> dict[str, Any] | None:
        found = real_read(namespace, name)
        apiserver.create(
            make_lease(name, namespace=namespace, holder="b", duration_s=15, renew_time="2027-01-15T08:00:00Z")
        )
        return found

    a.leases.read = read_then_lose  # type: ignore[method-assign]
    assert a.try_acquire() is False
    stored = apiserver.get("leases", "ctl", NS)
    assert stored is not None and stored["spec"]["holderIdentity"] == "b"


def test_a_lease_held_by_a_silent_holder_is_taken_after_its_acquire_time_lapses(
    apiserver: FakeApiServer, api_client: Any
) -> None:
    clock = Clock(T0)
    lease = make_lease("ctl", namespace=NS, holder="a", duration_s=15)
    lease["spec"]["acquireTime"] = format_micro_time(T0)  # acquired, never renewed
    apiserver.create(lease)
    b = LeaseElector(api_client, namespace=NS, name="ctl", identity="b", clock=clock)
    assert b.try_acquire() is False
    clock.now += 16
    assert b.try_acquire() is True
    stored = apiserver.get("leases", "ctl", NS)
    assert stored is not None and stored["spec"]["holderIdentity"] == "b" and stored["spec"]["leaseTransitions"] == 1


def test_a_failure_other_than_a_lost_race_is_logged_and_does_not_lead(
    apiserver: FakeApiServer, api_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    elector = LeaseElector(api_client, namespace=NS, name="ctl", identity="a", clock=Clock(T0))
    apiserver.stop()
    with caplog.at_level(logging.WARNING, logger="dsagent.controller"):
        assert elector.try_acquire() is False
    assert [r.levelno for r in caplog.records if "Lease dsplatform/ctl" in r.getMessage()] == [logging.WARNING]
