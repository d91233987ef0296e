"""The inventory contract: schema validation and the 64 KiB annotation budget."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsagent.cache.inventory import compact, holds, validate
from dsagent.errors import InvalidInput
from dsplatform.names import is_name


def inventory(datasets: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "node": "gpu-node-7", "capacityBytes": 10, "freeBytes": 5, "datasets": datasets}


def entry(state: str = "ready", last_used: str | None = "2026-11-21T10:00:00Z") -> dict[str, Any]:
    return {"digest": "a" * 32, "sizeBytes": 1, "files": 1, "state": state, "inUse": False, "lastUsed": last_used}


@pytest.mark.parametrize(
    "broken",
    [
        {"version": 2},
        {"node": ""},
        {"datasets": {"x": {**entry(), "digest": "XYZ"}}},
        {"datasets": {"x": {**entry(), "state": "partial"}}},
        {"datasets": {"x": {**entry(), "extra": 1}}},
        {"datasets": {"../x": entry()}},
        {"freeBytes": -1},
    ],
    ids=["version", "empty-node", "digest", "state", "extra-field", "bad-name", "negative"],
)
def test_inventories_that_break_the_contract_are_refused(broken: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        validate({**inventory({"x": entry()}), **broken})


def test_a_valid_inventory_with_older_versions_passes() -> None:
    validate(
        inventory(
            {"x": {**entry(), "versions": [{"digest": "b" * 32, "state": "ready", "inUse": True, "sizeBytes": 3}]}}
        )
    )


def test_over_budget_the_least_recently_used_non_ready_entries_go_first() -> None:
    datasets = {f"d{i:04d}": entry("ready", f"2026-11-21T10:{i % 60:02d}:00Z") for i in range(400)}
    datasets["stuck"] = entry("failed", "2026-11-21T11:00:00Z")
    text = compact(inventory(datasets), budget=20_000)
    assert len(text.encode()) <= 20_000
    kept = json.loads(text)
    validate(kept)
    assert kept["truncated"] is True
    assert "stuck" not in kept["datasets"]
    assert "d0059" in kept["datasets"]  # a recently used ready one stays
    assert compact(inventory({"x": entry()})) == json.dumps(
        inventory({"x": entry()}), separators=(",", ":"), sort_keys=True
    )


def test_holds_reads_current_and_older_versions() -> None:
    inventory = {
        "datasets": {
            "d": {
                "digest": "a" * 32,
                "state": "fetching",
                "versions": [{"digest": "b" * 32, "state": "ready"}, {"digest": "a" * 32, "state": "fetching"}],
            }
        }
    }
    assert holds(inventory, "d", "b" * 32) == "ready"
    assert holds(inventory, "d", "a" * 32) == "fetching"
    assert holds({"datasets": {"d": {"digest": "c" * 32, "state": "ready"}}}, "d", "a" * 32) is None
    assert holds({"datasets": {"d": {"digest": "c" * 32, "state": "ready"}}}, "d", "c" * 32) == "ready"


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        ({"digest": "a" * 32, "heldBytes": 5}, "share"),
        ({"digest": "a" * 32, "heldBytes": 0}, None),  # nothing held yet: nothing to serve
        ({"digest": "b" * 32, "heldBytes": 5}, None),  # another version's share
        ({"digest": "a" * 32, "heldBytes": True}, None),  # a field of the wrong type is absent
        ({"digest": "a" * 32}, None),
        ("a" * 32, None),
    ],
)
def test_holds_reads_a_share_of_the_striped_version_after_any_copy(share: object, expected: str | None) -> None:
    assert holds({"datasets": {}, "stripes": {"d": share}}, "d", "a" * 32) == expected
    copy = {"datasets": {"d": {"digest": "a" * 32, "state": "fetching"}}, "stripes": {"d": share}}
    assert holds(copy, "d", "a" * 32) == "fetching"  # a copy says more than a share


@pytest.mark.parametrize(
    "name",
    [
        "x",
        "imagenet-1k_v2.train",
        "a" * 128,
        "a" * 129,
        "a" * 253,
        ".hidden",
        "-x",
        "x/y",
        "x y",
        "é",
    ],
)
def test_the_schema_names_a_dataset_by_the_one_name_rule(name: str) -> None:
    """The schema cannot import dsplatform.names; this holds it to the same rule. (Not
    checked: a trailing newline, which the schema's ECMA ``$`` refuses but Python's ``re``,
    which jsonschema runs it with, lets through.)"""
    published = inventory({name: entry()})
    if is_name(name):
        validate(published)
    else:
        with pytest.raises(InvalidInput):
            validate(published)


def _striped(members: list[str]) -> dict[str, Any]:
    share = {"digest": "a" * 32, "sizeBytes": 9, "heldBytes": 3, "members": len(members), "group": members}
    return {**inventory({"x": entry()}), "stripes": {"imgs": share}}


def test_a_shares_group_is_read_back_and_a_bad_one_is_none() -> None:
    from dsplatform.wire.inventory import MAX_GROUP, stripe_group

    doc = _striped(["node-a", "node-b"])
    validate(doc)
    assert stripe_group(doc, "imgs", "a" * 32) == ("node-a", "node-b")
    assert stripe_group(doc, "imgs", "b" * 32) == ()  # another version's group
    assert stripe_group(doc, "other", "a" * 32) == ()
    for bad in ([], ["node-a", 7], ["node-a", ""], ["n" * 254], ["n"] * (MAX_GROUP + 1), "node-a"):
        broken = _striped(["node-a"])
        broken["stripes"]["imgs"]["group"] = bad
        assert stripe_group(broken, "imgs", "a" * 32) == (), bad
        with pytest.raises(InvalidInput):
            validate(broken)


def test_over_budget_the_stripe_groups_go_before_any_dataset() -> None:
    doc = _striped([f"gpu-node-{i:04d}" for i in range(400)])
    text = compact(doc, budget=1_000)
    kept = json.loads(text)
    validate(kept)
    assert "group" not in kept["stripes"]["imgs"] and kept["stripes"]["imgs"]["members"] == 400
    assert "x" in kept["datasets"] and "truncated" not in kept  # no dataset was dropped
