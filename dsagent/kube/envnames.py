"""The check that stops a ``DSAGENT_*`` process on a variable it does not read.

Who calls it: the start-up of ``dsagent serve``, the webhook and the Dataset controller, each
with its own settings classes (:func:`refuse_unknown`), so that ``DSAGENT_CAPACTIY=100Gi``
stops the process with one line naming ``DSAGENT_CAPACITY`` instead of being ignored; and
``dsctl``, which passes every process's classes, since an operator's shell in any of their
pods holds that process's variables.
What it owns: the names every process accepts beside its own settings' fields, because the
webhook gives them to every container of a pod it wires (the pod contract,
:mod:`dsagent.kube.podenv`, :mod:`dsagent.webhook.csiwiring`) and ``dsctl`` reads them
(:data:`POD_AND_DSCTL_NAMES`), with the per-dataset ``DSAGENT_STORAGE_OPTIONS_<NAME>``
accepted by prefix. Each process's own names are read from its pydantic-settings classes
(:mod:`dsplatform.settings`), never written out here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from dsagent.errors import SettingsError
from dsagent.kube.podenv import OPTIONS_PREFIX, REQUEST_VARIABLES
from dsplatform.settings import EnvSettings, UnknownSettings
from dsplatform.settings import refuse_unknown as _refuse

PREFIX = "DSAGENT_"

#: the pod contract the webhook writes (read by dsctl in the init-container and by the
#: cluster agent from the pod spec) and the variables only dsctl reads
POD_AND_DSCTL_NAMES = frozenset(
    {
        *REQUEST_VARIABLES,
        OPTIONS_PREFIX,
        "DSAGENT_TASK_ID",
        "DSAGENT_DATASETS_DIR",
        "DSAGENT_STATUS_FILE",
        "DSAGENT_AGENT",
        "DSAGENT_DIGEST_CACHE",
        "DSAGENT_NATIVE",  # the native loops' switch: dsctl's edge reads it, and the agent's settings
    }
)


def known_names(settings: Iterable[type[EnvSettings]]) -> frozenset[str]:
    """The names a process with these settings classes reads, and the pod contract's."""
    names = set(POD_AND_DSCTL_NAMES)
    for cls in settings:
        names |= cls.env_names()
    return frozenset(names)


def known_prefixes() -> tuple[str, ...]:
    """Families of names: one dataset's storage options, ``DSAGENT_STORAGE_OPTIONS_<NAME>``."""
    return (OPTIONS_PREFIX + "_",)


def refuse_unknown(settings: Iterable[type[EnvSettings]], environ: Mapping[str, str] | None = None) -> None:
    """SettingsError (exit 2, one line) naming each ``DSAGENT_*`` variable that none of
    ``settings`` reads, and its close matches."""
    try:
        _refuse(
            os.environ if environ is None else environ, PREFIX, known_names(settings), known_prefixes=known_prefixes()
        )
    except UnknownSettings as exc:
        raise SettingsError(exc.message, hint=exc.hint) from None


__all__ = ["POD_AND_DSCTL_NAMES", "known_names", "known_prefixes", "refuse_unknown"]
