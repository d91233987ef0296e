"""``dsctl``: the operator and init-container command line.

Its entry point (:func:`main`) imports as little as a command needs: ``dsctl digest`` of a
local path runs without click (:mod:`dsagent.cli.digesting`); everything else goes to the
click group (:mod:`dsagent.cli.group`), whose commands live one group per module and are
imported on first use. Both ways share one error edge (:mod:`dsagent.cli.edge`): every
deliberate error of the platform's packages (a :class:`dsplatform.errors.PlatformError`)
becomes one clear line on stderr and its exit code.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping
from gc import freeze  # not `import gc`: the package's gc command module would shadow it
from typing import Any

from dsagent.cli.edge import native_switch, quick_edge, stream_heap

#: dsctl's own ``DSAGENT_*`` variables and the pod contract the webhook writes: the names a
#: misspelling is measured against (:func:`refuse_unknown_environment`). A test holds this a
#: subset of the names every process reads (:func:`platform_settings`).
COMMON_VARIABLES = frozenset(
    {
        "DSAGENT_DATASETS", "DSAGENT_BUNDLES", "DSAGENT_TASK_ID", "DSAGENT_SOCKET", "DSAGENT_AGENT",
        "DSAGENT_ADMIN_TOKEN", "DSAGENT_ROOT", "DSAGENT_DIGEST_CACHE", "DSAGENT_STATUS_FILE", "DSAGENT_DATASETS_DIR",
        "DSAGENT_NATIVE",
    }
)  # fmt: skip


def refuse_unknown_environment(environ: Mapping[str, str]) -> None:
    """A misspelling of one of dsctl's own variables (``DSAGENT_SOKET``) stops ``dsctl`` with
    one line naming it and its close matches (exit 2), as the agent stops on its own, instead
    of being silently ignored. Other ``DSAGENT_*`` variables are the agent's settings (an
    operator's shell in the agent's pod has them all) and the agent's to check; a name close
    to one of dsctl's is checked against every name the platform reads (``DSAGENT_CSI_SOCKET``
    is the agent's, not a typo), which costs pydantic's import only then."""
    others = [
        name
        for name in environ
        if name.startswith("DSAGENT_") and name not in COMMON_VARIABLES
        and not name.startswith("DSAGENT_STORAGE_OPTIONS_")
    ]  # fmt: skip
    if not others:
        return
    import difflib  # only where there is a name to measure

    suspects = [name for name in others if difflib.get_close_matches(name, COMMON_VARIABLES, n=1, cutoff=0.8)]
    if not suspects:
        return
    from dsagent.kube.envnames import refuse_unknown

    refuse_unknown(platform_settings(), {name: environ[name] for name in suspects})


def platform_settings() -> tuple[Any, ...]:
    """Every ``DSAGENT_*`` process's settings classes: the names an operator's shell in any
    of their pods may hold (each process declares its own as ``SETTINGS``)."""
    from dsagent.controller.controllersettings import SETTINGS as CONTROLLER
    from dsagent.nodeagent.nodeparts import SETTINGS as AGENT
    from dsagent.webhook.server import SETTINGS as WEBHOOK

    return (*AGENT, *CONTROLLER, *WEBHOOK)


def main(argv: list[str] | None = None) -> None:
    """Console entry point of ``dsctl``.

    ``dsctl digest`` of a local path is run without importing click
    (:func:`dsagent.cli.digesting.quick_digest`); every other command line goes through
    the click group (:mod:`dsagent.cli.group`, error edge: :func:`dsagent.cli.group.run`).
    """
    from dsagent.cli.digesting import quick_digest

    # At exit, the interpreter's last collection would walk every object still alive to
    # free what nothing points to any more: 10 ms of a one-file pack, for a process whose
    # files are already written and closed. Frozen objects are left out of it; the
    # unregister keeps one registration however often main runs in one process.
    atexit.unregister(freeze)
    atexit.register(freeze)
    with quick_edge("dsctl"):
        refuse_unknown_environment(os.environ)
        native_switch(os.environ)
        args = sys.argv[1:] if argv is None else argv
        if quick_digest(args):
            return
        stream_heap(os.environ)  # pack, unpack and cache stream bundles in 1 MiB chunks (dsplatform.heap)
        from dsagent.cli.bundlework import quick_bundles

        if quick_bundles(args):
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
