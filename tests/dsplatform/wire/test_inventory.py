"""The node inventory: what the agent writes every reader reads back alike, and what readers refuse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsagent.cache.inventory import validate
from dsagent.cache.report import inventory as agent_inventory
from dsagent.controller.cachestate import Holding as ControllerHolding
from dsagent.controller.cachestate import holdings
from dsagent.controller.reconcile import parse_inventory as controller_reads
from dsagent.nodeagent.publisher import INVENTORY, desired_annotations
from dsplatform.boundedjson import JsonRefused
from dsplatform.wire.inventory import (
    ANNOTATION,
    ANNOTATION_MAX_BYTES,
    STRIPE_NO_SHARE,
    STRIPE_ON_DEMAND,
    VERSION,
    compact,
    dataset_entry,
    document,
    has_feature,
    holds,
    loads,
    versions_of,
    whole_share,
)
from scheduling.nodeinfo import parse_inventory as extender_reads

OLD, NEW, FRESH = "a" * 32, "b" * 32, "c" * 32
#: whole GiB: the publisher rounds free bytes down to 64 MiB, these stay as they are
SPACE = {"capacityBytes": 10 << 30, "freeBytes": 5 << 30}


def view(name: str, digest: str, state: str, *, size: int, done: int, in_use: bool = False) -> dict[str, Any]:
    """A ``GET /v1/datasets`` row, the fields the inventory takes from it."""
    return {
        "name": name,
        "digest": digest,
        "state": state,
        "sizeBytes": size,
        "files": 3,
        "inUse": in_use,
        "lastUsed": "2026-11-21T10:00:00Z",
        "bytesDone": done,
    }


VIEWS = [
    view("imagenet", OLD, "ready", size=900, done=900, in_use=True),
    view("imagenet", NEW, "ready", size=1000, done=1000),
    view("coco", FRESH, "fetching", size=400, done=100),
]


def test_what_the_agent_writes_matches_the_schema_and_reads_back_through_the_annotation() -> None:
    written = agent_inventory(VIEWS, SPACE, "gpu-7")
    validate(written)
    assert written["version"] == VERSION and written["node"] == "gpu-7"
    text = desired_annotations(written, None, None)[INVENTORY]
    assert INVENTORY == ANNOTATION and text == compact(written)
    read = loads(text)
    assert read == json.loads(json.dumps(written))
    assert [v["digest"] for v in versions_of(read, "imagenet")] == [NEW, OLD, NEW]
    assert (holds(read, "imagenet", OLD), holds(read, "coco", FRESH), holds(read, "coco", OLD)) == (
        "ready",
        "fetching",
        None,
    )


def test_the_extender_and_the_controller_read_the_same_holdings() -> None:
    text = compact(agent_inventory(VIEWS, SPACE, "gpu-7"))
    inventory, error = extender_reads(text)
    assert error is None and inventory is not None
    assert (inventory.capacity_bytes, inventory.free_bytes) == (10 << 30, 5 << 30)
    imagenet, coco = inventory.datasets["imagenet"], inventory.datasets["coco"]
    # the current version is NEW, an older one (OLD) is in use: the dataset is in use
    assert (imagenet.digest, imagenet.ready, imagenet.in_use, imagenet.size_bytes) == (NEW, True, True, 1000)
    assert (coco.ready, coco.held_bytes) == (False, 100)
    parsed = controller_reads(text)
    assert parsed is not None
    assert holdings({"gpu-7": parsed}, "imagenet", OLD) == {"gpu-7": ControllerHolding("ready", 900, 900)}
    assert holdings({"gpu-7": parsed}, "coco", FRESH) == {"gpu-7": ControllerHolding("fetching", 100, 400)}


def test_document_and_entry_build_the_documented_shape() -> None:
    entry = dataset_entry([view("d", FRESH, "fetching", size=10, done=4)])
    assert entry == {
        "digest": FRESH,
        "sizeBytes": 10,
        "files": 3,
        "state": "fetching",
        "inUse": False,
        "lastUsed": "2026-11-21T10:00:00Z",
        "heldBytes": 4,
    }
    doc = document(None, capacity_bytes=None, free_bytes=0, datasets={"d": entry})
    assert doc == {
        "version": VERSION, "node": None, "capacityBytes": None, "freeBytes": 0, "datasets": {"d": entry},
        "features": ["stripeNoShare", "stripeOnDemand", "stripeWindowBytes"],
    }  # fmt: skip
    assert has_feature(doc, STRIPE_NO_SHARE) and has_feature(doc, STRIPE_ON_DEMAND)
    # an agent of an earlier release says nothing of what it understands; junk counts as nothing
    for earlier in ({}, {"features": "stripeNoShare"}, {"features": [{"x": 1}]}):
        assert not has_feature({**doc, **earlier} if earlier else {"version": 1}, STRIPE_NO_SHARE)
    assert has_feature(loads(compact(doc)) or {}, STRIPE_NO_SHARE)  # the annotation keeps it
    assert "stripes" in document("n", capacity_bytes=1, free_bytes=0, datasets={}, stripes={"s": {}})


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("not json", "is not JSON"),
        ("[]", "no 'datasets' object"),
        ('{"datasets": []}', "no 'datasets' object"),
        ('{"datasets": {}, "datasets": {}}', "twice"),
        ('{"datasets": {"d": ' + "[" * 5000 + "]" * 5000 + "}}", "nested deeper"),
        ('{"datasets": {}, "pad": "' + "x" * ANNOTATION_MAX_BYTES + '"}', "over"),
    ],
    ids=["not-json", "list", "datasets-list", "duplicate-key", "deep", "large"],
)
def test_every_reader_refuses_an_inventory_it_cannot_trust(text: str, complaint: str) -> None:
    with pytest.raises(JsonRefused) as excinfo:
        loads(text)
    assert complaint in excinfo.value.message
    assert controller_reads(text) is None
    inventory, error = extender_reads(text)
    assert inventory is None and error is not None and complaint in error


def test_fields_of_the_wrong_type_count_as_absent() -> None:
    doc = {"datasets": {"d": {"digest": FRESH, "state": "ready", "versions": "nonsense"}, "e": 7}}
    assert versions_of(doc, "d") == [doc["datasets"]["d"]] and versions_of(doc, "e") == []
    assert holds(doc, "d", FRESH) == "ready" and holds(doc, "missing", FRESH) is None


def test_a_share_holding_every_bundle_is_a_ready_copy_to_its_peers() -> None:
    """A whole copy held as a share serves any bundle: a peer lookup takes it as ready; a
    share holding part of the version serves its own bundles only."""

    def doc(held: object, size: object = 1000) -> dict[str, object]:
        return {"stripes": {"s": {"digest": FRESH, "sizeBytes": size, "heldBytes": held, "group": ["a", "b"]}}}

    assert holds(doc(1000), "s", FRESH) == "ready"
    assert holds(doc(999), "s", FRESH) == "share"
    assert holds(doc(1000, size=0), "s", FRESH) == "share"  # a size not known: not taken as whole
    assert holds(doc(True, size=True), "s", FRESH) is None  # booleans are not counts
    assert holds(doc(1000), "s", OLD) is None


def test_whole_share_takes_the_callers_size_only_where_the_entry_says_none() -> None:
    """One rule for "holds the version whole": the entry's own ``sizeBytes``; the caller's
    size (the controller's ``status.bytes``) only for an entry that does not say it."""
    entry = {"digest": FRESH, "heldBytes": 1000}
    assert whole_share({"stripes": {"s": entry}}, "s", FRESH) is False  # no size known
    assert whole_share({"stripes": {"s": entry}}, "s", FRESH, size_bytes=1000) is True
    assert whole_share({"stripes": {"s": entry}}, "s", FRESH, size_bytes=1001) is False
    sized = {**entry, "sizeBytes": 1000}
    assert whole_share({"stripes": {"s": sized}}, "s", FRESH, size_bytes=5000) is True  # the entry's own wins
    assert whole_share({"stripes": {"s": sized}}, "s", OLD, size_bytes=1000) is False
