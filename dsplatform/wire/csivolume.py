"""The CSI volume attributes: how the webhook tells the agent's CSI node plugin which datasets
a pod's inline ``csi`` volume carries. Version 1.

Writer: the admission webhook (:mod:`dsagent.webhook.csiwiring`, ``volumeAttributes`` of the
pod's volume). Reader: the CSI node plugin (:mod:`dsagent.nodeplugins.csi.volumes`), from the
``volume_context`` of ``NodePublishVolume``, beside the pod-info keys the kubelet adds. The
pod's author can write the same attributes by hand, so the reader treats them as hostile:
bounded JSON, known keys only, names by the platform's rule.

``volumeAttributes``::

    datasets   JSON list of {name, source, bundles?, digest?, secretKey?}: 1-64 datasets
    version    "1" (absent: 1, as written before the key existed)

``secretKey`` names the key of the volume's ``nodePublishSecretRef`` Secret holding the
dataset's storage options (the kubelet reads the Secret and passes it; the pod spec never
holds credentials). A pinned ``digest`` is accepted and not passed on: the agent resolves
the version itself, as for ``DSAGENT_DATASETS``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dsplatform import boundedjson
from dsplatform.errors import InvalidInput
from dsplatform.names import NAME_HINT, is_name

VERSION = 1
DATASETS_KEY = "datasets"
VERSION_KEY = "version"
#: the attributes of ours; the kubelet adds its pod-info keys beside them
ATTRIBUTES = frozenset({DATASETS_KEY, VERSION_KEY})
DATASET_KEYS = frozenset({"name", "source", "bundles", "digest", "secretKey"})
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


def encode(datasets: Sequence[VolumeDataset]) -> dict[str, str]:
    """The ``volumeAttributes`` carrying ``datasets``."""
    entries = []
    for dataset in datasets:
        entry = {"name": dataset.name, "source": dataset.source}
        if dataset.bundles:
            entry["bundles"] = dataset.bundles
        if dataset.secret_key:
            entry["secretKey"] = dataset.secret_key
        entries.append(entry)
    return {DATASETS_KEY: json.dumps(entries, separators=(",", ":")), VERSION_KEY: str(VERSION)}


def decode(attributes: Mapping[str, str]) -> tuple[VolumeDataset, ...]:
    """The datasets of a volume's attributes; :class:`InvalidInput` naming what is wrong."""
    version = attributes.get(VERSION_KEY, str(VERSION))
    if version != str(VERSION):
        raise InvalidInput(
            f"volume attribute {VERSION_KEY!r} is {version[:20]!r}; this agent reads version {VERSION}",
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
    for key in ("bundles", "secretKey", "digest"):
        if key in item and not isinstance(item[key], str):
            raise InvalidInput(f"dataset {name!r}: {key} must be a string")
    if "secretKey" in item and not _SECRET_KEY.fullmatch(item["secretKey"]):
        raise InvalidInput(f"dataset {name!r}: invalid secretKey")
    return VolumeDataset(name, item["source"], item.get("bundles") or None, item.get("secretKey") or None)


__all__ = [
    "ATTRIBUTES",
    "ATTRIBUTE_MAX_BYTES",
    "DATASETS_KEY",
    "VERSION",
    "VERSION_KEY",
    "VolumeDataset",
    "decode",
    "encode",
]
