"""``tools/mistakes/survey.py`` at its ``--smoke`` size, so that the survey cannot rot.

The full survey (90 mistakes, about two minutes) runs by hand (``python
tools/mistakes/survey.py``); here a handful of its cases run against real processes (a packed store, a running agent
and extender) and must each get the documented exit code and one clear line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.slow
def test_the_survey_runs_and_its_smoke_cases_are_answered_clearly() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "mistakes" / "survey.py"), "--smoke", "-v"],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    output = result.stdout + result.stderr
    counted = re.search(r"clear: (\d+) of (\d+) mistakes", result.stdout)
    assert counted is not None, output[-3000:]
    assert int(counted.group(2)) >= 5, output[-3000:]
    assert result.returncode == 0 and counted.group(1) == counted.group(2), output[-3000:]
