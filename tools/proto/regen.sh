#!/bin/sh
# Regenerate the kubelet API stubs in dsagent/nodeplugins/proto/ from their .proto files.
#
#   tools/proto/regen.sh [OUTDIR]     (OUTDIR defaults to the repository root)
#
# Needs grpcio-tools (pip install '.[test]'). tests/dsagent/nodeplugins/test_proto.py runs this
# into a temporary directory and fails when the committed stubs differ from a fresh run.
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here}
python=${PYTHON:-python3}
cd "$here"
mkdir -p "$out/dsagent/nodeplugins/proto"
"$python" -m grpc_tools.protoc -I . \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    dsagent/nodeplugins/proto/deviceplugin_v1beta1.proto dsagent/nodeplugins/proto/podresources_v1.proto
