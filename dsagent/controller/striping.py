"""Stripe groups the Dataset controller holds (``spec.stripe``, docs/design-striping.md#group).

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile`, per Dataset,
each pass. For a Dataset with ``spec.stripe`` (``auto``, or ``{members: N}``) and a packed
version (``status.bytes``, ``spec.bundles``), it chooses the group with the pure
:func:`dsagent.cache.stripegroup.choose_group` (earlier members first, then nodes holding
bundles, then room), asks every member's agent to hold its share (``PUT /v1/stripes/<name>``,
idempotent: asking again each pass is the renewal) and reports ``status.stripe``: the
members, and each one's held and owned bytes, never "complete" before every member says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsagent.cache.stripegroup import Candidate, choose_group
from dsagent.controller.agents import JSON, AgentCall


def parse_stripe(value: object) -> int | str | None:
    """``spec.stripe``: ``"auto"`` (the size rule), ``{"members": N}`` (1..4096), else None (off)."""
    if value == "auto":
        return "auto"
    if isinstance(value, dict):
        members = value.get("members")
        if isinstance(members, int) and not isinstance(members, bool) and 1 <= members <= 4096:
            return members
    return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def stripe_status(
    name: str,
    spec: JSON,
    status: JSON,
    inventories: Mapping[str, Mapping[str, Any]],
    *,
    agent_call: AgentCall,
    agent_urls: Mapping[str, str],
    who: str = "-",
) -> JSON:
    """The Dataset's ``status.stripe``, after asking the chosen members' agents (each request
    names the Dataset ``who``, ``namespace/name``, it is for: docs/operator-guide/tenancy.md)."""
    mode = parse_stripe(spec.get("stripe"))
    size = _int(status.get("bytes"))
    store = spec.get("bundles")
    if mode is None or not size or not isinstance(store, str):
        return {"state": "Off" if mode is None else "Waiting", "nodes": [], "members": 0}
    before = [str(n.get("node")) for n in (status.get("stripe") or {}).get("nodes") or [] if isinstance(n, dict)]
    candidates = []
    for node in sorted(agent_urls):
        inv = inventories.get(node) or {}
        held = ((inv.get("stripes") or {}).get(name) or {}).get("heldBytes")
        whole = (inv.get("datasets") or {}).get(name) or {}
        held_bytes = _int(held) or (_int(whole.get("sizeBytes")) if whole.get("state") == "ready" else 0)
        candidates.append(Candidate(node, _int(inv.get("freeBytes")), held_bytes, None, _int(inv.get("capacityBytes"))))
    members = choose_group(candidates, size_bytes=size, before=before, members=None if mode == "auto" else int(mode))
    body = {"store": store, "members": members, "peers": {m: agent_urls[m] for m in members}}
    if isinstance(status.get("digest"), str):
        body["digest"] = status["digest"]
    reports = []
    for node in members:
        answer = agent_call(node, "PUT", f"/v1/stripes/{name}", body, who)
        if answer is None or answer[0] != 200 or not isinstance(answer[1], dict):
            reports.append({"node": node, "state": "unreachable" if answer is None else "failed",
                            "bytesHeld": 0, "bytesOwned": 0})  # fmt: skip
            continue
        share = answer[1]
        state = "ready" if share.get("complete") else "fetching"
        held, owned = _int(share.get("bytesHeld")), _int(share.get("bytesOwned"))
        reports.append({"node": node, "state": state, "bytesHeld": held, "bytesOwned": owned})
    complete = bool(reports) and all(r["state"] == "ready" for r in reports)
    return {"state": "Ready" if complete else "Filling", "members": len(members), "nodes": reports}


__all__ = ["parse_stripe", "stripe_status"]
