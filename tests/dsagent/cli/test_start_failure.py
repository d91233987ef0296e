"""When the agent's start-up fails (a companion, the service), dsagent serve ends
with that error's line and exit code; uvicorn made it exit 3, the code of not_found."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def test_a_failed_start_up_exits_with_its_errors_code(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAGENT_")}
    env.update(PYTHONPATH=str(REPO), DSAGENT_NODE_NAME="")  # cluster mode on no node: InvalidInput at start
    root = tmp_path / "cache"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dsagent",
            "serve",
            "--root",
            str(root),
            "--socket",
            str(tmp_path / "s.sock"),
            "--kubernetes",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("dsagent: error: cluster mode needs the node's name"), done.stderr
    assert not (tmp_path / "s.sock").exists()  # the socket is removed on the way out
