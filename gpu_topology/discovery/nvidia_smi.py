"""Discovery from ``nvidia-smi``: the ``topo -m`` matrix plus the GPU UUID/bus-id query.

:func:`parse_topo_matrix` reads the matrix text as printed by every driver generation we
have seen (``tests/fixtures/topology``): tabs expanded to spaces or doubled, cells
padded with stray spaces, ANSI escapes around the header, NIC columns named ``mlx5_*``
directly (in any order) or ``NIC#`` with a trailing "NIC Legend", no NUMA column, NUMA
affinity lists and ranges (``0,8,252-255``), no legend at all. Cells are therefore split
on any run of whitespace, never on exact tabs: a link cell never contains a space, and
the multi-word attribute headers (``CPU Affinity``, ``NUMA Affinity``, ``GPU NUMA ID``)
are recognised as phrases.

``nvidia-smi`` prints no NUMA node for NICs; a NIC gets the NUMA node shared by every
GPU within non-SYS reach of it (a non-SYS link never leaves a NUMA node).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpu_topology.classes import nic_numa_node
from gpu_topology.discovery.base import Backend, Runner, run_command
from gpu_topology.errors import ParseError
from gpu_topology.model import Gpu, Link, Nic, Topology, normalize_bus_id

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ATTRIBUTES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_ATTRIBUTE_RE = re.compile(r"CPU\s+Affinity|NUMA\s+Affinity|GPU\s+NUMA\s+ID")
_GPU = re.compile(r"^GPU(\d+)$")
# RDMA device names: mlx5_0, bnxt_re1, irdma0, efa0, hfi1_0 ... and NIC# before the legend.
_NIC = re.compile(r"^(NIC\d+|[a-z][a-z0-9_]*\d+)$")
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_ID_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_UNKNOWN = {"", "N/A", "NA", "-"}


@dataclass(frozen=True)
class _Header:
    devices: tuple[str, ...]
    attributes: tuple[str, ...]


def parse_topo_matrix(text: str) -> Topology:
    """Read the output of ``nvidia-smi topo -m`` into a :class:`Topology`."""
    lines = _ANSI.sub("", text).replace("\r", "").split("\n")
    at, header = _find_header(lines)
    rows = _read_rows(lines[at + 1 :], header, first_line=at + 2)
    legend = _nic_legend(lines)
    rename = {name: legend.get(name, name) for name in header.devices}
    gpus, nics, links = [], [], {}
    for name in header.devices:
        cells, attrs = rows.get(name, ((), {}))
        _check_diagonal(name, cells, header.devices)
        row_links = {rename[other]: link for other, link in zip(header.devices, cells) if link is not None}
        links[rename[name]] = row_links
        match = _GPU.match(name)
        if match:
            gpus.append(_gpu(int(match.group(1)), attrs))
        else:
            nics.append(Nic(name=rename[name]))
    topology = Topology(gpus=tuple(gpus), nics=tuple(nics), links=_symmetric(links))
    return with_inferred_nic_numa(topology)


def _check_diagonal(name: str, cells: Sequence[Link | None], devices: Sequence[str]) -> None:
    """X (self) sits on the diagonal and nowhere else, or the cells are misaligned."""
    for other, cell in zip(devices, cells):
        if (cell is None) != (other == name):
            found = "X" if cell is None else str(cell)
            raise ParseError(
                f"row {name} has {found} in column {other}",
                hint="the columns are probably misaligned; pass the output as printed",
            )


def with_inferred_nic_numa(topology: Topology) -> Topology:
    """``topology`` with every NIC of unknown NUMA node given its GPUs' node, if shared."""
    nics = tuple(
        n if n.numa_node is not None else replace(n, numa_node=nic_numa_node(topology, n))
        for n in topology.nics
    )
    return replace(topology, nics=nics)


def parse_gpu_query(text: str) -> dict[int, tuple[str | None, str | None]]:
    """Read ``--query-gpu=index,uuid,pci.bus_id --format=csv,noheader`` output."""
    found: dict[int, tuple[str | None, str | None]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            raise ParseError(f"nvidia-smi GPU query line {number} is not 'index, uuid, bus id': {line!r}")
        uuid = None if parts[1] in _UNKNOWN else parts[1]
        bus = None if parts[2] in _UNKNOWN else normalize_bus_id(parts[2])
        found[int(parts[0])] = (uuid, bus)
    return found


def _find_header(lines: Sequence[str]) -> tuple[int, _Header]:
    for at, line in enumerate(lines):
        tokens = line.split()
        if any(_GPU.match(t) for t in tokens) and not any(_LINK.match(t) for t in tokens):
            labels = {rest.split()[0] for rest in lines[at + 1 :] if rest.split()}
            return at, _parse_header(line, at + 1, labels)
    raise ParseError(
        "no 'nvidia-smi topo -m' header (a line naming GPU0 ...) found",
        hint="pass the output of 'nvidia-smi topo -m' as it was printed",
    )


def _parse_header(line: str, number: int, row_labels: set[str]) -> _Header:
    attributes = tuple(" ".join(m.group(0).split()) for m in _ATTRIBUTE_RE.finditer(line))
    devices = tuple(_ATTRIBUTE_RE.sub(" ", line).split())
    # A column is a device when it looks like one or has a row of its own (bnxt_re_bond).
    odd = [d for d in devices if not (_GPU.match(d) or _NIC.match(d) or d in row_labels)]
    if odd:
        raise ParseError(f"line {number}: unexpected column(s) {', '.join(odd)} in the topology header")
    if len(set(devices)) != len(devices):
        raise ParseError(f"line {number}: a device column appears twice")
    return _Header(devices=devices, attributes=attributes)


_Row = tuple[tuple[Link | None, ...], dict[str, str]]


def _read_rows(lines: Sequence[str], header: _Header, *, first_line: int) -> dict[str, _Row]:
    rows: dict[str, _Row] = {}
    for number, line in enumerate(lines, start=first_line):
        tokens = line.split()
        if not tokens:
            if rows:
                break
            continue
        if tokens[0] not in header.devices:
            break  # the legend or anything after the matrix
        width = len(header.devices)
        cells = tuple(_cell(t, number, tokens[0]) for t in tokens[1 : width + 1])
        attrs = dict(zip(header.attributes, tokens[width + 1 :]))
        rows[tokens[0]] = (cells, attrs)
    return rows


def _cell(token: str, number: int, row: str) -> Link | None:
    if token.upper() == "X":
        return None
    try:
        return Link.parse(token)
    except ParseError as exc:
        raise ParseError(f"line {number} (row {row}): {exc.message}", hint=exc.hint) from None


def _nic_legend(lines: Sequence[str]) -> dict[str, str]:
    legend: dict[str, str] = {}
    inside = False
    for line in lines:
        if line.strip().rstrip(":").lower() == "nic legend":
            inside = True
            continue
        match = _LEGEND_ENTRY.match(line)
        if inside and match:
            legend[match.group(1)] = match.group(2)
    return legend


def _symmetric(rows: dict[str, dict[str, Link]]) -> dict[str, dict[str, Link]]:
    """The matrix as given, after checking that it reads the same both ways.

    A real matrix is symmetric; a pair that is not means the cells were misaligned
    (a lost or extra cell), so failing beats scoring a wrong topology.
    """
    for a, row in rows.items():
        for b, link in row.items():
            back = rows.get(b, {}).get(a)
            if back is not None and back != link:
                raise ParseError(
                    f"the matrix says {a}-{b} is {link} but {b}-{a} is {back}",
                    hint="the columns are probably misaligned; pass the output as printed",
                )
    return rows


def _gpu(index: int, attrs: dict[str, str]) -> Gpu:
    cpus = attrs.get("CPU Affinity")
    numa_text = attrs.get("NUMA Affinity")
    numa = parse_id_list(numa_text) if numa_text not in _UNKNOWN and numa_text is not None else ()
    return Gpu(
        index=index,
        cpu_affinity=None if cpus is None or cpus in _UNKNOWN else cpus,
        numa_node=numa[0] if len(numa) == 1 else None,
        numa_affinity=numa if len(numa) > 1 else (),
    )


def parse_id_list(text: str) -> tuple[int, ...]:
    """Read a Linux id list such as ``0,8,252-255`` into sorted ids."""
    ids: set[int] = set()
    for part in text.split(","):
        match = _ID_RANGE.match(part.strip())
        if not match or int(match.group(2) or match.group(1)) < int(match.group(1)):
            raise ParseError(f"not an id list: {text!r}", hint="expected e.g. '0', '0-3' or '0,8,252-255'")
        ids.update(range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1))
    return tuple(sorted(ids))


class NvidiaSmiBackend(Backend):
    """Runs ``nvidia-smi topo -m`` and the GPU UUID/bus-id query."""

    name = "nvidia-smi"
    install_hint = "install the NVIDIA driver utilities (nvidia-smi), e.g. the nvidia-utils package"

    def __init__(self, *, binary: str = "nvidia-smi", runner: Runner = run_command, timeout: float = 30.0) -> None:
        self.binary = binary
        self.runner = runner
        self.timeout = timeout

    def unavailable_reason(self) -> str | None:
        if "/" not in self.binary and shutil.which(self.binary) is None:
            return f"{self.binary} is not on PATH"
        return None

    def discover(self) -> Topology:
        self.require()
        matrix = parse_topo_matrix(self._run("topo", "-m"))
        ids = parse_gpu_query(self._run("--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"))
        gpus = tuple(
            replace(g, uuid=ids.get(g.index, (None, None))[0], pci_bus_id=ids.get(g.index, (None, None))[1])
            for g in matrix.gpus
        )
        return replace(matrix, gpus=gpus)

    def _run(self, *args: str) -> str:
        return self.runner([self.binary, *args], self.timeout, self.install_hint)


__all__ = ["NvidiaSmiBackend", "parse_gpu_query", "parse_id_list", "parse_topo_matrix", "with_inferred_nic_numa"]
