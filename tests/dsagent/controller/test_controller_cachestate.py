"""What an operator sees in kubectl: the Dataset's phase, cache and conditions, checked
against the chart's real CRD schema, and the Events the controller writes to the fake API
server as nodes cache, fail and evict the current version."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from dsagent.controller import cachestate
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsplatform.kubetime import format_time
from tests.charts.test_chart import dataset_schema, render
from tests.clock import Clock
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node

NS = "dsplatform"
DIGEST = "d" * 32
NOW = 1_800_000_000.0


def entry(state: str, *, held: int | None = None, size: int = 1000) -> dict[str, Any]:
    body: dict[str, Any] = {"digest": DIGEST, "sizeBytes": size, "files": 4, "state": state, "inUse": False,
                            "lastUsed": None}  # fmt: skip
    if held is not None:
        body["heldBytes"] = held
    return body


def set_inventory(
    apiserver: FakeApiServer, node: str, datasets: dict[str, Any], *, create: bool = False, at: float = NOW
) -> None:
    doc = json.dumps({"version": 1, "node": node, "capacityBytes": 10**9, "freeBytes": 10**9, "datasets": datasets})
    annotations = {"dsagent.io/inventory": doc, "dsagent.io/published-at": format_time(at)}
    if create:
        apiserver.create(make_node(node, annotations=annotations))
    else:
        apiserver.patch("nodes", node, {"metadata": {"annotations": annotations}})


def reasons(apiserver: FakeApiServer) -> list[tuple[str, str]]:
    return sorted((e["reason"], e["note"].split(" on node ")[-1]) for e in apiserver.list("events"))


def conditions(ds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ds["status"]["conditions"]}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return dataset_schema(render())


def test_status_and_events_follow_the_nodes_caching_failing_and_evicting(
    apiserver: FakeApiServer, api_client: Any, schema: dict[str, Any]
) -> None:
    set_inventory(apiserver, "n1", {"imagenet": entry("ready")}, create=True)
    set_inventory(apiserver, "n2", {"imagenet": entry("fetching", held=400)}, create=True)
    set_inventory(apiserver, "n3", {"imagenet": entry("failed")}, create=True)
    set_inventory(apiserver, "n4", {}, create=True)
    apiserver.create(make_dataset("imagenet", namespace="team-a", status={"digest": DIGEST, "files": 4, "bytes": 1000}))
    clock = Clock(NOW)
    ctl = DatasetController(api_client, ControllerSettings(namespace=NS, identity="c-1"), clock=clock)

    ctl.reconcile_all()
    ds = apiserver.get("datasets", "imagenet", "team-a")
    jsonschema.validate(ds, schema)  # the status the controller writes is what the CRD admits
    status = ds["status"]
    assert status["phase"] == "Ready"
    assert status["cache"] == {
        "cachedBytes": 1400, "cachedPercent": 100, "bestNodePercent": 100, "nodesReady": 1, "nodesFetching": 1,
        "nodesFailed": 1, "fetchingNodes": ["n2"], "failedNodes": ["n3"],
    }  # fmt: skip
    ready, degraded = conditions(ds)["Ready"], conditions(ds)["Degraded"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("True", "Cached", 1)
    assert degraded["status"] == "True" and "n3" in degraded["message"]
    assert conditions(ds)["Packing"]["status"] == "False"
    assert reasons(apiserver) == [("CacheFailed", "n3: its agent's log and 'dsctl status' there say why; the pod's "
                                   "Events carry the error code and hint"), ("Cached", "n1"), ("Caching", "n2"),
                                  ("Ready", f"{DIGEST[:12]} is ready on 1 node(s)")]  # fmt: skip
    warning = next(e for e in apiserver.list("events") if e["reason"] == "CacheFailed")
    assert warning["type"] == "Warning" and warning["regarding"]["kind"] == "Dataset"
    assert warning["metadata"]["namespace"] == "team-a" and warning["regarding"]["name"] == "imagenet"

    ctl.reconcile_all()  # nothing changed: nothing new said
    assert len(apiserver.list("events")) == 4

    clock.now += 600
    for node, datasets in (("n1", {}), ("n2", {"imagenet": entry("ready")})):  # n1 evicted it
        set_inventory(apiserver, node, datasets, at=clock.now)
    for node in ("n3", "n4"):  # fresh too: a stale inventory is not used
        set_inventory(apiserver, node, {"imagenet": entry("failed")} if node == "n3" else {}, at=clock.now)
    ctl.reconcile_all()
    ds = apiserver.get("datasets", "imagenet", "team-a")
    jsonschema.validate(ds, schema)
    new = {(e["reason"], e["note"].split(" on node ")[-1]) for e in apiserver.list("events")}
    assert ("Evicted", "n1") in new and ("Cached", "n2") in new
    assert [e["reason"] for e in apiserver.list("events")].count("Ready") == 1  # still ready: no second one
    assert conditions(ds)["Ready"]["lastTransitionTime"] == format_time(NOW)  # it never flipped

    clock.now += 600
    for node in ("n1", "n2", "n3", "n4"):
        set_inventory(apiserver, node, {}, at=clock.now)
    ctl.reconcile_all()
    ds = apiserver.get("datasets", "imagenet", "team-a")
    assert ds["status"]["phase"] == "NotCached"
    assert conditions(ds)["Ready"]["status"] == "False"
    assert conditions(ds)["Ready"]["lastTransitionTime"] == format_time(NOW + 1200)
    assert conditions(ds)["Degraded"]["status"] == "False"


def test_the_printer_columns_read_fields_the_controller_writes(schema: dict[str, Any]) -> None:
    from tests.charts.test_chart import find

    crd = find(render(), "CustomResourceDefinition", "datasets.dsagent.io")
    columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    status = cachestate.cache_status(
        {"n1": cachestate.Holding("ready", 10, 10)}, digest=DIGEST, size_bytes=10, pack_state=None, previous={},
        generation=None, now=format_time(NOW),
    )  # fmt: skip
    doc = {"status": {**status, "readyNodeCount": 1}}
    for name in ("Phase", "Ready", "Fetching", "Cached", "Cached-Bytes"):
        value: Any = doc
        for part in columns[name].lstrip(".").split("."):
            value = value[part]
        assert value is not None, name


# -- the pure parts


def test_holdings_take_only_the_current_digest_and_skip_hostile_fields() -> None:
    inventories: dict[str, Any] = {
        "a": {"datasets": {"x": entry("ready")}},
        "b": {"datasets": {"x": {**entry("ready"), "digest": "e" * 32}}},  # another version
        "c": {"datasets": {"x": entry("fetching", held=-5)}},  # a lying count
        "d": {"datasets": "not an object"},
        "e": {"datasets": {}, "stripes": {"x": {"digest": DIGEST, "sizeBytes": 1000, "heldBytes": 250, "members": 4}}},
    }
    held = cachestate.holdings(inventories, "x", DIGEST)
    assert held == {
        "a": cachestate.Holding("ready", 1000, 1000),
        "c": cachestate.Holding("fetching", 0, 1000),
        "e": cachestate.Holding("share", 250, 1000),
    }
    assert cachestate.holdings(inventories, "x", None) == {}


def test_nodes_whose_share_holds_every_bundle_are_listed_as_whole_copies(schema: dict[str, Any]) -> None:
    # n1 holds every bundle as a member, n2 a copy kept after its group let it go (both list
    # a whole share), n3 a part of the version: only the first two are whole copies
    def share(held: int) -> dict[str, Any]:
        return {"datasets": {}, "stripes": {"x": {"digest": DIGEST, "sizeBytes": 1000, "heldBytes": held}}}

    held = cachestate.holdings({"n1": share(1000), "n2": share(1000), "n3": share(400)}, "x", DIGEST)
    assert [n for n, h in held.items() if h.whole] == ["n1", "n2"] and not held["n3"].whole
    status = cachestate.cache_status(
        held, digest=DIGEST, size_bytes=1000, pack_state=None, previous={}, generation=1, now=format_time(NOW)
    )
    assert status["cache"]["nodesWholeShare"] == 2 and status["cache"]["wholeShareNodes"] == ["n1", "n2"]
    assert status["phase"] == "Ready"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == f"2 node(s) hold {DIGEST[:12]} whole as a stripe share"
    cache = schema["properties"]["status"]["properties"]["cache"]
    assert {"nodesWholeShare", "wholeShareNodes"} <= cache["properties"].keys()  # kept, not pruned
    jsonschema.validate(status, schema["properties"]["status"])


@pytest.mark.parametrize(
    ("digest", "pack", "held", "phase"),
    [
        (None, "Running", {}, "Packing"),
        (None, "Failed", {}, "Failed"),
        (None, "SourceUnreadable", {}, "Failed"),
        (None, None, {}, "Pending"),
        (DIGEST, "Running", {}, "NotCached"),
        (DIGEST, None, {"n": cachestate.Holding("fetching", 5, 10)}, "Caching"),
        (DIGEST, None, {"n": cachestate.Holding("share", 5, 10)}, "Caching"),
        (DIGEST, None, {"n": cachestate.Holding("share", 5, 10), "m": cachestate.Holding("share", 5, 10)}, "Ready"),
        (DIGEST, "Failed", {"n": cachestate.Holding("ready", 10, 10)}, "Ready"),
    ],
)
def test_phases(digest: str | None, pack: str | None, held: dict[str, Any], phase: str) -> None:
    status = cachestate.cache_status(
        held, digest=digest, size_bytes=10, pack_state=pack, previous={}, generation=3, now=format_time(NOW)
    )
    assert status["phase"] == phase
    kinds = {c["type"]: c["status"] for c in status["conditions"]}
    assert kinds["Ready"] == ("True" if phase == "Ready" else "False")
    assert kinds["Degraded"] == ("True" if pack in ("Failed", "SourceUnreadable") else "False")


def test_a_striped_version_counts_its_shares_once_toward_the_whole() -> None:
    shares = {f"n{i}": cachestate.Holding("share", 300, 1000) for i in range(3)}
    cache = cachestate.cache_status(
        shares, digest=DIGEST, size_bytes=1000, pack_state=None, previous={}, generation=None, now="t"
    )["cache"]
    assert (cache["cachedPercent"], cache["bestNodePercent"], cache["stripeMembers"]) == (90, 30, 3)


def test_a_new_version_is_news_on_every_node_again() -> None:
    before = {"digest": "e" * 32, "readyNodes": ["n1"], "phase": "Ready"}
    after = {"digest": DIGEST, "readyNodes": ["n1"], "phase": "Ready", "cache": {}}
    assert ("Normal", "Cached", f"{DIGEST[:12]} is cached and verified on node n1") in cachestate.changes(
        before, after, DIGEST
    )


def test_a_change_on_many_nodes_is_one_event() -> None:
    many = [f"node-{i:04d}" for i in range(1000)]
    few = many[: cachestate.NODE_EVENTS]
    status = {"digest": DIGEST, "phase": "Caching", "cache": {"fetchingNodes": many[500:]}, "readyNodes": many[:500]}
    events = cachestate.changes({}, status, DIGEST)
    assert [(kind, reason) for kind, reason, _ in events] == [("Normal", "Caching"), ("Normal", "Cached")]
    cached = events[1][2]
    assert cached == f"{DIGEST[:12]} is cached and verified on 500 nodes ({', '.join(few)} and 495 more)"
    # as many as NODE_EVENTS: one Event a node, as before
    per_node = cachestate.changes({}, {"digest": DIGEST, "readyNodes": few, "cache": {}}, DIGEST)
    assert [note for _, reason, note in per_node if reason == "Cached"] == [
        f"{DIGEST[:12]} is cached and verified on node {n}" for n in few
    ]
    # evictions on many nodes at once: one Event too
    gone = cachestate.changes(
        {"digest": DIGEST, "readyNodes": many}, {"digest": DIGEST, "readyNodes": [], "cache": {}}, DIGEST
    )
    assert [(reason, note.split(" (")[0]) for _, reason, note in gone] == [
        ("Evicted", f"{DIGEST[:12]} is no longer cached on 1,000 nodes")
    ]
