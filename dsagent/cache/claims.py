"""Claims: the versions tasks have asked for but are not yet bound to in the catalog.

Who calls it: :mod:`dsagent.cache.service` (a task's request claims its dataset; the bind ends
the claim), :mod:`dsagent.cache.versions` (a per-file copy settles the claims of every task
waiting on it *before* it marks the version ready) and :mod:`dsagent.cache.space` (claimed
versions are in use: never evicted, and checked again right before each deletion).

Why: a version is protected from eviction from the moment a task asks for it until the
task is released. Once the task is bound, the catalog's binding (with its lease) protects
it; before that, only this in-memory record can: a consistency check or a per-file copy
learns the digest, and for a copy the version is already ready, some time before the
task's bind commits. Claims live in memory only: after a restart, tasks are either bound
in the catalog or resolve again (and claim again).
"""

from __future__ import annotations

from dsagent.cache.layout import Key


class Claims:
    """``(task, name) -> (identity, digest or None)``, for tasks not yet bound."""

    def __init__(self) -> None:
        self._by_task: dict[tuple[str, str], tuple[tuple[str, str, str | None], str | None]] = {}

    def ask(self, task_id: str, identity: tuple[str, str, str | None]) -> None:
        """The task asks for ``identity``; its digest is not known yet."""
        self._by_task[(task_id, identity[0])] = (identity, None)

    def settle(self, identity: tuple[str, str, str | None], digest: str) -> None:
        """Every task still resolving ``identity`` claims version ``digest``."""
        for key, (claimed, known) in self._by_task.items():
            if claimed == identity and known is None:
                self._by_task[key] = (identity, digest)

    def hold(self, task_id: str, identity: tuple[str, str, str | None], digest: str) -> None:
        self._by_task[(task_id, identity[0])] = (identity, digest)

    def drop(self, task_id: str, name: str) -> None:
        """The task is bound in the catalog (or released): the claim is no longer needed."""
        self._by_task.pop((task_id, name), None)

    def release(self, task_id: str) -> None:
        for key in [k for k in self._by_task if k[0] == task_id]:
            del self._by_task[key]

    def held(self) -> set[Key]:
        return {(identity[0], digest) for identity, digest in self._by_task.values() if digest is not None}

    def __contains__(self, key: object) -> bool:
        return key in self.held()


__all__ = ["Claims"]
