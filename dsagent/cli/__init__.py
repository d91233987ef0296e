"""``dsctl``: the operator and init-container command line.

Its entry point (:func:`main`) imports as little as a command needs: ``dsctl digest`` of a
local path runs without click (:mod:`dsagent.cli.digesting`); everything else goes to the
click group (:mod:`dsagent.cli.group`), whose commands live one group per module and are
imported on first use. Both ways share one error edge (:mod:`dsagent.cli.edge`): every
deliberate error of the platform's packages (a :class:`dsplatform.errors.PlatformError`)
becomes one clear line on stderr and its exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from dsagent.cli.edge import quick_edge

#: ``DSAGENT_*`` variables an init-container's or an operator's ``dsctl`` usually sees (dsctl's
#: own and the pod contract the webhook writes); with only these set, start-up skips reading
#: the platform's whole list (it costs pydantic's import, which ``dsctl digest`` never pays). A test holds this a subset of :func:`dsagent.cluster.envnames.known_names`.
COMMON_VARIABLES = frozenset(
    {
        "DSAGENT_DATASETS", "DSAGENT_BUNDLES", "DSAGENT_TASK_ID", "DSAGENT_SOCKET", "DSAGENT_AGENT",
        "DSAGENT_ADMIN_TOKEN", "DSAGENT_ROOT", "DSAGENT_DIGEST_CACHE", "DSAGENT_STATUS_FILE", "DSAGENT_DATASETS_DIR",
    }
)  # fmt: skip


def refuse_unknown_environment(environ: Mapping[str, str]) -> None:
    """A misspelt ``DSAGENT_*`` variable (``DSAGENT_SOKET``) stops ``dsctl`` with one line
    naming it and its close matches (exit 2), as it stops the agent, instead of being
    silently ignored; the list is every variable some part of the platform reads."""
    odd = [n for n in environ if n.startswith("DSAGENT_") and n not in COMMON_VARIABLES]
    if not odd or all(n.startswith("DSAGENT_STORAGE_OPTIONS_") for n in odd):
        return
    from dsagent.cluster.envnames import refuse_unknown

    refuse_unknown(environ)


def main(argv: list[str] | None = None) -> None:
    """Console entry point of ``dsctl``.

    ``dsctl digest`` of a local path is run without importing click
    (:func:`dsagent.cli.digesting.quick_digest`); every other command line goes through
    the click group (:mod:`dsagent.cli.group`, error edge: :func:`dsagent.cli.group.run`).
    """
    from dsagent.cli.digesting import quick_digest

    with quick_edge("dsctl"):
        refuse_unknown_environment(os.environ)
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
