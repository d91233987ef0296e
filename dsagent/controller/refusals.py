"""The ``Refused`` condition of a Dataset: which tenancy bound held it this pass
(docs/operator-guide/tenancy.md).

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile`, with the
refusals the pass's ledger made (:class:`dsagent.controller.quotas.Refusal`); each refusal
is also a Warning Event on the Dataset, through the controller's recorder.
"""

from __future__ import annotations

from typing import Any

from dsagent.controller.quotas import Refusal
from dsagent.kube.datasets import GROUP, VERSION
from dsagent.kube.events import EventRecorder, ObjectRef

JSON = dict[str, Any]
REFUSED = "Refused"  # the Dataset condition a tenancy bound sets (docs/operator-guide/tenancy.md)


def refused_condition(
    ds: JSON, status: JSON, refusals: list[Refusal], now: str, events: EventRecorder
) -> list[JSON] | None:
    """``status.conditions`` with ``Refused`` as this pass found it (None: no refusal now and
    none before, nothing to write); each refusal is also a Warning Event. ``now``: the pass's
    time, the condition's ``lastTransitionTime`` where its status flips."""
    previous = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    before = next((c for c in previous if c.get("type") == REFUSED), None)
    if not refusals and before is None:
        return None
    regarding = ObjectRef.of({**ds, "apiVersion": f"{GROUP}/{VERSION}", "kind": "Dataset"})
    for refusal in refusals:
        events.record(regarding, type="Warning", reason=refusal.reason, action="Reconcile", note=refusal.message)
    if refusals:
        current: JSON = {
            "type": REFUSED,
            "status": "True",
            "reason": refusals[0].reason,
            "message": "; ".join(r.message for r in refusals)[:4096],
        }
    else:
        current = {"type": REFUSED, "status": "False", "reason": "WithinLimits", "message": "every bound holds"}
    if before is not None and all(before.get(k) == v for k, v in current.items()):
        return previous
    flipped = before is None or before.get("status") != current["status"]
    current["lastTransitionTime"] = now if flipped or before is None else str(before.get("lastTransitionTime"))
    generation = (ds.get("metadata") or {}).get("generation")
    if isinstance(generation, int):
        current["observedGeneration"] = generation
    return [c for c in previous if c.get("type") != REFUSED] + [current]


__all__ = ["REFUSED", "refused_condition"]
