"""Keeps CPython's cyclic garbage collector off what a Dataset controller pass has read.

A pass reads every Node, ``NodeCache``, Dataset and agent pod: at 5,000 nodes, hundreds of
thousands of containers that live for the whole pass. Left to itself the collector walks
them again and again while the pass runs (each young collection that meets them, then a
full collection over the whole heap, about a quarter of a pass's time), to find no garbage:
parsed JSON, and the indexes built from it, hold no reference cycle and are freed by
reference counting. So each pass (:class:`PassHeap`):

- :meth:`~PassHeap.reading`: the young generations are collected (what was made since the
  last pass), then the collector is paused while the pass lists and indexes the cluster
  (API reads and JSON only: nothing there makes a reference cycle);
- :meth:`~PassHeap.read`: everything alive is moved to the permanent generation
  (``gc.freeze()``) and the collector runs again: it walks only what the pass makes from
  then on, such as the garbage of the requests to the agents (an HTTP client makes
  reference cycles);
- :meth:`~PassHeap.settle`, when the pass ends, however it ends: the collector runs again if
  it was still paused, and the frozen objects return to the oldest generation
  (``gc.unfreeze()``), where a full collection can reach them again. Every ``full_every``
  passes it runs one (``gc.collect()``), so that an object that became cyclic garbage while
  frozen is freed within that many passes.

Who calls it: :meth:`dsagent.controller.reconcile.DatasetController.reconcile_all`. The
collector's state is restored as it was: where it was off (an embedding that turned it
off), it stays off.
"""

from __future__ import annotations

import gc

#: a full collection after this many passes (an object that became garbage while frozen is
#: freed within that many)
FULL_EVERY = 10


class PassHeap:
    """The collector around one controller's passes (see the module docstring)."""

    def __init__(self, *, full_every: int = FULL_EVERY) -> None:
        self.full_every = max(1, full_every)
        self.passes = 0  # passes settled since the last full collection
        self._paused = False  # the collector paused by :meth:`reading`, not yet resumed
        self._frozen = False  # :meth:`read` froze the heap, :meth:`settle` has not thawed it

    def reading(self) -> None:
        """The pass starts reading the cluster: young garbage collected, the collector paused."""
        if gc.isenabled():
            gc.collect(1)
            gc.disable()
            self._paused = True

    def read(self) -> None:
        """What the pass has read is frozen, and the collector runs again."""
        gc.freeze()
        self._frozen = True
        self._resume()

    def settle(self) -> None:
        """The pass ended (well or not): the collector running, nothing frozen; a full
        collection every ``full_every`` passes."""
        self._resume()
        if self._frozen:
            gc.unfreeze()
            self._frozen = False
        self.passes += 1
        if self.passes >= self.full_every and gc.isenabled():
            self.passes = 0
            gc.collect()

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            gc.enable()


__all__ = ["FULL_EVERY", "PassHeap"]
