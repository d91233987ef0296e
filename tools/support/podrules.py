"""The API server's rules for changing a Pod's spec, as the fake API server enforces them on
the clients' PUT and PATCH of a pod (not on the test hooks, which stand in for kubelet and the
scheduler).

From Kubernetes' pod update validation (``ValidatePodUpdate``, with the mutable scheduling
directives of a gated pod, GA since 1.30):

- ``spec.schedulingGates``: gates can only be removed after creation, never added;
- while the pod is gated (its old spec has gates): ``spec.nodeSelector`` may gain keys but not
  change or lose any; the required node affinity may be set when it has none, and otherwise
  keeps its terms (no term added or removed), each term's existing ``matchExpressions`` and
  ``matchFields`` unchanged and first, new requirements only appended; the preferred node
  affinity may change freely;
- everything else in the spec is immutable here but the containers' and init containers'
  ``image``, ``activeDeadlineSeconds`` and new ``tolerations`` (in-place resize is another
  subresource): resource requests in particular.

Who calls it: :meth:`tools.support.fake_apiserver.FakeApiServer._handle`. A refusal is a 422
``Invalid`` Status naming the field, as the real server answers.
"""

from __future__ import annotations

import copy
from typing import Any

JSON = dict[str, Any]
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


class PodUpdateRefused(Exception):
    """The change breaks a pod update rule; ``message`` says which, as the API server does."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_pod_update(old: JSON, new: JSON) -> None:
    """Raise :class:`PodUpdateRefused` when ``new``'s spec is not a change the API server allows
    from ``old``'s (the module docstring)."""
    before, after = copy.deepcopy(old.get("spec") or {}), copy.deepcopy(new.get("spec") or {})
    name = (old.get("metadata") or {}).get("name", "")
    old_gates = [g.get("name") for g in before.pop("schedulingGates", None) or []]
    new_gates = [g.get("name") for g in after.pop("schedulingGates", None) or []]
    added = [g for g in new_gates if g not in old_gates]
    if added:
        raise PodUpdateRefused(
            f'Pod "{name}" is invalid: spec.schedulingGates: Forbidden: only deletion is allowed, '
            f"but found new scheduling gate '{added[0]}'"
        )
    if old_gates:
        _narrowed_selector(before, after, name)
        _narrowed_affinity(before, after, name)
    for key in ("containers", "initContainers"):
        for a, b in zip(before.get(key) or [], after.get(key) or []):
            if isinstance(a, dict) and isinstance(b, dict):
                b["image"] = a.get("image")
    after["activeDeadlineSeconds"] = before.get("activeDeadlineSeconds")
    old_tolerations = before.get("tolerations") or []
    new_tolerations = after.get("tolerations") or []
    if new_tolerations[: len(old_tolerations)] == old_tolerations:
        after["tolerations"] = before.get("tolerations")
    if _clean(before) != _clean(after):
        raise PodUpdateRefused(
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other than '
            "`spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
            "`spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds` "
            "(allow it to be set to 1 if it was previously negative)"
        )


def _clean(spec: JSON) -> JSON:
    return {k: v for k, v in spec.items() if v is not None}


def _narrowed_selector(before: JSON, after: JSON, name: str) -> None:
    old, new = before.get("nodeSelector") or {}, after.get("nodeSelector") or {}
    for key, value in old.items():
        if new.get(key) != value:
            raise PodUpdateRefused(
                f'Pod "{name}" is invalid: spec.nodeSelector: Invalid value: only additions to '
                "spec.nodeSelector are allowed (no mutations or deletions)"
            )
    after["nodeSelector"] = before.get("nodeSelector")


def _narrowed_affinity(before: JSON, after: JSON, name: str) -> None:
    old_affinity, new_affinity = before.get("affinity") or {}, after.get("affinity") or {}
    old_node, new_node = old_affinity.get("nodeAffinity") or {}, new_affinity.get("nodeAffinity") or {}
    old_required, new_required = old_node.get(REQUIRED), new_node.get(REQUIRED)
    where = f'Pod "{name}" is invalid: spec.affinity.nodeAffinity.{REQUIRED}'
    if old_required is not None:
        if new_required is None:
            raise PodUpdateRefused(f"{where}: Invalid value: null: the field can't be unset")
        old_terms, new_terms = old_required.get("nodeSelectorTerms") or [], new_required.get("nodeSelectorTerms") or []
        if len(old_terms) != len(new_terms):
            raise PodUpdateRefused(f"{where}.nodeSelectorTerms: Invalid value: no additions/deletions are allowed")
        for i, (a, b) in enumerate(zip(old_terms, new_terms)):
            for kind in ("matchExpressions", "matchFields"):
                old_reqs, new_reqs = a.get(kind) or [], b.get(kind) or []
                if new_reqs[: len(old_reqs)] != old_reqs:
                    raise PodUpdateRefused(
                        f"{where}.nodeSelectorTerms[{i}].{kind}: Invalid value: only additions are allowed"
                    )
    # what may change while gated is checked: the rest of the affinity must not change
    rest_before = {k: v for k, v in old_affinity.items() if k != "nodeAffinity"}
    rest_after = {k: v for k, v in new_affinity.items() if k != "nodeAffinity"}
    if rest_before != rest_after:
        return  # left to the generic comparison, which refuses it
    after["affinity"] = before.get("affinity")


__all__ = ["PodUpdateRefused", "check_pod_update"]
