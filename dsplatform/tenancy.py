"""Who a cluster action is for: the namespace and Dataset every operator request names.

Who calls it: the Dataset controller (writes the header on every request it makes to an
agent with the admin token) and the agent's API (reads it for its audit line, its counter,
its per-namespace accounting and the scope of a named eviction). One definition of the
header and of its value, so the two ends cannot drift apart (docs/tenancy.md).

- :data:`ACTING_FOR_HEADER`: ``X-Dsagent-For: <namespace>/<name>``, the Dataset a
  request acts for. The agent trusts it only beside a valid admin token (an operator
  may act for anyone); from anyone else it is ignored.
- :func:`over_share`: the one rule for "a namespace may pin at most ``share`` of a
  node's cache", used by the controller when it plans and by the agent when it admits.
"""

from __future__ import annotations

from dsplatform.names import is_dns_label, is_dns_subdomain

ACTING_FOR_HEADER = "X-Dsagent-For"
#: How an operator's own request (no header, e.g. ``dsctl evict`` by hand) is named in audit lines.
NO_DATASET = "-"


def acting_for(namespace: str, name: str) -> str:
    """The header's value for the Dataset ``namespace/name``."""
    return f"{namespace}/{name}"


def parse_acting_for(value: object) -> tuple[str, str] | None:
    """``(namespace, name)`` from a header value, or None when it is not a Dataset's
    namespace and name (a DNS label and a DNS subdomain, as the API server holds them)."""
    if not isinstance(value, str) or len(value) > 64 + 253:
        return None
    namespace, slash, name = value.partition("/")
    if not slash or not is_dns_label(namespace) or not is_dns_subdomain(name):
        return None
    return namespace, name


def over_share(pinned_bytes: int, adding_bytes: int, capacity_bytes: int | None, share: float) -> bool:
    """Whether pinning ``adding_bytes`` more beside ``pinned_bytes`` takes a namespace past
    ``share`` (0..1) of a node's cache of ``capacity_bytes``. An unknown capacity, or a
    share of 1 or more, never refuses: the node's own space rules still apply."""
    if capacity_bytes is None or capacity_bytes <= 0 or share >= 1:
        return False
    return pinned_bytes + adding_bytes > share * capacity_bytes


__all__ = ["ACTING_FOR_HEADER", "NO_DATASET", "acting_for", "over_share", "parse_acting_for"]
