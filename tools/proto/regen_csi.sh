#!/bin/sh
# Regenerate the CSI v1 Python stubs (dsagent/nodeplugins/proto/csi/) from csi.proto.
# Usage: tools/proto/regen_csi.sh [OUT_DIR]   (default: the repository itself)
# OUT_DIR lets tests/dsagent/nodeplugins/csi/test_csi_stubs.py generate into a scratch directory and
# compare. Needs grpcio-tools (pip install grpcio-tools); PYTHON picks the interpreter.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT}
PYTHON=${PYTHON:-python3}
cd "$ROOT"
# -I . keeps the proto's path inside the package, so the generated gRPC module imports
# dsagent.nodeplugins.proto.csi.csi_pb2 (not a top-level csi_pb2).
"$PYTHON" -m grpc_tools.protoc -I . --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" \
    dsagent/nodeplugins/proto/csi/csi.proto
