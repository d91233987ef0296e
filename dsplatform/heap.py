"""The process heap: the collector paused around a large parse, stream chunks' memory kept.

Who calls it: the parses that build hundreds of thousands of containers in one go: a
Kubernetes list (:func:`dsagent.kube.apiclient.loads_list`), a dataset's manifest
(:func:`dsagent.format.manifest.read_manifest_stream`) and the extender's request bodies
(:mod:`scheduler_plugin.app`: a third of a 5,000-node request's time went to collections);
and the whole of ``dsctl digest``, ``pack`` and ``unpack``, which make a few objects a file
and no cycles (left running, the collector took ~5% of the CPU of a 20,000-file digest,
0.2 s of a 2.1 s pack and 0.07 s of a 1.7 s unpack of 200,000 files).

What it owns: the one rule for doing so. Each container allocated counts towards the next
collection, so left running the collector walks the half-built document again and again,
full collections over the whole heap of a serving process among them, to find no garbage:
parsed JSON holds no reference cycle. Paused, it walks the new objects once when next due.
Measured on a manifest of 50,000 entries read beside a heap of 700,000 objects: 0.043 s
paused against 0.051-0.148 s running (the higher when a full collection fell inside the
parse).

The collector is process-wide: while one thread parses, the other threads' garbage
cycles wait for it too (a parse takes at most a fraction of a second). Its state is
restored after: where it was off (an embedding that turned it off), it stays off.

**Stream chunks and glibc's malloc** (:func:`keep_stream_chunks`, called once at the start
of ``dsctl`` and ``dsagent``). A bundle's stream moves through the process in chunks of
about 1 MiB, each a new ``bytes`` freed soon after (a decompressed chunk, a compressed
frame, a read of the store). glibc serves an allocation that size from ``mmap`` and, once
its dynamic threshold has risen, from a thread's heap, whose top it hands back to the
kernel whenever more than twice that threshold is free there. Either way the next chunk's
pages are faulted in and zeroed again: decompressing a 735 MB bundle took 52,000 page
faults and 0.45 s on the 2-core development machine; with the mmap threshold fixed at
4 MiB and the trim threshold at 8 MiB, 150 faults and 0.28 s (the whole ``dsctl unpack``
of it: 10,500 faults instead of 59,000). Where page faults are dear (a virtual machine's
first touch of a page) that is most of the gap between ``dsctl`` and the same work in a
warm process. The price: each malloc arena may keep up to 8 MiB free at its top rather
than returning it, so the arenas are capped at :data:`STREAM_ARENAS` (glibc makes up to 8
a core: on a 128-core node a long-running agent's threads could otherwise keep gigabytes
free), at most 128 MiB kept in all. What the operator set (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_ARENA_MAX``, ``GLIBC_TUNABLES``) is left as it is,
and on a C library without ``mallopt`` (musl) nothing changes.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

#: glibc's malloc.h: ``M_TRIM_THRESHOLD``, ``M_MMAP_THRESHOLD`` and ``M_ARENA_MAX``
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
#: allocations below this come from the heap, not from a mapping of their own
STREAM_MMAP_THRESHOLD = 4 << 20
#: free memory a heap's top may keep before it is handed back
STREAM_TRIM_THRESHOLD = 8 << 20
#: malloc arenas at most (threads share them past that): each may keep the trim threshold free
STREAM_ARENAS = 16
_OPERATOR_SET = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the ``with`` block, as it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def keep_stream_chunks(environ: Mapping[str, str], mallopt: Callable[[int, int], bool] | None = None) -> bool:
    """Fix glibc's mmap and trim thresholds for stream chunks, and cap its arenas (module
    docstring); True if set. ``mallopt``: glibc's, as a caller has it without ctypes (the
    native extension's, :func:`dsagent.format.native.system_calls`: loading ctypes is 2.7 ms
    of a ``dsctl`` start); else it is reached through ctypes.

    Nothing is set where the operator set any of them (their variables, or ``glibc.malloc``
    in ``GLIBC_TUNABLES``, read from the process's ``environ`` its edge passes), off Linux,
    or where the C library has no ``mallopt``."""
    if not sys.platform.startswith("linux"):
        return False
    if any(name in environ for name in _OPERATOR_SET) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return False
    if mallopt is None:
        mallopt = _ctypes_mallopt()
        if mallopt is None:
            return False
    # the mmap threshold before the trim threshold: fixing it stops glibc moving both on its own
    return all(
        mallopt(option, value)
        for option, value in (
            (_M_ARENA_MAX, STREAM_ARENAS),
            (_M_MMAP_THRESHOLD, STREAM_MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, STREAM_TRIM_THRESHOLD),
        )
    )


def _ctypes_mallopt() -> Callable[[int, int], bool] | None:
    import ctypes

    try:
        call = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int

    def mallopt(option: int, value: int) -> bool:
        return bool(call(option, value) == 1)

    return mallopt


__all__ = [
    "STREAM_ARENAS",
    "STREAM_MMAP_THRESHOLD",
    "STREAM_TRIM_THRESHOLD",
    "collector_paused",
    "keep_stream_chunks",
]
