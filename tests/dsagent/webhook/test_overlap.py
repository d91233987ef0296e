"""docs/design.md#rule-3: caching overlaps the image pull, so the pod starts no later than without us.

A simulated kubelet (:mod:`dsagent.kube.testing`) runs the webhook's mutated pod against
a real agent process, with the real ``dsctl`` in the cache container and the real
wrapped command in the app container. Image pulls are gates the test controls, so the
assertions are about order, never about time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsagent.api.client import AgentClient
from dsagent.errors import AgentUnreachable
from dsagent.kube.testing import SimulatedKubelet
from dsagent.webhook.mutation import Injection, ResolvedDataset, mutate
from tools.support.fake_apiserver import json_patch, make_pod
from tools.support.harness import unix_socket_listening

pytestmark = pytest.mark.slow

# The training command: list its dataset at the stable path $DSAGENT_DATASETS_DIR/<name>.
TRAINING = [
    sys.executable,
    "-c",
    "import os; print('training on', sorted(os.listdir(os.path.join(os.environ['DSAGENT_DATASETS_DIR'], 'imagenet'))))",
]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real agent process on a short socket path, allowed to read one local source."""
    source = tmp_path / "imagenet"
    for i in range(20):
        (source / f"class{i % 4}").mkdir(parents=True, exist_ok=True)
        (source / f"class{i % 4}" / f"{i}.jpg").write_bytes(os.urandom(2000))
    sockets = Path(tempfile.mkdtemp(prefix="dsk-", dir="/tmp"))
    root = tmp_path / "cache"
    log = open(tmp_path / "agent.log", "wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsagent",
            "serve",
            "--root",
            str(root),
            "--socket",
            str(sockets / "dsagent.sock"),
            "--local-source",
            str(source),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if not unix_socket_listening(sockets / "dsagent.sock"):
                    raise AgentUnreachable("not listening yet")
                with AgentClient(socket_path=sockets / "dsagent.sock", timeout=5) as client:
                    if client.health():
                        break
            except AgentUnreachable:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "agent.log").read_text()) from None
                time.sleep(0.05)
        yield {"source": str(source), "sockets": str(sockets), "root": str(root)}
    finally:
        process.terminate()
        process.wait(20)
        log.close()
        shutil.rmtree(sockets, ignore_errors=True)


def mutated_pod(agent: dict[str, Any], *, wait: str | None = None) -> dict[str, Any]:
    annotations = {"dsagent.io/datasets": "imagenet"} | ({"dsagent.io/wait": wait} if wait else {})
    pod = make_pod("train", annotations=annotations)
    pod["metadata"]["uid"] = "6c1f9d2e-3b4a-4c5d-8e7f-9a0b1c2d3e4f"
    pod["spec"]["containers"][0]["command"] = TRAINING
    injection = Injection(image="dsplatform", socket_dir="/run/dsagent", cache_dir="/var/lib/dsagent")
    result: dict[str, Any] = json_patch(pod, mutate(pod, (ResolvedDataset("imagenet", agent["source"]),), injection))
    return result


def kubelet_for(pod: dict[str, Any], agent: dict[str, Any], pull: Any) -> SimulatedKubelet:
    return SimulatedKubelet(
        pod,
        pull=pull,
        host_paths={"/run/dsagent": agent["sockets"], "/var/lib/dsagent": agent["root"]},
        extra_env={"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")},
    )


def wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_caching_finishes_during_the_app_image_pull_and_training_starts_right_after_it(agent: dict[str, Any]) -> None:
    pod = mutated_pod(agent)
    pulls: list[str] = []
    kubelet: SimulatedKubelet

    def pull(image: str) -> None:
        pulls.append(image)
        if image != "dsplatform":  # the app image: a pull that outlasts caching
            wait_for(Path(kubelet.volume_dirs["dsagent-run"]) / "ready")

    kubelet = kubelet_for(pod, agent, pull)
    runs = kubelet.run()
    train = runs["train"]
    assert train.returncode == 0, train.stderr
    assert "training on ['class0', 'class1', 'class2', 'class3']" in train.stdout
    assert "waiting for datasets" not in train.stderr  # ready before the image was: no wait at all
    assert pulls == ["dsplatform", pod["spec"]["containers"][0]["image"]]
    cache = runs["dsagent-cache"]
    assert cache.started <= train.pull_started  # the sidecar did not hold back the app's pull


def test_a_blocking_init_container_would_serialise_caching_and_the_pull(agent: dict[str, Any]) -> None:
    pod = mutated_pod(agent, wait="init")
    kubelet = kubelet_for(pod, agent, lambda image: None)
    runs = kubelet.run()
    assert runs["train"].returncode == 0, runs["train"].stderr
    assert runs["dsagent-cache"].exited is not None
    assert runs["dsagent-cache"].exited <= runs["train"].pull_started  # why overlap is the default
