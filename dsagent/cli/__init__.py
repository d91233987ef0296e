"""``dsctl``: the operator and init-container command line.

Its entry point (:func:`main`) imports as little as a command needs: ``dsctl digest`` of a
local path runs without click (:mod:`dsagent.cli.digesting`); everything else goes to the
click group (:mod:`dsagent.cli.group`), whose commands live one group per module and are
imported on first use. Both ways share one error edge (:mod:`dsagent.cli.edge`): every
deliberate error of the platform's packages (a :class:`dsplatform.errors.PlatformError`)
becomes one clear line on stderr and its exit code.
"""

from __future__ import annotations

import sys
from typing import Any

from dsagent.cli.edge import quick_edge


def main(argv: list[str] | None = None) -> None:
    """Console entry point of ``dsctl``.

    ``dsctl digest`` of a local path is run without importing click
    (:func:`dsagent.cli.digesting.quick_digest`); every other command line goes through
    the click group (:mod:`dsagent.cli.group`, error edge: :func:`dsagent.cli.group.run`).
    """
    from dsagent.cli.digesting import quick_digest

    with quick_edge("dsctl"):
        if quick_digest(sys.argv[1:] if argv is None else argv):
            return
    from dsagent.cli.group import cli, run

    run(cli, argv, "dsctl")


def __getattr__(name: str) -> Any:
    """``cli``, ``run``, ``COMMANDS`` and ``LazyGroup`` live in :mod:`dsagent.cli.group`
    (imported on first use: it imports click)."""
    if name in ("cli", "run", "COMMANDS", "LazyGroup"):
        from dsagent.cli import group

        return getattr(group, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
