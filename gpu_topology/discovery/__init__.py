"""Discovery backends behind one interface, a registry with lazy imports, and ``discover``.

Backends (``name`` -> module), imported only when asked for:

    nvml        NVML through nvidia-ml-py (optional extra ``dsplatform[nvml]``)
    nvidia-smi  ``nvidia-smi topo -m`` and the GPU UUID/bus-id query
    sysfs       /sys/bus/pci, /sys/class/infiniband, /sys/class/net and ``ip -j address``
    nccl-xml    an NCCL topology dump (NCCL_TOPO_DUMP_FILE), read from a file

:func:`discover` with no arguments merges every backend that can run here, in the order
nvidia-smi, nvml, sysfs: the driver's own matrix is the only source of exact GPU-NIC
levels, NVML fills what an old driver's matrix lacks (NUMA nodes), and sysfs adds NIC
details (net device, link layer, port state, addresses, NUMA node). Callers and tests
may name backends and pass their options (``options={"sysfs": {"root": tmp_path}}``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_topology.discovery.base import Backend, Runner, run_command
from gpu_topology.discovery.merge import merge
from gpu_topology.errors import BackendUnavailable, DiscoveryError
from gpu_topology.model import Topology

BACKENDS: dict[str, tuple[str, str]] = {
    # name: ("module:Class", what to install when the module's imports fail)
    "nvml": ("gpu_topology.discovery.nvml:NvmlBackend", "pip install 'dsplatform[nvml]' (nvidia-ml-py)"),
    "nvidia-smi": ("gpu_topology.discovery.nvidia_smi:NvidiaSmiBackend", "install nvidia-smi"),
    "sysfs": ("gpu_topology.discovery.sysfs:SysfsBackend", "run on Linux with /sys mounted"),
    "nccl-xml": ("gpu_topology.discovery.nccl_xml:NcclXmlBackend", "dump one with NCCL_TOPO_DUMP_FILE"),
}
AUTOMATIC = ("nvidia-smi", "nvml", "sysfs")
GPU_BACKENDS = ("nvidia-smi", "nvml")


def get_backend(name: str, **options: Any) -> Backend:
    """Instantiate backend ``name`` with ``options``; unknown names are an error."""
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown discovery backend {name!r}", hint="one of " + ", ".join(BACKENDS))
    target, hint = BACKENDS[name]
    module_name, cls_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(f"{name} discovery cannot be imported: {exc}", hint=hint) from exc
    backend: Backend = getattr(module, cls_name)(**options)
    return backend


def discover(
    backends: Sequence[str] | None = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> Topology:
    """Discover the local machine.

    ``backends`` lists backends to merge in order (the first one's values win); None
    picks automatically as described in the module docstring. ``options`` maps a
    backend name to its keyword arguments. Raises BackendUnavailable, naming every
    backend tried and what to install, when no backend can run.
    """
    options = options or {}
    reasons: list[str] = []
    if backends is not None:
        chosen = [get_backend(n, **options.get(n, {})) for n in backends]
        for backend in chosen:
            backend.require()
    else:
        chosen = _automatic(options, reasons)
    topology: Topology | None = None
    for backend in chosen:
        found = backend.discover()
        topology = found if topology is None else merge(topology, found)
    if topology is None:
        raise DiscoveryError("no discovery backend was chosen")
    if backends is None and not topology.gpus and chosen[0].name not in GPU_BACKENDS:
        raise BackendUnavailable(
            "found no NVIDIA GPU: " + "; ".join(reasons + ["sysfs lists no NVIDIA display/3D controller"])
        )
    return topology


def _automatic(options: Mapping[str, Mapping[str, Any]], reasons: list[str]) -> list[Backend]:
    chosen: list[Backend] = []
    for name in AUTOMATIC:
        try:
            backend = get_backend(name, **options.get(name, {}))
        except BackendUnavailable as exc:
            reasons.append(str(exc))
            continue
        reason = backend.unavailable_reason()
        if reason is None:
            chosen.append(backend)
        else:
            reasons.append(f"{name}: {reason} ({backend.install_hint})")
    if not chosen:
        raise BackendUnavailable("no topology discovery backend can run here: " + "; ".join(reasons))
    return chosen


__all__ = ["BACKENDS", "Backend", "Runner", "discover", "get_backend", "merge", "run_command"]
