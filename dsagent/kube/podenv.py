"""The environment contract between the webhook's init-container and ``dsctl cache --from-env``.

The webhook (:mod:`dsagent.webhook.mutation`) writes it into the pod; ``dsctl`` reads it in the
init-container; the cluster agent reads the same variables from the pod spec at bind time,
so that its request and the init-container's are one and the same task (docs/design.md#rule-1):

- ``DSAGENT_DATASETS``: a JSON list of ``{name, source, bundles?, storage_options?}``;
- ``DSAGENT_BUNDLES``: the bundle store for datasets that name none;
- ``DSAGENT_STORAGE_OPTIONS`` (all datasets) and ``DSAGENT_STORAGE_OPTIONS_<NAME>``: JSON
  fsspec options, typically from Secrets. Their values are never echoed in errors.

The cluster path allows the per-file copy (``allow_per_file``) for every dataset: a bundle
store without the dataset is copied file by file, as before, not refused with
``bundle_missing``. A Dataset's store may be packed later (``pack.auto``), and a pod must
not fail while the controller packs it; the agent logs the fallback. The webhook, the
cluster agent, the CSI driver and the controller's warm and prepare requests all ask the
same way, so the init-container's request and theirs stay one task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from dsagent.errors import InvalidInput

#: The container that runs ``dsctl cache --from-env`` with these variables (the webhook
#: adds it; the cluster agent finds a pod's request in it).
INIT_CONTAINER = "dsagent-cache"
#: The init-container that waits for the node's stripe shares (``dsctl stripe wait``): a pod
#: with it and without :data:`INIT_CONTAINER` reads only striped versions, and gets no task
STRIPE_WAIT_CONTAINER = "dsagent-stripe-wait"
#: The variables whose values shape the request (the storage options ones by prefix).
REQUEST_VARIABLES = ("DSAGENT_DATASETS", "DSAGENT_BUNDLES")
OPTIONS_PREFIX = "DSAGENT_STORAGE_OPTIONS"


def options_env_name(dataset: str) -> str:
    """``DSAGENT_STORAGE_OPTIONS_<NAME>``: one dataset's storage options."""
    return f"{OPTIONS_PREFIX}_" + re.sub(r"[^A-Za-z0-9]", "_", dataset).upper()


def datasets_from_env(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """The init-container's dataset list: ``DSAGENT_DATASETS`` plus storage options per dataset."""
    raw = environ.get("DSAGENT_DATASETS")
    if not raw:
        raise InvalidInput("DSAGENT_DATASETS is not set", hint="set it to a JSON list of {name, source, bundles?}")
    try:
        items = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"DSAGENT_DATASETS is not valid JSON: {exc.msg} at position {exc.pos}") from exc
    if not isinstance(items, list) or not all(isinstance(i, dict) and "name" in i and "source" in i for i in items):
        raise InvalidInput("DSAGENT_DATASETS must be a JSON list of objects with 'name' and 'source'")
    shared = _options_from_env(environ, OPTIONS_PREFIX)
    default_bundles = environ.get("DSAGENT_BUNDLES")
    datasets = []
    for item in items:
        dataset = {key: item[key] for key in ("name", "source", "bundles") if item.get(key)}
        if default_bundles and "bundles" not in dataset:
            dataset["bundles"] = default_bundles
        if "bundles" in dataset:
            dataset["allow_per_file"] = True  # the cluster path (see above)
        options = {
            **shared,
            **dict(item.get("storage_options") or {}),
            **_options_from_env(environ, options_env_name(str(item["name"]))),
        }
        if options:
            dataset["storage_options"] = options
        datasets.append(dataset)
    return datasets


def _options_from_env(environ: Mapping[str, str], var: str) -> dict[str, Any]:
    raw = environ.get(var)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:  # never echo the value: it usually holds credentials
        raise InvalidInput(f"{var} is not valid JSON (value not shown: it may hold credentials)") from exc
    if not isinstance(value, dict):
        raise InvalidInput(f"{var} must be a JSON object of storage options")
    return value


__all__ = [
    "INIT_CONTAINER",
    "OPTIONS_PREFIX",
    "STRIPE_WAIT_CONTAINER",
    "REQUEST_VARIABLES",
    "datasets_from_env",
    "options_env_name",
]
