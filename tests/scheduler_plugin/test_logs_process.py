"""The extender's log as an operator reads it: a real ``python -m scheduler_plugin``
with ``DSEXT_LOG_FORMAT=json``: uvicorn's lines and the access log in the same JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tools.support.harness import held_port

pytestmark = pytest.mark.slow


def _run_extender(tmp_path: Path, env: dict[str, str]) -> list[str]:
    hold = ExitStack()
    port = hold.enter_context(held_port())  # nobody else's until the extender listens on it
    log = tmp_path / "extender.log"
    full = {**os.environ, "DSEXT_HOST": "127.0.0.1", "DSEXT_PORT": str(port), **env}
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "scheduler_plugin"], env=full, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
                break
            except httpx.HTTPError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        hold.close()
        assert httpx.post(f"http://127.0.0.1:{port}/filter", content=b"not json", timeout=30).status_code == 400
    finally:
        hold.close()
        process.terminate()
        process.wait(60)
    return [line for line in log.read_text().splitlines() if line.strip()]


def test_json_lines_only_with_uvicorns_own_and_the_access_log(tmp_path: Path) -> None:
    lines = _run_extender(tmp_path, {"DSEXT_LOG_FORMAT": "json", "DSEXT_ACCESS_LOG": "1"})
    docs = [json.loads(line) for line in lines]  # a line that is not JSON fails here
    assert {"uvicorn.error", "uvicorn.access", "scheduler_plugin.app"} <= {doc["logger"] for doc in docs}, docs
    access = {(doc["method"], doc["path"], doc["status"]) for doc in docs if doc["logger"] == "uvicorn.access"}
    assert {("GET", "/healthz", 200), ("POST", "/filter", 400)} <= access
    (refused,) = [doc for doc in docs if doc["logger"] == "scheduler_plugin.app"]
    assert refused["level"] == "warning" and refused["message"].startswith("filter: ")


def test_text_by_default_with_uvicorn_in_the_same_format_and_no_access_log(tmp_path: Path) -> None:
    lines = _run_extender(tmp_path, {})
    assert any(" INFO uvicorn.error: Application startup complete." in line for line in lines), lines
    assert not [line for line in lines if "uvicorn.access" in line or "/healthz" in line]
