"""Every ``DSAGENT_*`` variable some part of the platform reads: what start-up refuses others by.

Who calls it: the start-up of ``dsagent serve``, the webhook and the Dataset controller
(:func:`refuse_unknown`), so that ``DSAGENT_CAPACTIY=100Gi`` stops the process with one
line naming ``DSAGENT_CAPACITY`` instead of being ignored.
What it owns: the union of the names, one set for every ``DSAGENT_*`` process, because the
chart and the webhook give processes variables meant for another reader in the same pod
(the agent's token for ``dsctl``, the pod contract for the init-container):

- the fields of the pydantic-settings classes, every process's one settings mechanism
  (:mod:`dsplatform.settings`): :class:`dsagent.cache.settings.Settings` and
  :class:`dsagent.cluster.clustersettings.ClusterSettings` (:data:`CLUSTER_NAMES`), read from the
  classes themselves; the webhook's (``WebhookSettings``, ``GpuClassSettings``:
  :data:`WEBHOOK_NAMES`) and the controller's (``ControllerSettings``: :data:`CONTROLLER_NAMES`)
  as written-out lists, because those classes live beside their process's ``main``, which
  imports this module (deriving them would be an import cycle); a test checks the lists
  equal the classes' fields;
- the pod contract (:mod:`dsagent.cluster.podenv`, :mod:`dsagent.webhook.csiwiring`)
  and ``dsctl``'s own variables (:data:`POD_AND_DSCTL_NAMES`), with the per-dataset
  ``DSAGENT_STORAGE_OPTIONS_<NAME>`` accepted by prefix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dsagent.cluster.clustersettings import ClusterSettings
from dsagent.cluster.podenv import OPTIONS_PREFIX, REQUEST_VARIABLES
from dsagent.errors import SettingsError
from dsplatform.settings import UnknownSettings
from dsplatform.settings import refuse_unknown as _refuse

PREFIX = "DSAGENT_"

#: the fields of :class:`dsagent.cluster.clustersettings.ClusterSettings`
CLUSTER_NAMES = ClusterSettings.env_names()
#: the fields of :class:`dsagent.webhook.server.WebhookSettings` and its GPU classes'
#: (:class:`dsagent.webhook.gpurequest.GpuClassSettings`)
WEBHOOK_NAMES = frozenset(
    "DSAGENT_WEBHOOK_" + name
    for name in (
        "LISTEN", "CERT_FILE", "KEY_FILE", "INJECTION_FILE", "KUBECONFIG",
        "GPU_CLASSES", "JOB_LABELS", "JOB_TTL", "GPU_RESOURCE", "CLASS_PREFIX", "NETWORKS",
        "DEADLINE_PLANS", "PLAN_FORMULA",
    )
)  # fmt: skip
#: the ``DSAGENT_CONTROLLER_*`` fields of :class:`dsagent.controller.controllersettings.ControllerSettings`
#: (it also reads the agents' ``DSAGENT_ADMIN_TOKEN[_FILE]``, fields of the agent's settings)
CONTROLLER_NAMES = frozenset(
    "DSAGENT_CONTROLLER_" + name
    for name in (
        "NAMESPACE", "LEASE", "IDENTITY", "RESYNC", "PACK_IMAGE", "PACK_SERVICE_ACCOUNT", "AGENT_SELECTOR",
        "AGENT_PORT", "METRICS_PORT", "REPLICAS_WINDOW", "REPLICAS_MAX", "COPIES_CONFIGMAP",
        "PREPARE", "PREPARE_WINDOW", "PREPARE_FETCH_LEAD", "PREPARE_RESERVE_FRACTION", "PREPARE_FILL_FRACTION",
        "PREPARE_SUBTASKS_REMAINING",
        "STORE_GC", "STORE_GC_GRACE",
        "MIGRATE", "GPU_RESOURCE", "CLASS_PREFIX",
        "WARM_NODES_MAX", "NAMESPACE_SHARE", "NAMESPACE_BYTES", "NAMESPACE_TASKS", "INVENTORY_MAX_AGE", "API_TIMEOUT",
        "STRIPE_DRAIN_TIMEOUT",
    )
)  # fmt: skip
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
    }
)


def known_names() -> frozenset[str]:
    """Every ``DSAGENT_*`` name some part of the platform reads."""
    from dsagent.cache.settings import Settings

    return Settings.env_names() | CLUSTER_NAMES | WEBHOOK_NAMES | CONTROLLER_NAMES | POD_AND_DSCTL_NAMES


def known_prefixes() -> tuple[str, ...]:
    """Families of names: one dataset's storage options, ``DSAGENT_STORAGE_OPTIONS_<NAME>``."""
    return (OPTIONS_PREFIX + "_",)


def refuse_unknown(environ: Mapping[str, str] | None = None) -> None:
    """SettingsError (exit 2, one line) naming each unknown ``DSAGENT_*`` variable and its close matches."""
    try:
        _refuse(os.environ if environ is None else environ, PREFIX, known_names(), known_prefixes=known_prefixes())
    except UnknownSettings as exc:
        raise SettingsError(exc.message, hint=exc.hint) from None


__all__ = ["CLUSTER_NAMES", "CONTROLLER_NAMES", "POD_AND_DSCTL_NAMES", "WEBHOOK_NAMES", "known_names", "refuse_unknown"]
