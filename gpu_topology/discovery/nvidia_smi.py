"""Discovery from ``nvidia-smi``: the ``topo -m`` matrix plus the GPU UUID/bus-id query.

:func:`parse_topo_matrix` reads the matrix text as printed by every driver generation we
have seen (``tests/fixtures/topology``): tabs expanded to spaces or doubled, cells
padded with stray spaces, ANSI escapes around the header, NIC columns named ``mlx5_*``
directly (in any order) or ``NIC#`` with a trailing "NIC Legend", no NUMA column, NUMA
affinity lists and ranges (``0,8,252-255``), no legend at all. Cells are therefore split
on any run of whitespace, never on exact tabs: a link cell never contains a space, and
the multi-word attribute headers (``CPU Affinity``, ``NUMA Affinity``, ``GPU NUMA ID``)
are recognised as phrases.

Attribute cells may be empty: in a container whose cgroup limits its CPUs, ``CPU
Affinity`` (sometimes ``NUMA Affinity``) prints nothing. When a row has fewer attribute
values than the header has columns, its tabs place them (nvidia-smi ends every cell with
a tab, so ``CPU Affinity`` and ``NUMA Affinity`` are the first two tab fields after the
links; the padding tabs after them precede ``GPU NUMA ID``); without tabs, the values'
columns must line up under the header's, or the row is refused rather than misread.

Text copied from web pages and documents is cleaned first: terminal escape codes, also
those that lost their ESC byte (``[4m``, ``^[[0m``), and a comment marker (``#`` or
``//``) in front of every line. Other prefixes are refused with a message naming them.

``nvidia-smi`` prints no NUMA node for NICs; a NIC gets the NUMA node shared by every
GPU within non-SYS reach of it (a non-SYS link never leaves a NUMA node).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpu_topology.discovery.base import Backend, Runner, run_command
from gpu_topology.errors import ParseError
from gpu_topology.model import Gpu, Link, Nic, Topology, normalize_bus_id
from gpu_topology.roceclasses import nic_numa_node

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Escape codes that lost their ESC byte on the way through a web page or a document
# (``[4m``), or carry it in caret or symbol notation (``^[[4m``, ``\u241b[4m``).
_LOST_ESCAPE = re.compile(r"(?:\^\[|\u241b)?\[[0-9;]*m")
_COMMENT = re.compile(r"^[ \t]*(#|//)[ \t]?")
_POSITIONAL = ("CPU Affinity", "NUMA Affinity")  # the first tab fields after the links
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
    device_columns: tuple[int, ...] = ()  # where each device name starts (tabs expanded)
    attribute_columns: tuple[int, ...] = ()


def parse_topo_matrix(text: str) -> Topology:
    """Read the output of ``nvidia-smi topo -m`` into a :class:`Topology`."""
    lines = _clean_lines(text)
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
        n if n.numa_node is not None else replace(n, numa_node=nic_numa_node(topology, n)) for n in topology.nics
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


def _clean_lines(text: str) -> list[str]:
    """The text's lines without escape codes and, when the header carries one, without
    the comment marker in front of the lines."""
    text = _LOST_ESCAPE.sub("", _ANSI.sub("", text)).replace("\r", "")
    lines = text.split("\n")
    uncommented = [_COMMENT.sub("", line, count=1) for line in lines]
    at = _header_at(uncommented)
    if at is not None and _COMMENT.match(lines[at]):
        return uncommented
    return lines


def _is_header(line: str) -> bool:
    tokens = line.split()
    return bool(tokens) and _GPU.match(tokens[0]) is not None and not any(_LINK.match(t) for t in tokens)


def _header_at(lines: Sequence[str]) -> int | None:
    return next((at for at, line in enumerate(lines) if _is_header(line)), None)


def _find_header(lines: Sequence[str]) -> tuple[int, _Header]:
    at = _header_at(lines)
    if at is not None:
        labels = {rest.split()[0] for rest in lines[at + 1 :] if rest.split()}
        return at, _parse_header(lines[at], at + 1, labels)
    for number, line in enumerate(lines, start=1):
        found = re.search(r"GPU0(?![0-9])", line)
        if found and line[: found.start()].strip():
            prefix = line[: found.start()].strip()
            raise ParseError(
                f"line {number} names GPU0 after {prefix!r}, which 'nvidia-smi topo -m' never prints",
                hint=f"strip {prefix!r} (and whatever else the copy added) from the start of every line, "
                "then pass the output as printed",
            )
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
        escapes = any(re.search(r"[\[\]^;]", d) for d in odd)
        raise ParseError(
            f"line {number}: unexpected column(s) {', '.join(odd)} in the topology header",
            hint="strip the terminal escape codes (such as '[4m') the copy left" if escapes else None,
        )
    if len(set(devices)) != len(devices):
        raise ParseError(f"line {number}: a device column appears twice")
    wide = line.expandtabs(8)
    attribute_columns = tuple(m.start() for m in _ATTRIBUTE_RE.finditer(wide))
    masked = _ATTRIBUTE_RE.sub(lambda m: " " * len(m.group(0)), wide)
    device_columns = tuple(m.start() for m in re.finditer(r"\S+", masked))
    return _Header(devices, attributes, device_columns, attribute_columns)


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
        rows[tokens[0]] = (cells, _attributes(line, number, header))
    return rows


def _attributes(line: str, number: int, header: _Header) -> dict[str, str]:
    """The row's attribute cells by header column; see the module docstring."""
    width = len(header.devices)
    values = line.split()[width + 1 :]
    if len(values) >= len(header.attributes) or not values:
        return dict(zip(header.attributes, values))
    if "\t" in line:
        fields = line.split("\t")
        seen = at = 0
        while at < len(fields) and seen < width + 1:  # the row label and its link cells
            seen += bool(fields[at].strip())
            at += 1
        rest = [f.strip() for f in fields[at:]]
        lead = 0
        while lead < len(header.attributes) and header.attributes[lead] in _POSITIONAL:
            lead += 1
        found = {a: rest[i] for i, a in enumerate(header.attributes[:lead]) if i < len(rest) and rest[i]}
        found.update(zip(header.attributes[lead:], [f for f in rest[lead:] if f]))
        return found
    return _aligned(line, number, header, values)


def _aligned(line: str, number: int, header: _Header, values: list[str]) -> dict[str, str]:
    """Attribute values placed by their column under the header (tabs expanded)."""
    wide = line.expandtabs(8)
    starts = [m.start() for m in re.finditer(r"\S+", wide)]
    width = len(header.devices)
    # Calibrate on the first link cell that is not X (X is centred in its cell).
    offset = None
    for j in range(width):
        if j + 1 < len(starts) and wide[starts[j + 1]] != "X" and j < len(header.device_columns):
            offset = starts[j + 1] - header.device_columns[j]
            break
    found: dict[str, str] = {}
    for value, start in zip(values, starts[width + 1 :]):
        column = None if offset is None else start - offset
        match = [
            a
            for a, c in zip(header.attributes, header.attribute_columns)
            if column is not None and abs(c - column) <= 1
        ]
        if not match:
            raise ParseError(
                f"line {number}: {len(values)} attribute value(s) for the {len(header.attributes)} columns "
                f"{', '.join(header.attributes)}, and the tabs that would place the empty ones are lost",
                hint="pass the output as printed, with its tabs (e.g. nvidia-smi topo -m > topo.txt)",
            )
        found[match[0]] = value
    return found


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
