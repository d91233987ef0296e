"""Every pod of the cluster as a Dataset controller pass reads it: at most once a pass, from
the pods' watch once it has listed them, else listed then.

Who calls it: :class:`dsagent.controller.reconcile.DatasetController`, for what reads every
pod (replicated and striped Datasets, next-job preparation of every pod, migration, the
plan loop, the agents found among them, the nodes' free GPUs where no count is published).
A pass that needs none of them reads none.

The watch (:class:`dsagent.kube.podswatch.PodsWatch`, ``DSAGENT_CONTROLLER_WATCH_PODS``) is
started by the first pass that reads every pod, where the process allows it
(:attr:`PassPods.start_watch`), and that pass waits for its first list (at most a
request's bound); a pass while the watch is not synced lists them
(``dsplatform_controller_pod_reads_total{source}`` says which). Either way a pass
holds each pod as the watch keeps it (:func:`dsagent.kube.podswatch.slim`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dsagent.controller import agents, podfacts
from dsagent.kube.podswatch import PodsWatch, slim

JSON = dict[str, Any]


class PassPods:
    """The pods one pass reads (module docstring); :meth:`next_pass` forgets them."""

    def __init__(
        self, core: Any, timeout: float | None, watch: PodsWatch | None, reads: Callable[[str], object]
    ) -> None:
        self._core, self._timeout, self.watch, self._reads = core, timeout, watch, reads
        # the process lets the first pass that reads every pod start :attr:`watch`; a test's
        # controller lists them unless it starts the watch itself
        self.start_watch = False
        self._now: list[JSON] | None = None
        self._by_dataset: dict[tuple[str, str], list[Mapping[str, Any]]] | None = None

    def next_pass(self) -> None:
        self._now = self._by_dataset = None

    @property
    def listed(self) -> list[JSON] | None:
        """The pods this pass has read already, None when it has not."""
        return self._now

    def all(self) -> list[JSON]:
        """Every pod: the watch's (started now, the first time, where allowed), else listed now."""
        if self._now is None:
            watch = self.watch
            if watch is not None and self.start_watch and not watch.started:
                watch.start()
                # its list, in pages slimmed one by one, rather than the whole list as sent
                # (what a process keeps of its largest moment): a request's bound at most
                watch.wait_synced(self._timeout if self._timeout is not None else 30.0)
            if watch is not None and watch.synced:
                self._reads("watch")
                self._now = watch.pods()
            else:
                self._reads("list")
                # kept as the watch keeps them: the list as sent goes once slimmed
                self._now = [slim(pod) for pod in agents.every_pod(self._core, self._timeout)]
        return self._now

    def each(self) -> Iterator[JSON]:
        """Every pod (:meth:`all`), read when the first one is asked for."""
        yield from self.all()

    def by_dataset(self) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
        """The pods by the Datasets they name, at most once a pass (:func:`podfacts.pods_by_dataset`)."""
        if self._by_dataset is None:
            self._by_dataset = podfacts.pods_by_dataset(self.all())
        return self._by_dataset


__all__ = ["PassPods"]
