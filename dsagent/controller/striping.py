"""Stripe groups the Dataset controller holds (``spec.stripe``, docs/design-striping.md#group).

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile`, per Dataset,
each pass. For a Dataset with ``spec.stripe`` (``auto``, or ``{members: N}``) and a packed
version (``status.bytes``, ``spec.bundles``), it chooses the group with the pure
:func:`dsagent.policy.holding.choose_placement` (the job's nodes first, earlier members,
then nodes holding bundles, then room; the job's nodes the version fits hold it whole),
asks every member's agent to hold its share (or, ``whole``, every bundle) (``PUT /v1/stripes/<name>``,
idempotent: asking again each pass is the renewal of the share's lease; for a Dataset whose
pods start before the copy is whole, ``spec.startBeforeWhole``, with ``storeOnDemand``: the
store is read for what readers read, the peers fill the rest) and reports
``status.stripe``: the members, and each one's held and owned bytes, never "complete" before
every member says so. The group starts with the job's own nodes (:func:`job_nodes`: where
the Dataset's pods run) and prefers the RoCE subnets of the first member (:func:`node_subnets`,
from the topology each agent publishes). A member dropped from the group, or every member
once ``spec.stripe`` goes, is told to release its share (``DELETE /v1/stripes/<name>``); one
that cannot be told lets it lapse with its lease. A member dropped while the version is
still striped keeps a share holding every bundle (``keep=whole``): a whole copy, with no
lease, until its cache evicts it, so the next job on that node reads it there.

Churn (docs/design-striping.md#churn): a member whose node is **draining**
(:func:`dsagent.kube.leaving.draining`: cordoned, or drain-tainted) is leaving.
The group is chosen without it, the new members are asked to hold their shares with the
leaving node listed as a peer (their agents ask it first for the bundles it owned, then the
other members, then the store), the leaving node keeps its old share held meanwhile, and its
share is released only once every new member reports its share complete, or when
``drain_timeout`` has passed (the new owners then finish from the store). ``status.stripe.drain``
and a Dataset Event say which. A **crashed** member (its agent gone, or its inventory older
than the controller's ``inventory_max_age``) is left out of the group at once: nothing waits
for it, the new owners fetch from the other members, then the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any, NamedTuple

from dsagent.controller.agents import JSON, AgentCall, Request, on_each
from dsagent.controller.podfacts import dataset_names, ended, node_of
from dsagent.kube.datasets import parse_stripe
from dsagent.kube.leaving import draining
from dsagent.policy.copies import Key, Tally, ready_versions, tally
from dsagent.policy.holding import choose_placement
from dsagent.policy.stripegroup import Candidate, Candidates
from dsplatform import published
from dsplatform.boundedjson import count
from dsplatform.kubetime import format_time, parse_or_none
from dsplatform.tenancy import acting_for
from dsplatform.wire import inventory as wire_inventory
from dsplatform.wire.nodecache import TOPOLOGY_MAX_BYTES
from dsplatform.wire.stripehold import HOLDING_WHOLE, read_share, release_query, stripe_request
from gpu_topology import TopologyError, roce_subnets, subnet_key, topology_from_dict

Event = tuple[str, str, str]  # (type, reason, note) of a Dataset Event


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def job_nodes(pods: Iterable[Mapping[str, Any]], namespace: str, name: str) -> list[str]:
    """The nodes of the pods in ``namespace`` that name Dataset ``name`` and are bound and not
    ended, oldest pod first: the job's ranks there read their share from local disk."""
    found = []
    for pod in pods:
        meta = _mapping(pod.get("metadata"))
        node = node_of(pod)
        if node is None or ended(pod) or meta.get("namespace") != namespace or name not in dataset_names(pod):
            continue
        found.append((str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""), node))
    return list(dict.fromkeys(node for _, _, node in sorted(found)))


def node_subnets(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """node -> the key of its RoCE subnets (:func:`gpu_topology.subnet_key`), from the topology
    its agent publishes (``dsagent.io/topology``); nodes without one are left out. Hostile
    input: an oversized or unreadable annotation counts as unknown."""
    out = {}
    for node in nodes:
        meta = _mapping(node.get("metadata"))
        annotations = _mapping(meta.get("annotations"))
        text = annotations.get(published.TOPOLOGY)
        key = _subnet_key(text) if isinstance(text, str) and len(text) <= TOPOLOGY_MAX_BYTES else None
        if key is not None:
            out[str(meta.get("name"))] = key
    return out


@lru_cache(maxsize=1024)
def _subnet_key(text: str) -> str | None:
    """Parsed once per distinct annotation (a cluster has few distinct topologies)."""
    try:
        return subnet_key(roce_subnets(topology_from_dict(json.loads(text))))
    except (TopologyError, ValueError, TypeError, AttributeError, KeyError):
        return None


def _whole_share(inventory: Mapping[str, Any], name: str, digest: object, size: int) -> bool:
    """The wire module's rule (:func:`dsplatform.wire.inventory.whole_share`), the Dataset's
    size standing in for an entry that does not say its own."""
    return isinstance(digest, str) and wire_inventory.whole_share(inventory, name, digest, size_bytes=size)


def _release(
    agent_call: AgentCall, nodes: Iterable[str], name: str, digest: Any, who: str, *, keep_whole: bool = False
) -> None:
    """Tell each node's agent to let its share go; ``keep_whole``: one holding every bundle
    stays, a whole copy with no lease that its cache evicts when it needs the room."""
    query = release_query(digest if isinstance(digest, str) else None, keep_whole=keep_whole)
    # an unreachable agent's share lapses with its lease
    on_each(lambda node: agent_call(node, "DELETE", f"/v1/stripes/{name}{query}", None, who), list(nodes))


def stripe_status(
    name: str,
    spec: JSON,
    status: JSON,
    inventories: Mapping[str, Mapping[str, Any]],
    *,
    agent_call: AgentCall,
    agent_urls: Mapping[str, str],
    who: str = "-",
    job: Sequence[str] = (),
    subnets: Mapping[str, str] | None = None,
    leaving: Iterable[str] = (),
    now: float = 0.0,
    drain_timeout: float = 600.0,
    events: list[Event] | None = None,
    striped: StripedPass | None = None,
    listing: Mapping[str, Any] | None = None,
) -> JSON:
    """The Dataset's ``status.stripe``, after asking the chosen members' agents (each request
    names the Dataset ``who``, ``namespace/name``, it is for: docs/operator-guide/tenancy.md).
    ``job``: the nodes of the Dataset's pods (:func:`job_nodes`), members first;
    ``subnets``: node -> its RoCE subnets' key (:func:`node_subnets`); ``leaving``: the
    draining nodes (:func:`draining`); ``now``: wall-clock seconds; ``drain_timeout``: how
    long a leaving member's share is held for the new owners at most; ``events``: the Dataset
    Events to record are appended there; ``striped``: the pass's :func:`striped_pass`, for
    every striped Dataset (made here from the other arguments when not given; given, its
    draining nodes, and the subnets its candidates carry, are those read); ``listing``: the nodes whose inventory lists
    the Dataset (None: any may), the only ones that see the version otherwise than as one
    they hold nothing of."""
    mode = parse_stripe(spec.get("stripe"))
    size = count(status.get("bytes"))
    digest = status.get("digest")
    store = spec.get("bundles")
    earlier = [r for r in (status.get("stripe") or {}).get("nodes") or [] if isinstance(r, dict)]  # last pass's
    before = [str(r.get("node")) for r in earlier]
    if mode is None and before:  # striping switched off: the shares go now
        _release(agent_call, before, name, status.get("digest"), who)
    if mode is None or not size or not isinstance(store, str):
        return {"state": "Off" if mode is None else "Waiting", "nodes": [], "members": 0}
    striped = striped if striped is not None else striped_pass(inventories, agent_urls, subnets, leaving)
    leaving_now = striped.leaving
    events = events if events is not None else []
    drain = _mapping((status.get("stripe") or {}).get("drain"))
    moving = drain.get("state") == "Moving"
    recorded = drain.get("members")
    old_members = [str(m) for m in recorded] if moving and isinstance(recorded, list) else before
    # leaving: earlier members on a draining node whose agent still answers with a fresh
    # inventory; a member gone or stale has crashed and is simply left out
    departing = [
        n for n in dict.fromkeys([*old_members, *before]) if n in leaving_now and n in agent_urls and n in inventories
    ]
    # members whose agent answered last pass holding every bundle: an inventory published
    # before its copy was complete does not make it a share again (and release it)
    whole_before = {
        str(r.get("node")) for r in earlier if r.get("holding") == HOLDING_WHOLE and count(r.get("bytesHeld")) >= size
    }
    # members outside the job whose agent refused the share it was asked for last pass,
    # holding none of it (no room, its cache held by pods' data): another node owns in its
    # place, instead of a share no one holds, whose bundles the store would serve every epoch
    refused = {
        str(r.get("node")) for r in earlier if r.get("state") == "failed" and not count(r.get("bytesHeld"))
    } - set(job)
    # the nodes as the version sees them: the pass's blank candidates (the agents' nodes with
    # a fresh inventory, not leaving), changed where a node lists the Dataset, without those
    # that refused it (crashed and stale nodes have no inventory)
    changed = []
    for node in inventories if listing is None else listing:
        inv = inventories.get(node)
        if inv is None or node not in striped.blank.by_name:
            continue
        room = striped.rooms[node]
        listed = (inv.get("stripes") or {}).get(name) or {}
        if listed.get("digest") != digest:  # another version's share holds none of this one's bundles
            listed = {}
        copy = room.ready.get((name, digest)) or {} if isinstance(digest, str) else {}
        if not listed and not copy:
            continue
        held = count(listed.get("heldBytes"))  # of its share's bundles
        says_window = room.blank.window_bytes is not None  # its agent counts them
        changed.append(
            replace(
                room.blank, held_bytes=held or count(copy.get("sizeBytes")),
                window_bytes=count(listed.get("windowBytes")) if says_window else None,
                holds_whole=bool(listed) and (_whole_share(inv, name, digest, size) or node in whole_before),
            )
        )  # fmt: skip
    candidates = striped.blank.but(changed, without=refused)
    shareless_before = [str(r.get("node")) for r in earlier if r.get("share") is False]
    # the members that answered last pass holding their share, not the whole version
    share_before = [
        str(r.get("node")) for r in earlier
        if r.get("state") in ("ready", "onDemand", "fetching") and r.get("holding") != HOLDING_WHOLE
    ]  # fmt: skip
    members, no_share, whole = choose_placement(
        candidates,
        size_bytes=size,
        job_nodes=job,
        before=[n for n in before if n not in leaving_now and n not in refused],
        no_share_before=shareless_before,
        share_before=share_before,
        members=None if mode == "auto" else int(mode),
    )
    dropped = [n for n in before if n not in members and n not in departing and n in agent_urls]
    # a whole copy outlives its place in the group: the next job on that node reads it there
    _release(agent_call, dropped, name, status.get("digest"), who, keep_whole=True)
    peers = {m: agent_urls[m] for m in [*members, *departing]}  # the leaving nodes are asked first
    digest = status.get("digest") if isinstance(status.get("digest"), str) else None
    group = GroupHold(name, spec, store, members, peers, digest, no_share, who)

    def ask(node: str) -> JSON:  # one member's report, after asking its agent to hold its part
        # a job's node the version fits holds it whole (docs/design-striping.md#holding)
        answer = agent_call(*group.request(node, whole=node in whole, inventory=inventories.get(node) or {}))
        part: JSON = {"share": False} if node in no_share else {}  # a member owning nothing says so
        share = read_share(answer[1]) if answer is not None and answer[0] == 200 else None
        if share is None:
            return {"node": node, "state": "unreachable" if answer is None else "failed",
                    "bytesHeld": 0, "bytesOwned": 0, **part}  # fmt: skip
        # a share held on demand is filled as far as its version is read: not behind, serving
        state = "ready" if share.complete else ("onDemand" if share.on_demand else "fetching")
        if share.whole:  # the agent holds every bundle (it checked it can)
            part["holding"] = HOLDING_WHOLE
        return {"node": node, "state": state, "bytesHeld": share.bytes_held, "bytesOwned": share.bytes_owned, **part}

    reports = on_each(ask, members)
    complete = bool(reports) and all(r["state"] == "ready" for r in reports)
    serving = bool(reports) and all(r["state"] in ("ready", "onDemand") for r in reports)
    state = "Ready" if complete else ("OnDemand" if serving else "Filling")
    out: JSON = {"state": state, "members": len(members), "nodes": reports}
    drained = _drain(
        name, status, store, old_members, departing, drain if moving else {}, complete, now, drain_timeout,
        agent_call=agent_call, agent_urls=agent_urls, who=who, events=events,
    )  # fmt: skip
    if drained or drain:
        out["drain"] = drained or dict(drain)
    return out


class GroupHold(NamedTuple):
    """What a pass asks every member of a version's group, but for the member's own part:
    :meth:`request` builds the one request, what :func:`stripe_status` sends each member and
    what a pass sends ahead as a renewal (:func:`share_renewals`;
    :class:`~dsagent.controller.agents.PassCalls` hands an answer over only to the very same
    request)."""

    name: str
    spec: JSON
    store: str
    members: Sequence[str]
    peers: Mapping[str, str]
    digest: str | None
    no_share: Sequence[str]
    who: str

    def request(self, node: str, *, whole: bool, inventory: Mapping[str, Any]) -> Request:
        """``PUT /v1/stripes/<name>`` asking ``node``'s agent to hold its part (``whole``:
        every bundle); ``inventory``: the node's, which says whether its agent takes
        ``storeOnDemand``."""
        # its pods read through the agent at once: the store is read for what they read, and
        # no bundle is held before they start (its fill reads no store for them)
        on_demand = self.spec.get("startBeforeWhole") is True and wire_inventory.has_feature(
            inventory, wire_inventory.STRIPE_ON_DEMAND
        )
        asked = stripe_request(
            self.store, self.members, self.peers, digest=self.digest,
            no_share=self.no_share,  # only then: every member's agent says it takes the field (has_feature)
            whole=whole, store_on_demand=on_demand, ready_after=0 if on_demand else None,
        )  # fmt: skip
        return node, "PUT", f"/v1/stripes/{self.name}", dict(asked), self.who


#: the members' states in ``status.stripe.nodes`` that hold their part: asked again, their
#: agents renew a lease and make no room
_HOLDING = ("ready", "onDemand", "fetching")


def share_renewals(
    datasets: Sequence[JSON], inventories: Mapping[str, Mapping[str, Any]], agent_urls: Mapping[str, str]
) -> list[Request]:
    """The holds a pass will most likely send again: each striped Dataset's group as its
    status recorded it, asked of the members that held their part (:meth:`GroupHold.request`),
    for :class:`~dsagent.controller.agents.PassCalls` to send together before the Datasets
    are reconciled one after another. Only renewals: a member that failed or did not answer
    is left out (asking it could make room for a share the pass then does not choose), and
    so is a group draining or with a member whose agent is gone, whose pass chooses again.
    A request the pass does not make after all (its choice changed) is a renewal of what
    the agent held, before the pass's own request."""
    out: list[Request] = []
    for ds in datasets:
        meta, spec, status = ds.get("metadata"), ds.get("spec"), ds.get("status")
        if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
            continue
        stripe, store, digest = _mapping(status.get("stripe")), spec.get("bundles"), status.get("digest")
        earlier = [r for r in stripe.get("nodes") or [] if isinstance(r, dict)]
        members = [str(r.get("node")) for r in earlier]
        if (
            parse_stripe(spec.get("stripe")) is None or not count(status.get("bytes")) or not isinstance(store, str)
            or not earlier or stripe.get("drain") or not all(m in agent_urls for m in members)
        ):  # fmt: skip
            continue
        name = str(meta.get("name", ""))
        group = GroupHold(
            name, spec, store, members, {m: agent_urls[m] for m in members},
            digest if isinstance(digest, str) else None,
            [str(r.get("node")) for r in earlier if r.get("share") is False],
            acting_for(str(meta.get("namespace", "default")), name),
        )  # fmt: skip
        out += [
            group.request(str(r.get("node")), whole=r.get("holding") == HOLDING_WHOLE, inventory=_node(inventories, r))
            for r in earlier
            if r.get("state") in _HOLDING
        ]
    return out


def _node(inventories: Mapping[str, Mapping[str, Any]], report: JSON) -> Mapping[str, Any]:
    return inventories.get(str(report.get("node"))) or {}


class Room(NamedTuple):
    """What a node offers any striped version, the same for every Dataset of a pass
    (:func:`node_rooms`)."""

    blank: Candidate
    """the node as a version it holds nothing of sees it (most nodes, for most versions): its
    free bytes, what it could free without evicting the last copy of anything (spare), what
    its pods' copies hold (in use), its cache, its subnet and what its agent takes"""
    ready: Mapping[Key, Mapping[str, Any]]
    """its ready versions (:func:`dsagent.policy.copies.ready_versions`)"""


#: node name -> its :class:`Room`
Rooms = Mapping[str, Room]
#: an inventory -> its ready versions (:func:`dsagent.policy.copies.ready_versions`)
VersionsOf = Callable[[Mapping[str, Any]], Mapping[Key, Mapping[str, Any]]]


class StripedPass(NamedTuple):
    """What every striped Dataset's choice of a pass reads of the nodes (a controller makes
    it once a pass, :func:`striped_pass`): their :func:`node_rooms` (with their
    :func:`node_subnets`) and :func:`draining`, and the nodes a choice is made over as a
    version they hold nothing of sees them."""

    rooms: Rooms
    leaving: set[str]
    blank: Candidates
    """the agents' nodes with a fresh inventory, not leaving, by name"""


def striped_pass(
    inventories: Mapping[str, Mapping[str, Any]],
    agent_urls: Mapping[str, str],
    subnets: Mapping[str, str] | None = None,
    leaving: Iterable[str] = (),
    tallied: Tally | None = None,
    versions_of: VersionsOf = ready_versions,
) -> StripedPass:
    """:class:`StripedPass` of a pass's ``inventories`` (node -> a fresh inventory), the nodes
    with an agent (``agent_urls``), their ``subnets`` (:func:`node_subnets`), the draining
    nodes (``leaving``) and the copy counts (:func:`dsagent.policy.copies.tally`, worked out
    here when not given); ``versions_of``: :func:`node_rooms`'."""
    tallied = tallied if tallied is not None else tally(inventories)
    rooms = node_rooms(inventories, tallied, subnets, versions_of=versions_of)
    gone = set(leaving)
    blank = Candidates(rooms[n].blank for n in sorted(agent_urls) if n in rooms and n not in gone)
    return StripedPass(rooms, gone, blank)


def node_rooms(
    inventories: Mapping[str, Mapping[str, Any]],
    tallied: Tally,
    subnets: Mapping[str, str] | None = None,
    *,
    versions_of: VersionsOf = ready_versions,
) -> dict[str, Room]:
    """:data:`Rooms` of every node of ``inventories``, given the pass's copy counts and
    keepers (:func:`dsagent.policy.copies.tally`) and the nodes' subnets
    (:func:`node_subnets`): made once a pass for every striped
    Dataset's choice of members, whose own share does not change them (at 5,000 nodes and
    50 striped Datasets, reading them for each Dataset made a pass take 54 s).
    ``versions_of``: what :func:`dsagent.policy.copies.ready_versions` answers of an
    inventory (a caller may remember it for an inventory read before; read-only)."""
    copies, kept = tallied
    keeping: dict[str, set[Key]] = {}
    for key, keeper in kept.items():
        keeping.setdefault(keeper, set()).add(key)
    rooms = {}
    for node, inventory in inventories.items():
        versions = versions_of(inventory)  # one walk of its listing for every figure
        free, capacity = count(inventory.get("freeBytes")), count(inventory.get("capacityBytes"))
        replicated, in_use = _idle_and_used_bytes(versions, copies, keeping.get(node, set()))
        spare = free + replicated
        no_share = wire_inventory.has_feature(inventory, wire_inventory.STRIPE_NO_SHARE)
        says_window = wire_inventory.has_feature(inventory, wire_inventory.STRIPE_WINDOW_BYTES)
        blank = Candidate(
            node, free, 0, (subnets or {}).get(node), capacity, spare_bytes=spare, takes_no_share=no_share,
            window_bytes=0 if says_window else None, in_use_bytes=in_use,
        )  # fmt: skip
        rooms[node] = Room(blank, versions)
    return rooms


def _idle_and_used_bytes(
    versions: Mapping[Key, Mapping[str, Any]], copies: Mapping[Key, int], keeping: set[Key]
) -> tuple[int, int]:
    """Of a node's ready ``versions`` (:func:`dsagent.policy.copies.ready_versions`): what it
    could free without evicting the last copy of anything, its idle whole copies that another
    node holds ready too, but for those it keeps (``keeping``: to their keeper they are last
    copies, docs/design.md#cluster-eviction), the first tier of the eviction order
    (docs/design-striping.md#eviction); and the bytes its pods use, which no eviction frees.
    Two holders of a version's only two copies never both count it: one of them is its keeper.
    One loop for both: it runs for every node every pass."""
    idle = used = 0
    for key, version in versions.items():
        if version.get("inUse") is True:
            used += count(version.get("sizeBytes"))
        elif copies.get(key, 0) > 1 and key not in keeping:
            idle += count(version.get("sizeBytes"))
    return idle, used


def _drain(
    name: str,
    status: JSON,
    store: str,
    old_members: list[str],
    departing: list[str],
    drain: Mapping[str, Any],
    complete: bool,
    now: float,
    timeout: float,
    *,
    agent_call: AgentCall,
    agent_urls: Mapping[str, str],
    who: str,
    events: list[Event],
) -> JSON:
    """``status.stripe.drain`` for this pass ({} when nothing is leaving and nothing was): the
    leaving members keep their old share (renewed with the old group) until the new members are
    complete or ``timeout`` has passed since the move began; then they are told to release it."""
    if not departing:
        if drain:  # the leaving nodes crashed, or came back: nothing to wait for, nothing kept
            nodes = [str(n) for n in drain.get("nodes") or [] if isinstance(n, str)]
            _release(agent_call, [n for n in nodes if n in agent_urls], name, status.get("digest"), who)
            return {**drain, "state": "Ended", "message": f"{', '.join(nodes)} no longer leaving"}
        return {}
    off = ", ".join(departing)
    since = parse_or_none(drain.get("since")) if drain else None
    if since is None:
        since = now
        events.append(("Normal", "StripeShareMoving", f"moving share off {off} to the new owners over P2P"))
    if complete or now - since >= timeout:
        _release(agent_call, departing, name, status.get("digest"), who)
        if complete:
            message, state = f"moved share off {off}", "Moved"
            events.append(("Normal", "StripeShareMoved", message))
        else:
            message, state = f"timed out moving share off {off} after {timeout:g} s, fell back to the store", "TimedOut"
            events.append(("Warning", "StripeShareMoveTimedOut", message))
        ended: JSON = {"state": state, "nodes": departing, "since": format_time(since), "message": message}
        return {**ended, "members": None, "deadlineSeconds": None}  # None: merge-patched away
    body = stripe_request(
        store, old_members, {m: agent_urls[m] for m in old_members if m in agent_urls},
        digest=status["digest"] if isinstance(status.get("digest"), str) else None,
    )  # fmt: skip
    # renews the old share's lease: it is served to the new owners meanwhile
    on_each(
        lambda node: agent_call(node, "PUT", f"/v1/stripes/{name}", dict(body), who),
        [n for n in departing if n in old_members],
    )
    return {
        "state": "Moving",
        "nodes": departing,
        "members": old_members,
        "since": format_time(since),
        "deadlineSeconds": timeout,
        "message": f"moving share off {off} to the new owners over P2P",
    }


__all__ = [
    "GroupHold", "Room", "Rooms", "StripedPass", "draining", "job_nodes", "node_rooms", "node_subnets",
    "parse_stripe", "share_renewals", "stripe_status", "striped_pass",
]  # fmt: skip
