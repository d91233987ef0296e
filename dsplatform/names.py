"""Dataset names and digests: the one rule, for pack, the agent, the kube code, the CLI and the extender.

A dataset name becomes a directory in bundle stores and in every node's cache, a key in
the node inventory annotation and part of the Dataset resource's spec, so it is held to the
strictest of those places: 1-128 characters from ``A-Z a-z 0-9 . _ -``, starting with a
letter or digit (so never ``.``, ``..`` or a hidden name). A digest is xxh3-128 as 32
lowercase hex characters (``docs/design.md#manifests-and-digests``).

A task id names what holds datasets on a node (a pod's UID, a job id). Its one form is
lower case: ids that differ only in case name the same task, because the permission check
(a pod acts on its own UID only) and the records must agree on which task an id is; without
one form a pod could hold several tasks under case variants of its UID.
"""

from __future__ import annotations

import re

NAME_MAX_LENGTH = 128
DIGEST_LENGTH = 32
NAME_HINT = f"use 1-{NAME_MAX_LENGTH} letters, digits, '.', '_' or '-', starting with a letter or digit"
DIGEST_HINT = f"a digest is {DIGEST_LENGTH} lowercase hex characters"

_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX_LENGTH - 1}}}")
_DIGEST = re.compile(rf"[0-9a-f]{{{DIGEST_LENGTH}}}")
TASK_ID_MAX_LENGTH = 253
TASK_ID_HINT = (
    f"use 1-{TASK_ID_MAX_LENGTH} letters, digits, '.', '_', ':' or '-', e.g. a pod UID (case does not matter)"
)
_TASK_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{TASK_ID_MAX_LENGTH - 1}}}")


def is_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def is_digest(digest: object) -> bool:
    return isinstance(digest, str) and _DIGEST.fullmatch(digest) is not None


def canonical_task_id(task_id: object) -> str | None:
    """``task_id`` in its one form (lower case), or None when it is not a task id."""
    if not isinstance(task_id, str) or _TASK_ID.fullmatch(task_id) is None:
        return None
    return task_id.lower()


__all__ = [
    "DIGEST_HINT",
    "DIGEST_LENGTH",
    "NAME_HINT",
    "NAME_MAX_LENGTH",
    "TASK_ID_HINT",
    "TASK_ID_MAX_LENGTH",
    "canonical_task_id",
    "is_digest",
    "is_name",
]
