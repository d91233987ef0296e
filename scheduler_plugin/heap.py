"""Keeps CPython's cyclic garbage collector off the extender's request path.

The extender holds hundreds of thousands of long-lived objects (the parsed facts of
thousands of nodes, the kubernetes client). A full collection traverses all of them:
about 250 ms at 5,000 nodes, which lands on whichever request is running, i.e. on p99.
None of these objects needs the collector (parsed facts hold no reference cycles and
are freed by reference counting when replaced), so after each bulk load (the watch
cache's list, a request that read many nodes for the first time) :meth:`Heap.settle`
collects once and moves every surviving object to the permanent generation
(``gc.freeze()``): later collections only traverse what was allocated since.

Only the served process settles (``python -m scheduler_plugin`` creates the app with
``settle_heap=True``): freezing a test runner's heap would change its collector for
every other test. Called by :mod:`scheduler_plugin.app` and
:class:`scheduler_plugin.nodecache.NodeCache`.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

log = logging.getLogger(__name__)

BULK_READS = 1_000  # node objects read since the last settle that make a request a bulk load


class Heap:
    """Settles the heap after bulk loads; a no-op when ``enabled`` is false."""

    def __init__(self, enabled: bool, *, bulk_reads: int = BULK_READS) -> None:
        self.enabled = enabled
        self.bulk_reads = bulk_reads
        self.settled = 0  # how many times the heap was settled
        self._baseline = 0
        self._lock = threading.Lock()

    def settle(self) -> None:
        """Collect once, then freeze everything that survived."""
        if not self.enabled:
            return
        with self._lock:
            started = time.perf_counter()
            gc.collect()
            gc.freeze()
            self.settled += 1
        log.info(
            "heap settled: %d objects frozen in %.0f ms", gc.get_freeze_count(), (time.perf_counter() - started) * 1e3
        )

    def after_reads(self, reads: int) -> None:
        """Settle when ``reads`` (a running count of node objects read) grew by a bulk
        load since the last settle."""
        if self.enabled and reads - self._baseline >= self.bulk_reads:
            self._baseline = reads
            self.settle()


__all__ = ["BULK_READS", "Heap"]
