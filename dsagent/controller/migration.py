"""Migration, step 5 of the deadline design (``DSAGENT_CONTROLLER_MIGRATE=on``, off by
default; docs/design.md#deadline-migration): each pass, the running jobs that opted in
(``dsagent.io/migratable: "true"``) and would end sooner on free GPUs elsewhere, their move
paid for, have their pods evicted through the Eviction API (PodDisruptionBudgets honoured)
for their controllers to re-create.

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile_all`, once per
pass of the leader. Here rather than in the extender because a move is decided once for the
cluster, by the leader, while every extender replica answers kube-scheduler. The nodes' facts
are read as the extender reads them; the policy and the evictions are the migrator's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsagent.controller.agents import JSON
from dsplatform.gpus import CLASS_STEM


class Migration:
    """The migrator with its node reader, made once (on the first pass)."""

    def __init__(self, api_client: Any, *, gpu_resource: str, class_prefix: str, clock: Callable[[], float]) -> None:
        self.api_client, self.gpu_resource, self.class_prefix, self.clock = (
            api_client,
            gpu_resource,
            class_prefix,
            clock,
        )
        self._node_reader: Any = None

    def run(self, nodes: list[JSON], pods: list[JSON]) -> list[Any]:
        """The moves made this pass."""
        from scheduler_plugin.migrator import Migrator, MigratorSettings, node_facts
        from scheduler_plugin.nodeinfo import NodeReader

        resources = MigratorSettings(gpu_resource=self.gpu_resource, class_prefix=f"{self.class_prefix}/{CLASS_STEM}")
        if self._node_reader is None:
            self._node_reader = NodeReader(gpu_resource=resources.gpu_resource, roce_prefix=resources.class_prefix)
        facts = node_facts(nodes, pods, self._node_reader)
        return Migrator(self.api_client, lambda: facts, clock=self.clock, settings=resources).run_once()


__all__ = ["Migration"]
