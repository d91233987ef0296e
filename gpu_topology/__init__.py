"""gpu_topology: GPUs, NICs, NUMA nodes and their links; GPU-set scoring; RoCE classes.

A library: it imports nothing from Kubernetes, the web stack or the rest of dsplatform.
"""

__all__: list[str] = []
