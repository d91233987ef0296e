"""The Node annotations (and the one label) an agent publishes, read by the extender, the webhook and the controller.

Who calls it: the agent's publisher (writes them), ``scheduling.nodeinfo`` (the
extender), the webhook's GPU class vote and the Dataset controller (read them). One name per
annotation, so a writer and its readers cannot drift apart (docs/design.md#annotations).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dsplatform.kubetime import parse_or_none

#: The datasets a node holds (JSON, the inventory schema).
INVENTORY = "dsagent.io/inventory"
#: The node's GPU topology and RoCE classes (JSON, the gpu_topology contract).
TOPOLOGY = "dsagent.io/topology"
#: The node's free GPU indices (``"0,1,4,5"``).
FREE_GPUS = "dsagent.io/free-gpus"
#: The namespaces of the node's running pods that name their follow-up job
#: (``dsagent.io/next-job``), sorted, comma-separated, at most :data:`FOLLOW_UPS_MAX`; absent:
#: none. The Dataset controller's default next-job preparation lists the pods of these
#: namespaces only (docs/design.md#next-job-preparation).
FOLLOW_UPS = "dsagent.io/follow-ups"
#: the most namespaces :data:`FOLLOW_UPS` names (a reader takes no more)
FOLLOW_UPS_MAX = 4
#: When the agent last published (RFC 3339, seconds): written with every change and at least
#: every heartbeat, so a reader can refuse an inventory older than its bound (docs/operator-guide/tenancy.md).
PUBLISHED_AT = "dsagent.io/published-at"
#: A Node label the agent writes (``true``/``false``): its device plugin serves this node's GPUs
#: (the class resources, and the plain GPU resource in NVIDIA's plugin's place). The chart's
#: ``agent.devicePlugin.nodeLabel`` may rename it; the webhook's class rewrite reads the same value.
DEVICE_PLUGIN_LABEL = "dsagent.io/device-plugin"


def stale(
    annotations: Mapping[str, Any],
    now: float,
    max_age: float,
    *,
    parse: Callable[[Any], float | None] = parse_or_none,
) -> bool:
    """Whether a Node's published annotations are older than ``max_age`` seconds by their
    :data:`PUBLISHED_AT` stamp (a stamp in the future by more than the bound counts as stale
    too: a clock that far off is not to be trusted). No stamp at all (an agent older than the
    stamp) is not stale: there is nothing to date it by. ``parse``: how the stamp is read
    (:func:`dsplatform.kubetime.parse_or_none`, or a reader that remembers what it read)."""
    raw = annotations.get(PUBLISHED_AT)
    if raw is None:
        return False
    stamp = parse(raw)
    return stamp is None or abs(now - stamp) > max_age


__all__ = [
    "DEVICE_PLUGIN_LABEL",
    "FOLLOW_UPS",
    "FOLLOW_UPS_MAX",
    "FREE_GPUS",
    "INVENTORY",
    "PUBLISHED_AT",
    "TOPOLOGY",
    "stale",
]
