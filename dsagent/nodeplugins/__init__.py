"""dsagent.nodeplugins: the agent's kubelet-facing gRPC plugins, over unix sockets.

A peer of ``api`` and ``cluster``: it may import ``cache``, ``format`` and ``gpu_topology``,
never ``api``, ``cli`` or ``nodeagent``. ``dsagent serve`` (``dsagent.nodeagent.serve``) wires it.

    csi/           the CSI node plugin: a pod's datasets as an inline volume (docs/design.md#csi)
    deviceplugin/  the device plugin and pod-resources client: GPUs and RoCE NICs per class
                   (docs/design.md#roce-allocation)
    proto/         the kubelet's .proto files and their generated stubs (tools/proto/regen.sh)
    grpcstatus     the one rule both plugins answer an error with: its own ``grpc_status``
"""
