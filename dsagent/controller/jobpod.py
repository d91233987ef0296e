"""The pod of every Job the Dataset controller starts (pack Jobs, store gc Jobs).

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController._job` (``dsctl pack``)
and :func:`dsagent.controller.storegc.gc_job` (``dsctl gc``). One rule for both: the chart's
image running ``dsctl`` as uid 65532, no privilege escalation, a read-only root with an
``emptyDir`` at ``/tmp`` (``HOME`` there), Pod Security ``restricted``, and the pack service
account (the one with the store's credentials) when one is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def job_pod(container: str, image: str, args: Sequence[str], service_account: str | None) -> dict[str, Any]:
    """A Job's pod spec running ``dsctl <args>`` (the caller puts hostile values after ``--``)."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": container,
                "image": image,
                "command": ["dsctl"],
                "args": list(args),
                "env": [{"name": "HOME", "value": "/tmp"}],
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if service_account:
        pod["serviceAccountName"] = service_account
    return pod


__all__ = ["job_pod"]
