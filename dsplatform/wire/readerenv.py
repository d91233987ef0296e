"""The environment the admission webhook gives app containers that read striped versions.

Writer: the admission webhook (:mod:`dsagent.webhook.mutation` in hostPath mode,
:mod:`dsagent.webhook.csiwiring` in CSI mode), as env entries of each app container.
Reader: the rank-aware reader (:meth:`dsplatform.data.StripedDataset.from_env`), inside the
pod. The pod's author can set the same variables, so the reader treats them as hostile:
bounded JSON, known keys only, names and digests by the platform's rule.

- ``DSAGENT_STRIPES``: JSON list of ``{name, digest, shareDir}``, one per striped dataset the
  pod reads: the version and where this node's share of it is mounted.
- ``DSAGENT_SOCKET``: the node agent's unix socket, which serves the other bundles.
- ``DSAGENT_NODE_NAME``: the node the pod runs on (the downward API's ``spec.nodeName``).
  Ranks exchange it so that each reads the bundles its own node holds
  (docs/design-striping.md#reader).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dsplatform import boundedjson
from dsplatform.errors import InvalidInput
from dsplatform.names import DIGEST_HINT, NAME_HINT, is_digest, is_name

STRIPES_ENV = "DSAGENT_STRIPES"
SOCKET_ENV = "DSAGENT_SOCKET"
NODE_ENV = "DSAGENT_NODE_NAME"
#: at most this many striped datasets per pod, as many as a pod may ask for
MAX_SHARES = 64
MAX_BYTES = 64 * 1024
_KEYS = {"name", "digest", "shareDir"}


@dataclass(frozen=True)
class Share:
    """One striped dataset a pod reads: its name, the version and this node's share directory."""

    name: str
    digest: str
    share_dir: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "digest": self.digest, "shareDir": self.share_dir}


def encode(shares: Iterable[Share]) -> str:
    """``DSAGENT_STRIPES``'s value."""
    return json.dumps([s.to_json() for s in shares], separators=(",", ":"))


def decode(text: str) -> list[Share]:
    """Parse ``DSAGENT_STRIPES``; anything malformed is :class:`InvalidInput` with the reason."""
    value = boundedjson.loads(text, what=STRIPES_ENV, max_bytes=MAX_BYTES, max_depth=3)
    if not isinstance(value, list) or len(value) > MAX_SHARES:
        raise InvalidInput(f"{STRIPES_ENV} is a JSON list of at most {MAX_SHARES} objects")
    shares: list[Share] = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != _KEYS:
            raise InvalidInput(f"{STRIPES_ENV}: each entry is an object with exactly {sorted(_KEYS)}")
        name, digest, share_dir = entry["name"], entry["digest"], entry["shareDir"]
        if not isinstance(name, str) or not is_name(name):
            raise InvalidInput(f"{STRIPES_ENV}: invalid dataset name {name!r}: {NAME_HINT}")
        if not isinstance(digest, str) or not is_digest(digest):
            raise InvalidInput(f"{STRIPES_ENV}: invalid digest {digest!r} for {name}: {DIGEST_HINT}")
        if not isinstance(share_dir, str) or not share_dir.startswith("/") or "\0" in share_dir:
            raise InvalidInput(f"{STRIPES_ENV}: the shareDir of {name} is not an absolute path")
        shares.append(Share(name, digest, share_dir))
    return shares


def env(shares: Iterable[Share], socket: str | None = None) -> list[dict[str, Any]]:
    """The env entries of an app container that reads ``shares``: the shares, the node's name
    from the downward API and, when given, the agent's ``socket`` (a container that has
    ``DSAGENT_SOCKET`` already needs no second one)."""
    entries: list[dict[str, Any]] = [
        {"name": STRIPES_ENV, "value": encode(shares)},
        {"name": NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    if socket is not None:
        entries.append({"name": SOCKET_ENV, "value": socket})
    return entries


def share_named(shares: list[Share], name: str | None) -> Share:
    """The share of dataset ``name`` (``None``: the only one)."""
    if not shares:
        raise InvalidInput(
            f"{STRIPES_ENV} is not set: this pod was not wired to read a striped dataset",
            hint="the admission webhook wires pods that name a Dataset with spec.stripe in their"
            " dsagent.io/datasets annotation (docs/user-guide/striping.md); for a whole copy, read its files directly",
        )
    if name is None:
        if len(shares) != 1:
            names = [s.name for s in shares]
            raise InvalidInput(
                f"{STRIPES_ENV} lists {len(shares)} datasets {names}: name the one to read",
                hint=f"StripedDataset.from_env({names[0]!r})",
            )
        return shares[0]
    for share in shares:
        if share.name == name:
            return share
    raise InvalidInput(f"{STRIPES_ENV} has no dataset {name!r} (it lists {[s.name for s in shares]})")


def from_environ(environ: Mapping[str, str]) -> tuple[list[Share], str | None, str | None]:
    """The shares, the agent's socket and the node's name in ``environ`` (each may be absent)."""
    text = environ.get(STRIPES_ENV)
    return (decode(text) if text else []), environ.get(SOCKET_ENV) or None, environ.get(NODE_ENV) or None
