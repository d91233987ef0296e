"""grpcio and protobuf are the ``kubelet`` extra: dsctl and every module outside
``dsagent.nodeplugins`` import without them, and an agent asked for a kubelet plugin without them
stops at start-up with one line that names the extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# A None entry in sys.modules makes `import grpc` raise ImportError(name='grpc'), as on a
# machine where `pip install dsplatform` left the extra out.
WITHOUT_GRPC = "import sys; sys.modules['grpc'] = None; sys.modules['google.protobuf'] = None; "


def run_without_grpc(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_GRPC + code, *args], capture_output=True, text=True, timeout=120
    )


def test_every_module_but_the_kubelet_plugins_imports_without_grpc() -> None:
    walk = (
        "import importlib, pkgutil\n"
        "for top in ('dsplatform', 'dsagent', 'scheduler_plugin', 'scheduling', 'gpu_topology'):\n"
        "    package = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(package.__path__, top + '.'):\n"
        "        if not info.name.startswith('dsagent.nodeplugins') and not info.name.endswith('__main__'):\n"
        "            importlib.import_module(info.name)\n"
        "print('imported')\n"
    )
    result = run_without_grpc(walk)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_dsctl_runs_without_grpc(tmp_path: Path) -> None:
    result = run_without_grpc("from dsagent.cli import main; main(sys.argv[1:])", "digest", str(tmp_path))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("flags", "env", "feature"),
    [
        ([], {"DSAGENT_CSI_SOCKET": "csi.sock"}, "CSI node plugin"),
        (["--device-plugin"], {}, "device plugin"),
        (["--kubernetes"], {}, "cluster mode"),
    ],
)
def test_a_kubelet_plugin_without_the_extra_stops_the_agent_in_one_line(
    tmp_path: Path, flags: list[str], env: dict[str, str], feature: str
) -> None:
    environ = {**os.environ, **{k: str(tmp_path / v) if k.endswith("SOCKET") else v for k, v in env.items()}}
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_GRPC + "from dsagent.cli.agent import main; main(sys.argv[1:])", "serve"]
        + ["--root", str(tmp_path / "root"), "--socket", str(tmp_path / "agent.sock"), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert feature in lines[0] and "dsplatform[kubelet]" in lines[0]
    assert not (tmp_path / "agent.sock").exists()  # stopped before binding anything
