"""The device plugin (kubelet API v1beta1) and the pod-resources client (v1).

plugin        one gRPC server per resource, registration with the kubelet, Allocate
allocation    classes -> resources, the allocation ledger, NCCL settings (pure)
podresources  the pod-resources API client and the free-GPU rule
"""
