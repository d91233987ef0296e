"""The kubelet APIs' .proto files and their generated gRPC stubs (tools/proto/regen.sh).
"""
