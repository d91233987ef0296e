"""Dataset names and digests: the one rule, for pack, the agent, the kube code, the CLI and the extender.

A dataset name becomes a directory in bundle stores and in every node's cache, a key in
the node inventory annotation and part of the Dataset resource's spec, so it is held to the
strictest of those places: 1-128 characters from ``A-Z a-z 0-9 . _ -``, starting with a
letter or digit (so never ``.``, ``..`` or a hidden name). A digest is xxh3-128 as 32
lowercase hex characters (``docs/design.md#manifests-and-digests``).
"""

from __future__ import annotations

import re

from dsplatform.errors import VocabularyError

NAME_MAX_LENGTH = 128
DIGEST_LENGTH = 32
NAME_HINT = f"use 1-{NAME_MAX_LENGTH} letters, digits, '.', '_' or '-', starting with a letter or digit"
DIGEST_HINT = f"a digest is {DIGEST_LENGTH} lowercase hex characters"

_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX_LENGTH - 1}}}")
_DIGEST = re.compile(rf"[0-9a-f]{{{DIGEST_LENGTH}}}")


class InvalidName(VocabularyError):
    """A dataset name or digest that breaks the rule; ``hint`` says what a good one looks like."""


def is_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def is_digest(digest: object) -> bool:
    return isinstance(digest, str) and _DIGEST.fullmatch(digest) is not None


def check_name(name: object) -> str:
    """``name`` if it is a valid dataset name; else :class:`InvalidName`."""
    if not is_name(name):
        raise InvalidName(f"invalid dataset name {name!r}", NAME_HINT)
    return name  # type: ignore[return-value]


def check_digest(digest: object) -> str:
    """``digest`` if it is 32 lowercase hex characters; else :class:`InvalidName`."""
    if not is_digest(digest):
        raise InvalidName(f"invalid digest {digest!r}", DIGEST_HINT)
    return digest  # type: ignore[return-value]


__all__ = [
    "DIGEST_HINT",
    "DIGEST_LENGTH",
    "NAME_HINT",
    "NAME_MAX_LENGTH",
    "InvalidName",
    "check_digest",
    "check_name",
    "is_digest",
    "is_name",
]
