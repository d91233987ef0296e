"""The version-1 topology JSON contract: what the node agent publishes for the scheduler.

Owns the mapping between :class:`~gpu_topology.model.Topology` and the JSON document
described by the committed ``topology.schema.json`` (the Node annotation
``dsagent.io/topology`` and ``dsctl topo show --json``). ``nvlinkPcie`` carries the PCIe
level beneath an NVLink where a backend measured it. ``nearestNics`` and ``classes``
are derived on the way out and ignored on the way in (they are recomputed from the
links); :func:`classes_from_dict` reads the published classes as they are, for readers
that must use the publisher's class names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
from functools import lru_cache
from importlib import resources
from typing import Any, TypeVar

import jsonschema

from gpu_topology.errors import ParseError
from gpu_topology.model import Gpu, Link, Nic, Topology
from gpu_topology.roceclasses import DEFAULT_MODE, DEFAULT_PREFIX, ClassMode, RoceClass, nearest_nic_map, roce_classes

VERSION = 1


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The committed JSON schema of the contract."""
    text = resources.files("gpu_topology").joinpath("topology.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def validate(data: Any) -> None:
    """Raise :class:`ParseError` (naming the offending path) unless ``data`` fits the schema."""
    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ParseError(f"topology JSON does not fit schema version {VERSION} at {where}: {error.message}")


def topology_to_dict(
    topology: Topology, *, prefix: str = DEFAULT_PREFIX, mode: ClassMode | str = DEFAULT_MODE
) -> dict[str, Any]:
    """The contract document for ``topology``; RoCE classes by ``mode``, named with ``prefix``."""
    mode = ClassMode.parse(mode)
    return {
        "version": VERSION,
        "gpus": [_device_to_dict(g) for g in topology.gpus],
        "nics": [_device_to_dict(n) for n in topology.nics],
        "links": {a: {b: str(link) for b, link in row.items()} for a, row in _ordered_links(topology)},
        "nvlinkPcie": _nvlink_pcie(topology),
        "nearestNics": {str(i): list(nics) for i, nics in nearest_nic_map(topology).items()},
        "classMode": mode.value,
        "classes": [class_to_dict(c) for c in roce_classes(topology, prefix, mode)],
    }


def topology_from_dict(data: Mapping[str, Any]) -> Topology:
    """Read a contract document; raises :class:`ParseError` on anything malformed."""
    validate(data)
    gpus = tuple(_device_from_dict(Gpu, g) for g in data["gpus"])
    nics = tuple(_device_from_dict(Nic, n) for n in data["nics"])
    links = {a: {b: Link.parse(text) for b, text in row.items()} for a, row in data["links"].items()}
    for a, row in (data.get("nvlinkPcie") or {}).items():
        for b, text in row.items():
            for x, y in ((a, b), (b, a)):
                link = links.get(x, {}).get(y)
                if link is not None and link.is_nvlink:
                    links[x][y] = replace(link, pcie=Link.parse(text).kind)
    return Topology(gpus=gpus, nics=nics, links=links)


def to_json(
    topology: Topology,
    *,
    prefix: str = DEFAULT_PREFIX,
    mode: ClassMode | str = DEFAULT_MODE,
    indent: int | None = None,
) -> str:
    """The document as text: compact (for annotations) unless ``indent`` is given."""
    separators = (",", ":") if indent is None else (",", ": ")
    document = topology_to_dict(topology, prefix=prefix, mode=mode)
    return json.dumps(document, indent=indent, separators=separators)


def from_json(text: str | bytes) -> Topology:
    """Read the document from text; malformed JSON is a :class:`ParseError`."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"topology is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ParseError("topology JSON must be an object")
    return topology_from_dict(data)


def class_to_dict(cls: RoceClass) -> dict[str, Any]:
    return {
        "name": cls.name,
        "nics": list(cls.nics),
        "numaNode": cls.numa_node,
        "subnets": list(cls.subnets),
        "gpus": list(cls.gpus),
    }


def classes_from_dict(data: Mapping[str, Any]) -> tuple[RoceClass, ...]:
    """The classes exactly as published in a contract document (validated)."""
    validate(data)
    return tuple(
        RoceClass(
            name=c["name"],
            nics=tuple(c["nics"]),
            numa_node=c["numaNode"],
            subnets=tuple(c["subnets"]),
            gpus=tuple(c["gpus"]),
        )
        for c in data.get("classes", ())
    )


def _nvlink_pcie(topology: Topology) -> dict[str, dict[str, str]]:
    """GPU -> GPU -> the measured PCIe level beneath their NVLink (one direction each)."""
    table: dict[str, dict[str, str]] = {}
    names = [g.name for g in topology.gpus]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            link = topology.link(a, b)
            if link is not None and link.pcie is not None:
                table.setdefault(a, {})[b] = link.pcie.value
    return table


def _ordered_links(topology: Topology) -> list[tuple[str, dict[str, Link]]]:
    rows = []
    for a in topology.device_names:
        row = {b: topology.links[a][b] for b in topology.device_names if b in topology.links.get(a, {})}
        if row:
            rows.append((a, row))
    return rows


_Device = TypeVar("_Device", Gpu, Nic)


def _key(field: str) -> str:
    """A device field's JSON key: its name in camelCase (``pci_bus_id`` -> ``pciBusId``)."""
    head, *rest = field.split("_")
    return head + "".join(part.title() for part in rest)


def _device_to_dict(device: Gpu | Nic) -> dict[str, Any]:
    """A GPU's or a NIC's fields under their keys, in field order, tuples as lists; a GPU
    without a NUMA affinity list leaves the key out."""
    body: dict[str, Any] = {}
    for f in fields(device):
        value = getattr(device, f.name)
        if f.name != "numa_affinity" or value:
            body[_key(f.name)] = list(value) if isinstance(value, tuple) else value
    return body


def _device_from_dict(cls: type[_Device], data: Mapping[str, Any]) -> _Device:
    """The device of ``data``: a field without a default (a GPU's index, a NIC's name) is
    required, the others take their defaults when absent."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        key = _key(f.name)
        if f.default is MISSING or key in data:
            value = data[key]
            values[f.name] = tuple(value) if isinstance(f.default, tuple) else value
    return cls(**values)
