"""A ``DSEXT_*`` variable the extender does not declare stops it at start-up:
one line naming the close matches, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler_plugin.errors import SettingsError
from scheduler_plugin.settings import refuse_unknown

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_the_extender_refuses_an_unknown_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSEXT_")}
    env.update(DSEXT_PORTT="9999", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "scheduler_plugin"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "unknown setting DSEXT_PORTT; did you mean DSEXT_PORT?" in lines[0]


def test_declared_names_pass() -> None:
    refuse_unknown({"DSEXT_PORT": "1", "DSEXT_JOB_TTL": "1h", "DSEXT_WEIGHTS": "{}", "DSAGENT_X": "y"})
    with pytest.raises(SettingsError, match="unknown setting DSEXT_WEIGHT; did you mean DSEXT_WEIGHTS?"):
        refuse_unknown({"DSEXT_WEIGHT": "{}"})
