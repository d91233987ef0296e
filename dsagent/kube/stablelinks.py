"""Stable paths for a pod's datasets: ``$DSAGENT_DATASETS_DIR/<name>`` -> its exact version.

The node's cache is mounted read-only into pods at ``/datasets``, where a dataset lives at
``/datasets/<name>/<digest>/``; the digest is the version the pod's task is bound to and
is not known when the pod is written. After ``dsctl cache --from-env`` returns, the
webhook's cache container runs ``python -m dsagent.cli.links LINK_DIR DATASETS_MOUNT``:
it asks the agent for the task (``DSAGENT_TASK_ID``, over ``DSAGENT_SOCKET``) and makes
``LINK_DIR/<name>`` a symlink to ``DATASETS_MOUNT/<name>/<digest>`` in a shared
``emptyDir``, so training code reads ``$DSAGENT_DATASETS_DIR/imagenet/...``.

Each link is created beside its final name and renamed into place (atomic). Who calls it:
:mod:`dsagent.cli.links`, the command the cache container (init-container or sidecar) the
webhook injects runs; this module is pure path logic and never talks to the agent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsagent.errors import InvalidInput

_HEX = set("0123456789abcdef")


def link_targets(record: Mapping[str, Any], datasets_mount: str) -> dict[str, str]:
    """name -> the path of the version the task is bound to, as the pod sees it."""
    if record.get("state") != "ready":
        raise InvalidInput(f"task {record.get('task')} is {record.get('state')}, not ready: nothing to link yet")
    targets = {}
    for dataset in record.get("datasets") or []:
        name, digest = dataset.get("name"), dataset.get("digest")
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise InvalidInput(f"the agent returned an unusable dataset name {name!r}")
        if not isinstance(digest, str) or len(digest) != 32 or not set(digest) <= _HEX:
            raise InvalidInput(f"the agent returned no digest for dataset {name!r}")
        targets[name] = os.path.join(datasets_mount, name, digest)
    return targets


def write_links(link_dir: Path, targets: Mapping[str, str]) -> None:
    """Make ``link_dir/<name>`` point at each target, replacing older links atomically."""
    link_dir.mkdir(parents=True, exist_ok=True)
    for name, target in targets.items():
        staged = link_dir / f".{name}.tmp"
        staged.unlink(missing_ok=True)
        os.symlink(target, staged)
        os.replace(staged, link_dir / name)


__all__ = ["link_targets", "write_links"]
