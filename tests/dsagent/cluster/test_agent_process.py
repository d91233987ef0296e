"""``dsagent serve --kubernetes`` as a real process against the fake API server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsagent.api.client import AgentClient
from dsagent.errors import AgentUnreachable, NotFound
from tests.fake_apiserver import FakeApiServer, make_node, make_pod

NODE = "gpu-7"


def eventually(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def cluster_agent(apiserver: FakeApiServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    apiserver.create(make_node(NODE, annotations={"keep": "me"}))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": apiserver.url}}],
                "users": [{"name": "agent", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
            }
        )
    )
    source = tmp_path / "coco"
    source.mkdir()
    for i in range(5):
        (source / f"{i}.jpg").write_bytes(os.urandom(1000))
    sockets = Path(tempfile.mkdtemp(prefix="dsk-", dir="/tmp"))
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "DSAGENT_KUBERNETES": "1",
        # no disk floor: the test machine's own disk fullness must not decide the test
        # (the floor is tested in tests/dsagent/cache/test_disk_floor.py)
        "DSAGENT_RESERVE": "0",
        "DSAGENT_NODEFS_AVAILABLE": "0",
        "DSAGENT_NODE_NAME": NODE,
        "DSAGENT_PUBLISH_INTERVAL": "100ms",
        "DSAGENT_ROOT": str(tmp_path / "cache"),
        "DSAGENT_SOCKET": str(sockets / "dsagent.sock"),
        "DSAGENT_LOCAL_SOURCES": str(source),
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = open(tmp_path / "agent.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "dsagent", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    client = AgentClient(socket_path=sockets / "dsagent.sock", timeout=30)

    def healthy() -> bool:
        assert process.poll() is None, (tmp_path / "agent.log").read_text()
        try:
            return bool(client.health())
        except AgentUnreachable:
            return False

    try:
        eventually(healthy, what="the agent")
        yield {"process": process, "client": client, "source": str(source), "env": env, "log": tmp_path / "agent.log"}
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()
        shutil.rmtree(sockets, ignore_errors=True)


def annotations(apiserver: FakeApiServer) -> dict[str, str]:
    node = apiserver.get("nodes", NODE)
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


def task(client: AgentClient, uid: str) -> dict[str, Any] | None:
    try:
        return client.get_task(uid)
    except NotFound:
        return None


def test_the_daemonset_agent_end_to_end(apiserver: FakeApiServer, cluster_agent: dict[str, Any]) -> None:
    client: AgentClient = cluster_agent["client"]
    eventually(lambda: "dsagent.io/inventory" in annotations(apiserver), what="the inventory annotation")
    assert json.loads(annotations(apiserver)["dsagent.io/inventory"])["node"] == NODE

    datasets = json.dumps([{"name": "coco", "source": cluster_agent["source"]}])
    pod = apiserver.create(make_pod("train", node_name=NODE, annotations={"dsagent.io/datasets": datasets}))
    uid = pod["metadata"]["uid"]
    eventually(lambda: (task(client, uid) or {}).get("state") == "ready", what="caching at bind time")
    eventually(lambda: '"coco"' in annotations(apiserver)["dsagent.io/inventory"], what="the dataset published")

    # an init-container of this pod repeats the request: accepted, same task
    env = {**cluster_agent["env"], "DSAGENT_DATASETS": datasets, "DSAGENT_TASK_ID": uid}
    ok = subprocess.run(
        [sys.executable, "-m", "dsagent.cli", "cache", "--from-env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr

    # a task id of a pod that is not on this node is refused
    foreign = {**env, "DSAGENT_TASK_ID": str(uuid.uuid4())}
    refused = subprocess.run(
        [sys.executable, "-m", "dsagent.cli", "cache", "--from-env", "--no-wait"],
        env=foreign,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and f"not a pod on node {NODE}" in refused.stderr

    apiserver.delete("pods", "train")
    eventually(lambda: task(client, uid) is None, what="the release")

    process: subprocess.Popen[bytes] = cluster_agent["process"]
    process.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert process.wait(30) in (0, -signal.SIGTERM)
    assert annotations(apiserver) == {"keep": "me"}  # the graceful stop took its annotations away
