"""The CSI volume attributes: how the webhook tells the agent's CSI node plugin which datasets
a pod's inline ``csi`` volume carries. Version 2 (a volume without a ``stripe`` entry is
written as version 1, which every agent reads).

Writer: the admission webhook (:mod:`dsagent.webhook.csiwiring`, ``volumeAttributes`` of the
pod's volume). Reader: the CSI node plugin (:mod:`dsagent.nodeplugins.csi.volumes`), from the
``volume_context`` of ``NodePublishVolume``, beside the pod-info keys the kubelet adds. The
pod's author can write the same attributes by hand, so the reader treats them as hostile:
bounded JSON, known keys only, names by the platform's rule.

``volumeAttributes``::

    datasets   JSON list of {name, source, bundles?, digest?, secretKey?, stripe?}: 1-64 datasets
    version    "2" when an entry has ``stripe``, else "1" (absent: 1)

``secretKey`` names the key of the volume's ``nodePublishSecretRef`` Secret holding the
dataset's storage options (the kubelet reads the Secret and passes it; the pod spec never
holds credentials). A pinned ``digest`` is accepted and not passed on: the agent resolves
the version itself, as for ``DSAGENT_DATASETS``. ``stripe`` (version 2) is the digest of a
striped version the pod reads before it is whole (a Dataset with ``spec.stripe`` and
``spec.startBeforeWhole``): the volume then shows this node's share of it, its files and
its layout file, instead of a whole copy (docs/design-striping.md#csi).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dsplatform import boundedjson
from dsplatform.errors import InvalidInput
from dsplatform.names import NAME_HINT, is_digest, is_name

VERSION = 2
#: the versions this reader accepts: 1 has no ``stripe`` entries
READS = frozenset({"1", "2"})
DATASETS_KEY = "datasets"
VERSION_KEY = "version"
#: the attributes of ours; the kubelet adds its pod-info keys beside them
ATTRIBUTES = frozenset({DATASETS_KEY, VERSION_KEY})
DATASET_KEYS = frozenset({"name", "source", "bundles", "digest", "secretKey", "stripe"})
#: the datasets attribute: at most 64 entries of a few short strings each
ATTRIBUTE_MAX_BYTES = 256 * 1024
MAX_DATASETS = 64

# Checked with fullmatch: ``$`` alone lets a trailing newline through.
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


@dataclass(frozen=True)
class VolumeDataset:
    """One dataset of the volume: where it comes from and which Secret key holds its options."""

    name: str
    source: str
    bundles: str | None = None
    secret_key: str | None = None
    stripe: str | None = None  # a striped version's digest: the volume shows this node's share of it


def encode(datasets: Sequence[VolumeDataset]) -> dict[str, str]:
    """The ``volumeAttributes`` carrying ``datasets``."""
    entries = []
    for dataset in datasets:
        entry = {"name": dataset.name, "source": dataset.source}
        if dataset.bundles:
            entry["bundles"] = dataset.bundles
        if dataset.secret_key:
            entry["secretKey"] = dataset.secret_key
        if dataset.stripe:
            entry["stripe"] = dataset.stripe
        entries.append(entry)
    version = VERSION if any(d.stripe for d in datasets) else 1  # what an agent of version 1 reads too
    return {DATASETS_KEY: json.dumps(entries, separators=(",", ":")), VERSION_KEY: str(version)}


def decode(attributes: Mapping[str, str]) -> tuple[VolumeDataset, ...]:
    """The datasets of a volume's attributes; :class:`InvalidInput` naming what is wrong."""
    version = attributes.get(VERSION_KEY, "1")
    if version not in READS:
        raise InvalidInput(
            f"volume attribute {VERSION_KEY!r} is {version[:20]!r}; this agent reads versions {sorted(READS)}",
            hint="upgrade the agent, or let the webhook of this release write the volume",
        )
    raw = attributes.get(DATASETS_KEY)
    if not raw:
        raise InvalidInput(
            f"volume attribute {DATASETS_KEY!r} is missing",
            hint='a JSON list, e.g. [{"name":"imagenet","source":"s3://..."}]',
        )
    try:
        items = boundedjson.loads(raw, what=f"volume attribute {DATASETS_KEY!r}", max_bytes=ATTRIBUTE_MAX_BYTES)
    except boundedjson.JsonRefused as exc:  # too large, too deep or not JSON
        raise InvalidInput(exc.message) from None
    if not isinstance(items, list) or not items or len(items) > MAX_DATASETS:
        raise InvalidInput(f"volume attribute {DATASETS_KEY!r} must be a list of 1-{MAX_DATASETS} datasets")
    datasets = tuple(_dataset(item) for item in items)
    if version == "1" and any(d.stripe for d in datasets):
        raise InvalidInput(f"'stripe' needs volume attribute {VERSION_KEY!r} 2")
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise InvalidInput(f"dataset names repeat in volume attribute {DATASETS_KEY!r}")
    return datasets


def _dataset(item: object) -> VolumeDataset:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("source"), str):
        raise InvalidInput("each dataset needs a string 'name' and 'source'")
    name = item["name"]
    unknown = sorted(set(item) - DATASET_KEYS)
    if unknown:
        raise InvalidInput(
            f"dataset {name[:60]!r} has unknown keys {unknown[:5]}", hint=f"known: {sorted(DATASET_KEYS)}"
        )
    if not is_name(name):
        raise InvalidInput(f"invalid dataset name {name!r}", hint=NAME_HINT)
    for key in ("bundles", "secretKey", "digest", "stripe"):
        if key in item and not isinstance(item[key], str):
            raise InvalidInput(f"dataset {name!r}: {key} must be a string")
    if "secretKey" in item and not _SECRET_KEY.fullmatch(item["secretKey"]):
        raise InvalidInput(f"dataset {name!r}: invalid secretKey")
    if "stripe" in item and not is_digest(item["stripe"]):
        raise InvalidInput(f"dataset {name!r}: stripe must be a version digest", hint="32 lowercase hex digits")
    return VolumeDataset(
        name, item["source"], item.get("bundles") or None, item.get("secretKey") or None, item.get("stripe") or None
    )


__all__ = [
    "ATTRIBUTES",
    "ATTRIBUTE_MAX_BYTES",
    "DATASETS_KEY",
    "READS",
    "VERSION",
    "VERSION_KEY",
    "VolumeDataset",
    "decode",
    "encode",
]
