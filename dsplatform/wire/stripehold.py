"""The agent API's stripe bodies: what a client asks a node's agent to hold of a striped
version (``PUT /v1/stripes/{name}``), and what of the agent's answer the Dataset controller
reads. Version 1.

Writers of the request: the Dataset controller (:mod:`dsagent.controller.striping`) and
``dsctl stripe hold`` (:mod:`dsagent.cli.stripe`), both with :func:`stripe_request`; its
reader is the agent's route (:class:`dsagent.api.schemas.StripeIn`, whose field aliases
are the names here). Writer of the answer: the agent's route
(:class:`dsagent.api.schemas.StripeOut`, from :meth:`dsagent.cache.striped.stripes.Stripes.status`);
its readers: ``dsctl`` (printed as it comes) and the controller, which reads another
party's answer through :func:`read_share`: true booleans and whole byte counts only.

Request::

    store           the bundle store holding the version
    members         the stripe group's node names
    peers           {member node: its agent's base URL}
    digest?         the version (default: the store's current one)
    noShare?        members that own no bundles (only to agents listing the feature)
    storageOptions? for the store
    readyAfter?     own bundles held before the share says readyEnough (default 1)
    whole?          hold every bundle where the version fits the node (default false)
    storeOnDemand?  fill from the peers only; read the store only for bundles a reader
                    waits for (default false; only to agents listing the feature)
    leaseSeconds?   dropped unless held again within this long

Answer (what the controller reads of it)::

    complete, storeOnDemand, holding (whole | share), bytesHeld, bytesOwned

Release (``DELETE /v1/stripes/{name}?digest=&keep=``): ``keep=whole`` (:func:`release_query`,
the controller taking a node out of a group) keeps a share that holds every bundle as a
whole copy with no lease, which the node's cache evicts when it needs the room; an agent of
an earlier release ignores the parameter and drops it, as before.

Pure: no I/O, nothing of the processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from dsplatform.boundedjson import count

VERSION = 1
NO_SHARE = "noShare"
STORAGE_OPTIONS = "storageOptions"
READY_AFTER = "readyAfter"
WHOLE = "whole"
STORE_ON_DEMAND = "storeOnDemand"
LEASE_SECONDS = "leaseSeconds"
#: the answer's ``holding``: every bundle held on the node, or the bundles it owns
HOLDING_WHOLE = "whole"
HOLDING_SHARE = "share"
#: the release's ``keep``: a share holding every bundle stays, a whole copy with no lease
KEEP_WHOLE = "whole"


def release_query(digest: str | None = None, *, keep_whole: bool = False) -> str:
    """The release's query string (``""`` or ``?...``): the version, and whether a whole copy stays."""
    parts = ([f"digest={digest}"] if digest else []) + ([f"keep={KEEP_WHOLE}"] if keep_whole else [])
    return f"?{'&'.join(parts)}" if parts else ""


class _Group(TypedDict):
    store: str
    members: list[str]
    peers: dict[str, str]


class StripeRequestBody(_Group, total=False):
    digest: str
    noShare: list[str]
    storageOptions: dict[str, Any]
    readyAfter: int
    whole: bool
    storeOnDemand: bool
    leaseSeconds: float


def stripe_request(
    store: str,
    members: Sequence[str],
    peers: Mapping[str, str],
    *,
    digest: str | None = None,
    no_share: Sequence[str] = (),
    storage_options: Mapping[str, Any] | None = None,
    ready_after: int | None = None,
    whole: bool = False,
    store_on_demand: bool = False,
    lease_seconds: float | None = None,
) -> StripeRequestBody:
    """A hold request; an optional field is written only when it says more than its default
    (an agent from before a field never sees it unless it is asked for)."""
    body: StripeRequestBody = {"store": store, "members": list(members), "peers": dict(peers)}
    if digest:
        body["digest"] = digest
    if no_share:
        body["noShare"] = list(no_share)
    if storage_options:
        body["storageOptions"] = dict(storage_options)
    if ready_after is not None:
        body["readyAfter"] = ready_after
    if whole:
        body["whole"] = True
    if store_on_demand:
        body["storeOnDemand"] = True
    if lease_seconds is not None:
        body["leaseSeconds"] = lease_seconds
    return body


@dataclass(frozen=True)
class ShareReport:
    """What the controller reads of an agent's answer to a hold."""

    complete: bool  # every bundle the node owns is held
    on_demand: bool  # held storeOnDemand: filled as far as the version is read
    whole: bool  # the agent holds every bundle of the version
    bytes_held: int
    bytes_owned: int


def read_share(answer: Any) -> ShareReport | None:
    """The report in another party's answer (None when it is not an object): a flag is set
    only by a JSON ``true``, a count only by a whole number >= 0 (else 0)."""
    if not isinstance(answer, Mapping):
        return None
    return ShareReport(
        complete=answer.get("complete") is True,
        on_demand=answer.get(STORE_ON_DEMAND) is True,
        whole=answer.get("holding") == HOLDING_WHOLE,
        bytes_held=count(answer.get("bytesHeld")),
        bytes_owned=count(answer.get("bytesOwned")),
    )


__all__ = [
    "HOLDING_SHARE",
    "HOLDING_WHOLE",
    "KEEP_WHOLE",
    "LEASE_SECONDS",
    "NO_SHARE",
    "READY_AFTER",
    "STORAGE_OPTIONS",
    "STORE_ON_DEMAND",
    "VERSION",
    "WHOLE",
    "ShareReport",
    "StripeRequestBody",
    "read_share",
    "release_query",
    "stripe_request",
]
