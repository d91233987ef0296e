#!/usr/bin/env bash
# The native loops built with AddressSanitizer and UBSan (gcc or clang: $CC) into a
# temporary directory, then the native tests and the differential fuzz of the C loops
# against the pure ones run on that build (tests/conftest.py loads it in place of the
# in-tree one: DSPLATFORM_TEST_NATIVE). The ASan runtime is preloaded, as the interpreter
# is not built with it. `make native-asan`; CI runs it after `make test` (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PY:-.venv/bin/python}
cc=${CC:-gcc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CC="$cc" CFLAGS="$sanitize -g -O1" LDFLAGS="$sanitize" DSPLATFORM_BUILD_NATIVE=require \
    "$py" setup.py -q build_ext --build-lib "$work/lib" --build-temp "$work/tmp"
extension=$(find "$work/lib" -name '_native*.so' | head -n 1)
asan=$("$cc" -print-file-name=libasan.so)
[ -f "$asan" ] || { echo "native-asan: $cc has no ASan runtime ($asan)" >&2; exit 1; }
if command -v nm >/dev/null; then  # instrumented, or the step would prove nothing
    symbols=$(nm -u "$extension")
    grep -q __asan_report <<<"$symbols" || { echo "native-asan: $extension has no ASan checks" >&2; exit 1; }
    grep -q __ubsan_handle <<<"$symbols" || { echo "native-asan: $extension has no UBSan checks" >&2; exit 1; }
fi
echo "native-asan: $extension (preloading $asan)"
# detect_leaks=0: the interpreter's own allocations at exit are not the extension's; --capture=sys:
# a report on fd 2 reaches the log (pytest's fd capture would swallow it with the process)
env LD_PRELOAD="$asan" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    DSPLATFORM_TEST_NATIVE="$extension" PYTHONDONTWRITEBYTECODE=1 \
    timeout 300 "$py" -m pytest -q -p no:cacheprovider -n 0 -x --capture=sys \
    tests/dsagent/format/test_native.py tests/dsagent/format/test_native_unpack.py \
    tests/dsagent/format/test_native_pack.py tests/dsagent/format/test_native_layout.py \
    tests/dsagent/format/test_native_fuzz.py tests/tools/test_fuzz_native_unpack.py \
    tests/dsagent/cache/test_ready_check.py tests/dsagent/format/test_native_walk.py
