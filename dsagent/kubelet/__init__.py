"""dsagent.kubelet: the agent's kubelet-facing gRPC edge (docs/design.md#roce-allocation).

A peer of ``api`` and ``kube``: it may import ``cache``, ``format`` and ``gpu_topology``,
never ``api``, ``cli`` or ``kube``. ``dsagent serve`` (``dsagent.cli.agent``) wires it.

    allocation     classes -> resources, the allocation ledger, NCCL settings (pure)
    deviceplugin   the device plugin (API v1beta1): servers, registration, Allocate
    podresources   the pod-resources API (v1) client and the free-GPU rule
    proto/         the kubelet's .proto files and their generated stubs (tools/proto/regen.sh)
"""
