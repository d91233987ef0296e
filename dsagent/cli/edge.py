"""The error edge both ways into ``dsctl`` share, without click, and the native loops' switch.

Who calls it: :func:`dsagent.cli.group.run` (click's way in) and :func:`dsagent.cli.main`
around the quick way in (:mod:`dsagent.cli.digesting`); ``dsctl``, ``dsagent`` and the demo
for :func:`native_switch`. What it owns: what becomes of an error that is not a deliberate
one (:func:`unexpected`), the quick way's edge (:func:`quick_edge`): a deliberate error is
one line and its exit code (:func:`dsplatform.errors.exit_on_error`), Ctrl-C is 130; and
``DSAGENT_NATIVE`` read at the command line's edge (:func:`native_switch`), so that no
module below reads it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NoReturn

from dsplatform.errors import exit_on_error, exit_with
from dsplatform.flags import parse_flag

#: the switch of the native loops (docs/design-native.md#switch): unset, they run where they
#: are built; a false value (0, false, no, off) runs the pure-Python loops. The node agent's
#: settings declare it too (:attr:`dsagent.cache.settings.Settings.native`).
NATIVE_VARIABLE = "DSAGENT_NATIVE"


def native_switch(environ: Mapping[str, str]) -> None:
    """Switch the native loops off for this process when ``DSAGENT_NATIVE`` says so
    (:func:`dsagent.format.native.use_native`); a value that is not a boolean is a
    :class:`~dsagent.errors.SettingsError` (one line, exit 2). Unset: nothing is imported."""
    value = environ.get(NATIVE_VARIABLE)
    if value is None:
        return
    try:
        enabled = parse_flag(value)
    except ValueError as exc:
        from dsagent.errors import SettingsError

        raise SettingsError(f"{NATIVE_VARIABLE}={value!r}: {exc}") from None
    if not enabled:
        from dsagent.format import native

        native.use_native(False, why_off=f"{NATIVE_VARIABLE}={value}")


def stream_heap(environ: Mapping[str, str]) -> None:
    """glibc's malloc set for 1 MiB stream chunks (:func:`dsplatform.heap.keep_stream_chunks`),
    through the native extension where it is loaded (no ctypes)."""
    from dsagent.format import native  # loaded by every command that streams bundles
    from dsplatform.heap import keep_stream_chunks

    calls = native.system_calls()
    keep_stream_chunks(environ, calls.mallopt if calls is not None else None)


def unexpected(exc: Exception, prog: str) -> NoReturn:
    """A storage library's error as the platform error it means; anything else is a bug:
    one line asking for ``DSCTL_DEBUG=1`` (which re-raises it, traceback and all)."""
    from dsagent.format.storage_errors import classify

    known = classify(exc, "storage")
    if known is not None:
        exit_with(known, prog)
    if os.environ.get("DSCTL_DEBUG"):
        raise exc
    print(
        f"{prog}: error: internal error: {type(exc).__name__}: {exc}"
        " (a bug: rerun with DSCTL_DEBUG=1 for the traceback and report it)",
        file=sys.stderr,
    )
    sys.exit(1)


@contextmanager
def quick_edge(prog: str) -> Iterator[None]:
    """The edge of a command run without click: as :func:`dsagent.cli.group.run`'s."""
    try:
        with exit_on_error(prog):
            yield
    except KeyboardInterrupt:
        print("Aborted.", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # not a deliberate error: a storage library's, or a bug
        unexpected(exc, prog)


__all__ = ["NATIVE_VARIABLE", "native_switch", "quick_edge", "unexpected"]
