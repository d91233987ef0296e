"""``dsctl topo``: show a node's GPU/NIC topology, RoCE classes and GPU-set scores.

A thin edge over :mod:`gpu_topology`: it reads a saved topology (``--from``) or
discovers the local machine, then prints. Errors are gpu_topology's own, turned into one
line and their exit code by ``dsctl``'s main.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from dsagent.cli.options import output_option
from gpu_topology import Topology, best_gpu_set, discover, nearest_nics, pair_score, roce_classes
from gpu_topology.contract import topology_to_dict
from gpu_topology.dumps import FORMATS, load_dump, parse_dump
from gpu_topology.model import gpu_name
from gpu_topology.roceclasses import DEFAULT_MODE, DEFAULT_PREFIX, ClassMode

_Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _source_options(func: Callable[..., Any]) -> Callable[..., Any]:
    decorators: list[_Decorator] = [
        click.option(
            "--from",
            "source",
            metavar="FILE",
            help="Read a saved topology (nvidia-smi topo -m text, NCCL XML or this tool's JSON; '-' for "
            "stdin) instead of discovering this machine.",
        ),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(FORMATS),
            default="auto",
            show_default=True,
            help="Format of --from.",
        ),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _load(source: str | None, fmt: str) -> Topology:
    if source is None:
        if fmt != "auto":
            raise click.UsageError("--format applies to --from only")
        return discover()
    if source == "-":
        return parse_dump(sys.stdin.read(), fmt)
    return load_dump(source, fmt)


def _indices(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated GPU indices such as 0,1,4, got {text!r}", param_hint=option
        ) from None


@click.group()
def topo() -> None:
    """GPU, NIC and NUMA topology; RoCE affinity classes; best GPU sets."""


@topo.command("show")
@_source_options
@click.option(
    "--prefix",
    default=DEFAULT_PREFIX,
    show_default=True,
    help="Resource name prefix of the RoCE classes (e.g. example.com/gpu-roce).",
)
@click.option(
    "--classes",
    "mode",
    type=click.Choice([m.value for m in ClassMode], case_sensitive=False),
    default=DEFAULT_MODE.value,
    show_default=True,
    help="How RoCE classes are cut: one per NUMA group of the RoCE NICs, per subnet, or one class.",
)
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")
@output_option
def show(source: str | None, fmt: str, prefix: str, mode: str, as_json: bool, output: str) -> None:
    """Print the topology, its RoCE classes and the GPU-pair score matrix."""
    topology = _load(source, fmt)
    if as_json or output == "json":
        click.echo(json.dumps(topology_to_dict(topology, prefix=prefix, mode=mode), indent=2))
        return
    click.echo("\n".join(render(topology, prefix=prefix, mode=mode)))


@topo.command("best")
@_source_options
@click.option("--count", "-k", type=click.IntRange(min=1), required=True, help="How many GPUs.")
@click.option("--must-include", metavar="LIST", help="GPUs the set must contain, e.g. 2,3.")
@click.option("--free", metavar="LIST", help="GPUs to choose from (default: all).")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")
@output_option
def best(
    source: str | None, fmt: str, count: int, must_include: str | None, free: str | None, as_json: bool, output: str
) -> None:
    """Print the best-scoring set of --count GPUs and its score."""
    topology = _load(source, fmt)
    free_list = _indices(free, "--free")
    chosen = best_gpu_set(
        topology,
        topology.gpu_indices if free_list is None else free_list,
        count,
        _indices(must_include, "--must-include") or (),
    )
    if chosen is None:
        raise click.ClickException(f"no set of {count} GPUs holds the must-include GPUs within the free ones")
    if as_json or output == "json":
        body = {
            "gpus": list(chosen.gpus),
            "score": chosen.score,
            "singleNuma": chosen.single_numa,
            "nicLevel": chosen.nic_level,
        }
        click.echo(json.dumps(body))
        return
    click.echo(
        f"GPUs {','.join(map(str, chosen.gpus))}  score {chosen.score}  "
        f"single NUMA node: {'yes' if chosen.single_numa else 'no'}  "
        f"closest NIC: {chosen.nic_level or 'none'}"
    )


def render(topology: Topology, *, prefix: str = DEFAULT_PREFIX, mode: str = DEFAULT_MODE.value) -> list[str]:
    """The human-readable report ``dsctl topo show`` prints."""
    lines = [f"GPUs ({len(topology.gpus)})"]
    rows = [["GPU", "NUMA", "CPU AFFINITY", "PCI BUS ID", "NEAREST NICS"]]
    for gpu in topology.gpus:
        near = nearest_nics(topology, gpu.index)
        level = str(topology.link(gpu.name, near[0])) if near else ""
        rows.append(
            [
                str(gpu.index),
                _dash(gpu.numa_node if gpu.numa_node is not None else ",".join(map(str, gpu.numa_affinity)) or None),
                _dash(gpu.cpu_affinity),
                _dash(gpu.pci_bus_id),
                f"{', '.join(near)} ({level})" if near else "-",
            ]
        )
    lines += _table(rows)
    lines += ["", f"NICs ({len(topology.nics)})"]
    rows = [["NAME", "NUMA", "NETDEV", "LINK LAYER", "STATE", "ADDRESSES"]]
    for nic in topology.nics:
        addresses = ", ".join(nic.addresses) or "-"
        rows.append(
            [nic.name, _dash(nic.numa_node), _dash(nic.netdev), _dash(nic.link_layer), _dash(nic.state), addresses]
        )
    lines += _table(rows) if topology.nics else ["  (none)"]
    classes = roce_classes(topology, prefix, mode)
    lines += ["", f"RoCE classes ({len(classes)}, by {ClassMode.parse(mode)})"]
    rows = [["CLASS", "NICS", "NUMA", "GPUS", "SUBNETS"]]
    for cls in classes:
        gpus, subnets = ",".join(map(str, cls.gpus)), ",".join(cls.subnets) or "-"
        rows.append([cls.name, ",".join(cls.nics), _dash(cls.numa_node), gpus, subnets])
    lines += _table(rows) if classes else ["  (none: no RDMA NIC within non-SYS reach of a GPU)"]
    lines += ["", "GPU-pair scores"]
    indices = topology.gpu_indices
    rows = [[""] + [gpu_name(i) for i in indices]]
    for a in indices:
        rows.append([gpu_name(a)] + ["-" if a == b else str(pair_score(topology, a, b)) for b in indices])
    lines += _table(rows) if indices else ["  (no GPUs)"]
    return lines


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
