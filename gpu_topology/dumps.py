"""Reading a saved topology: ``nvidia-smi topo -m`` text, an NCCL XML dump or our JSON.

Called by ``dsctl topo --from FILE`` and by anything that keeps topologies in files.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpu_topology.contract import from_json
from gpu_topology.discovery.nccl_xml import parse_nccl_xml
from gpu_topology.discovery.nvidia_smi import parse_topo_matrix
from gpu_topology.errors import InvalidTopology, ParseError
from gpu_topology.model import Topology

FORMATS = ("auto", "nvidia-smi", "nccl-xml", "json")


def detect_format(text: str) -> str:
    """``nccl-xml`` for XML, ``json`` for a JSON object, else ``nvidia-smi``."""
    start = text.lstrip("\ufeff \t\r\n")
    if start.startswith("<"):
        return "nccl-xml"
    if start.startswith("{"):
        return "json"
    return "nvidia-smi"


def parse_dump(text: str, format: str = "auto") -> Topology:
    """Read ``text`` in ``format`` (one of :data:`FORMATS`)."""
    if format not in FORMATS:
        raise InvalidTopology(f"unknown topology format {format!r}", hint="one of " + ", ".join(FORMATS))
    chosen = detect_format(text) if format == "auto" else format
    if chosen == "nccl-xml":
        return parse_nccl_xml(text)
    if chosen == "json":
        return from_json(text)
    return parse_topo_matrix(text)


def load_dump(path: str | os.PathLike[str], format: str = "auto") -> Topology:
    """Read the file at ``path`` (``-`` is not special here; the CLI handles stdin)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ParseError(f"cannot read topology file {path}: {exc.strerror or exc}") from exc
    try:
        return parse_dump(text, format)
    except ParseError as exc:
        raise ParseError(f"{path}: {exc.message}", hint=exc.hint) from exc
