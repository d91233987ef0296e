"""The stripe hold body (dsplatform.wire.stripehold): what the controller and dsctl write is
what the agent's route reads, and what the controller reads of an answer is bounded."""

from __future__ import annotations

from typing import Any

import pytest

from dsagent.api.schemas import StripeIn, StripeOut
from dsplatform.wire import stripehold
from dsplatform.wire.stripehold import ShareReport, read_share, stripe_request


def test_only_what_differs_from_the_defaults_is_written() -> None:
    assert stripe_request("s3://b/store", ("n1", "n2"), {"n1": "http://n1:7420"}) == {
        "store": "s3://b/store",
        "members": ["n1", "n2"],
        "peers": {"n1": "http://n1:7420"},
    }


def test_the_route_reads_every_field_both_writers_write() -> None:
    body = stripe_request(
        "s3://b/store", ["n1", "n2"], {"n1": "http://n1:7420", "n2": "http://n2:7420"},
        digest="ab" * 16, no_share=["n2"], storage_options={"anon": True}, ready_after=0, whole=True,
        store_on_demand=True, lease_seconds=60.0,
    )  # fmt: skip
    read = StripeIn.model_validate(body)
    assert (read.digest, read.no_share, read.storage_options) == ("ab" * 16, ["n2"], {"anon": True})
    assert (read.ready_after, read.whole, read.store_on_demand, read.lease_seconds) == (0, True, True, 60.0)
    aliases = {field.alias or name for name, field in StripeIn.model_fields.items()}
    assert aliases == set(body)  # no field of the route that the writers cannot name, and none unread


def test_the_answer_is_read_by_the_names_the_agent_writes() -> None:
    out = StripeOut.model_validate(
        {
            "name": "d", "digest": "ab" * 16, "members": ["n1"], "bundlesOwned": 2, "bundlesHeld": 1,
            "bytesOwned": 200, "bytesHeld": 100, "complete": False, "readyEnough": True,
            "holding": stripehold.HOLDING_WHOLE, "storeOnDemand": True, "error": None, "shareDir": "/cache/d",
        }
    )  # fmt: skip
    assert read_share(out.model_dump(by_alias=True)) == ShareReport(
        complete=False, on_demand=True, whole=True, bytes_held=100, bytes_owned=200
    )


@pytest.mark.parametrize(
    "answer",
    [
        {"complete": "yes", "storeOnDemand": 1, "holding": "WHOLE", "bytesHeld": -5, "bytesOwned": True},
        {"complete": None, "bytesHeld": 1.5, "bytesOwned": "200"},
        {},
    ],
)
def test_another_partys_answer_sets_nothing_it_does_not_say_exactly(answer: dict[str, Any]) -> None:
    assert read_share(answer) == ShareReport(complete=False, on_demand=False, whole=False, bytes_held=0, bytes_owned=0)


@pytest.mark.parametrize("answer", [None, [], "ok", 200])
def test_an_answer_that_is_not_an_object_is_no_report(answer: object) -> None:
    assert read_share(answer) is None
