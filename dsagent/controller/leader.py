"""One leader among the Dataset controller's replicas, by a ``coordination.k8s.io/v1`` Lease.

Who calls it: :class:`dsagent.controller.reconcile.DatasetController`, once per resync; only
the leader reconciles. The kubernetes client's own ``leaderelection`` package is not used:
its ``LeaseLock`` builds its API object from the process-global configuration (no
injectable ``ApiClient``, so no fake API server), reads the wall clock in naive local time,
and its loop blocks and sleeps; the rule here is the same (take the Lease when it is free,
ours, or not renewed within its duration; write with the resourceVersion read, so two
candidates never both win). The Lease's reading and writing are :mod:`dsagent.kube.lease`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from dsagent.errors import Conflict, DsagentError
from dsagent.kube.lease import Leases, expiry, new_lease, next_transitions
from dsplatform.kubetime import format_micro_time

log = logging.getLogger("dsagent.controller")


class LeaseElector:
    """One leader among the controller's replicas, by a ``coordination.k8s.io/v1`` Lease."""

    def __init__(
        self,
        api_client: Any,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration_s: int = 15,
        clock: Callable[[], float] = time.time,
        request_timeout: float | None = None,
    ) -> None:
        self.leases = Leases(api_client, request_timeout=request_timeout)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration_s, self.clock = duration_s, clock
        self.failed = False  # the last try could not reach the Lease (not: another replica leads)

    def try_acquire(self) -> bool:
        """Take or renew the Lease; True while this replica leads.

        A 409 on create or replace means another replica wrote first: it leads, so this
        one does not (it reads the Lease again at the next resync). Any other failure
        (RBAC, the API server unreachable) is logged, this replica does not lead, and
        :attr:`failed` says so (the loop backs off)."""
        self.failed = False
        now = self.clock()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "renewTime": format_micro_time(now),
        }
        try:
            current = self.leases.read(self.namespace, self.name)
            if current is None:
                metadata = {"name": self.name, "namespace": self.namespace}
                self.leases.create(
                    self.namespace,
                    new_lease(metadata, {**spec, "acquireTime": format_micro_time(now), "leaseTransitions": 0}),
                )
                return True
            held = current.get("spec") or {}
            holder = held.get("holderIdentity")
            until = expiry(held, self.duration_s)
            if holder not in (None, "", self.identity) and until is not None and until > now:
                return False  # someone else leads and is alive
            new_spec = dict(held, **spec)
            if holder != self.identity:
                new_spec["acquireTime"] = format_micro_time(now)
                new_spec["leaseTransitions"] = next_transitions(held)
            current["spec"] = new_spec  # metadata.resourceVersion stays: a concurrent writer gets 409
            self.leases.replace(self.namespace, current)
        except Conflict:
            log.debug("Lease %s/%s: another replica wrote first", self.namespace, self.name)
            return False
        except DsagentError as exc:
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            self.failed = True
            return False
        return True


__all__ = ["LeaseElector"]
