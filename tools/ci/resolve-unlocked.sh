#!/usr/bin/env bash
# What a user installing without the lock meets: pyproject.toml's ranges resolved by pip, the
# one Python bundles (ensurepip) and the newest, in fresh venvs, with no pip cache. Fails when a
# resolution fails or takes longer than RESOLVE_LIMIT seconds: a dependency release that sends
# pip backtracking through hundreds of wheels fails here instead of on a user's machine.
# Run from the repository root (make resolve-check); needs the package index, nothing else.
set -euo pipefail
limit=${RESOLVE_LIMIT:-240}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

resolve() {  # $1: venv, $2: the target, e.g. ".[all]"
    local started=$SECONDS
    if ! timeout "$limit" "$1/bin/python" -m pip install --quiet --dry-run --ignore-installed "$2" \
        >"$work/log" 2>&1; then
        tail -n 20 "$work/log" >&2
        echo "resolve-check: pip $("$1/bin/python" -m pip --version | cut -d' ' -f2) could not resolve $2 within ${limit}s" >&2
        return 1
    fi
    echo "resolve-check: pip $("$1/bin/python" -m pip --version | cut -d' ' -f2) resolved $2 in $((SECONDS - started))s"
}

"$python" -m venv "$work/bundled"
"$python" -m venv "$work/newest"
"$work/newest/bin/python" -m pip install --quiet --upgrade pip
for venv in "$work/bundled" "$work/newest"; do
    resolve "$venv" ".[all]"
    resolve "$venv" ".[test]"
done
