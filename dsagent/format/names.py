"""Dataset names and digests as dsagent raises them: :mod:`dsplatform.names`'s rule, dsagent's error.

Who calls it: the manifest (pack, digest), the cache layout (every path inside the cache
root), the kube annotation reader and the service's requests. The rule itself lives in
:mod:`dsplatform.names`, shared with the extender; this module only maps its error onto
:class:`~dsagent.errors.InvalidInput` so callers handle one error tree.
"""

from __future__ import annotations

from dsagent.errors import InvalidInput
from dsplatform import names


def validate_name(name: str) -> str:
    """``name`` if it is a valid dataset name; else :class:`InvalidInput` with the rule as hint."""
    if not names.is_name(name):
        raise InvalidInput(f"invalid dataset name {name!r}", hint=names.NAME_HINT)
    return name


def validate_digest(digest: str) -> str:
    """``digest`` if it is 32 lowercase hex characters; else :class:`InvalidInput`."""
    if not names.is_digest(digest):
        raise InvalidInput(f"invalid digest {digest!r}", hint=names.DIGEST_HINT)
    return digest


is_name = names.is_name
is_digest = names.is_digest

__all__ = ["is_digest", "is_name", "validate_digest", "validate_name"]
