"""The error edge both ways into ``dsctl`` share, without click.

Who calls it: :func:`dsagent.cli.group.run` (click's way in) and :func:`dsagent.cli.main`
around the quick way in (:mod:`dsagent.cli.digesting`). What it owns: what becomes of an
error that is not a deliberate one (:func:`unexpected`), and the quick way's edge
(:func:`quick_edge`): a deliberate error is one line and its exit code
(:func:`dsplatform.errors.exit_on_error`), Ctrl-C is 130.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from dsplatform.errors import exit_on_error, exit_with


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


__all__ = ["quick_edge", "unexpected"]
