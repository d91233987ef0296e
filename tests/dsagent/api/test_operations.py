"""Evictions and releases are operations: a slow one answers 202 and can be followed to its
end; a client never reports a retryable failure for an action that went on.

The agent is the real app under uvicorn on loopback with a real :class:`CacheService`;
where an eviction must be slow for the test, the service's ``evict`` waits on an event the
test sets (deleting a million files is what that stands for). The end-to-end case runs a
real ``dsagent serve`` and a real dataset, with the client asking the agent to hold each
request for no time at all, so that every eviction goes through the operation path.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.api import create_app, operations
from dsagent.api.client import AgentClient
from dsagent.cache.service import CacheService, EvictionResult
from dsagent.cache.settings import Settings
from dsagent.errors import Conflict, StillRunning
from tests.scheduler_plugin.server import serving
from tools.support.harness import ADMIN_TOKEN, LoopbackServer, eventually

TOKEN = "operations-test-token-0123"


class SlowEvictions:
    """Stands in for ``CacheService.evict``: each call waits until the test lets it end."""

    def __init__(self, error: Exception | None = None) -> None:
        self.go = threading.Event()
        self.calls = 0
        self.error = error
        self.finished = 0  # calls that ran to their end (none cancelled)

    async def __call__(self, **kwargs: Any) -> EvictionResult:
        self.calls += 1
        while not self.go.is_set():
            await asyncio.sleep(0.01)
        self.finished += 1
        if self.error is not None:
            raise self.error
        return EvictionResult(evicted=(), freed_bytes=0, dry_run=bool(kwargs.get("dry_run")))


@pytest.fixture
def agent_app(tmp_path: Path) -> Iterator[tuple[str, CacheService]]:
    settings = Settings(root=tmp_path / "root", admin_token=TOKEN)
    svc = CacheService(settings)
    with serving(create_app(settings, service=svc)) as url:
        yield url, svc


def operator(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)


def test_a_slow_eviction_answers_202_and_its_operation_finishes(
    agent_app: tuple[str, CacheService], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, svc = agent_app
    slow = SlowEvictions()
    monkeypatch.setattr(svc, "evict", slow)
    with operator(url) as http:
        answer = http.post("/v1/evict", params={"wait": 0.2}, json={"mode": "unused"})
        assert answer.status_code == 202, answer.text
        op = answer.json()
        assert answer.headers["location"] == op["href"] == f"/v1/operations/{op['id']}"
        assert (op["kind"], op["target"], op["state"], op["result"]) == ("evict", "mode=unused", "running", None)
        assert http.get(op["href"]).json()["state"] == "running"
        slow.go.set()
        done = http.get(op["href"], params={"wait": 10}).json()
        assert done["state"] == "succeeded"
        assert done["result"] == {"dryRun": False, "freedBytes": 0, "evicted": []}
        assert done["finishedAt"] is not None and done["error"] is None
    assert slow.calls == 1


def test_an_eviction_that_ends_within_wait_answers_its_result_as_before(
    agent_app: tuple[str, CacheService], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, svc = agent_app
    slow = SlowEvictions()
    slow.go.set()
    monkeypatch.setattr(svc, "evict", slow)
    with operator(url) as http:
        answer = http.post("/v1/evict", json={"mode": "idle", "dryRun": True})
        assert answer.status_code == 200
        assert answer.json() == {"dryRun": True, "freedBytes": 0, "evicted": []}


def test_a_failed_operation_carries_its_error_and_the_client_raises_it(
    agent_app: tuple[str, CacheService], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, svc = agent_app
    slow = SlowEvictions(Conflict("dataset 'x' is in use by a task", hint="release the task first"))
    monkeypatch.setattr(svc, "evict", slow)
    monkeypatch.setattr("dsagent.api.client.OPERATION_POLL", 0.1)
    threading.Timer(0.5, slow.go.set).start()
    with AgentClient(url=url, token=TOKEN) as client, pytest.raises(Conflict, match="in use") as raised:
        client.evict_dataset("x")
    assert raised.value.hint == "release the task first"
    with operator(url) as http:
        # the route answers the error itself when it fails within wait, as before operations
        answer = http.delete("/v1/datasets/x", params={"wait": 5})
        assert answer.status_code == 409 and answer.json()["code"] == "conflict"


def test_the_client_stops_waiting_with_still_running_not_a_retryable_failure(
    agent_app: tuple[str, CacheService], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, svc = agent_app
    slow = SlowEvictions()
    monkeypatch.setattr(svc, "evict", slow)
    monkeypatch.setattr("dsagent.api.client.OPERATION_POLL", 0.1)
    seen: list[dict[str, Any]] = []
    with AgentClient(url=url, token=TOKEN) as client:
        with pytest.raises(StillRunning) as raised:
            client.evict(mode="unused", timeout=0.5, progress=seen.append)
        op_id = raised.value.details["operation"]
        assert raised.value.exit_code == 14 and f"dsctl operation {op_id}" in (raised.value.hint or "")
        assert seen and all(op["state"] == "running" and op["id"] == op_id for op in seen)
        slow.go.set()
        assert client.operation(op_id, wait=10)["state"] == "succeeded"  # it went on, and ended


class Watched:
    """Wraps a wait the routes make for their client: records how each one ended."""

    def __init__(self, wait: Any) -> None:
        self.wait, self.ends = wait, []  # type: list[str]

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            answer = await self.wait(*args, **kwargs)
        except asyncio.CancelledError:
            self.ends.append("cancelled")
            raise
        self.ends.append("answered")
        return answer


@pytest.mark.parametrize("route", ["evict", "operation", "task"])
def test_a_long_poll_whose_client_goes_stops_waiting_and_the_work_goes_on(
    agent_app: tuple[str, CacheService], monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """A client that gives up on ``?wait=`` closes its connection: the agent stops holding
    its answer at once (uvicorn cancels no handler by itself), not after the wait; what it
    waited for (the eviction) goes on."""
    url, svc = agent_app
    slow = SlowEvictions()
    monkeypatch.setattr(svc, "evict", slow)
    waits = Watched(operations.Operations.wait)
    monkeypatch.setattr(operations.Operations, "wait", lambda ops, op, seconds: waits(ops, op, seconds))
    tasks = Watched(lambda task_id, wait: asyncio.sleep(wait))  # a task whose work runs the whole wait
    monkeypatch.setattr(svc, "get_task", tasks)
    with operator(url) as http:
        if route == "operation":
            op = http.post("/v1/evict", params={"wait": 0}, json={"mode": "unused"}).json()
            waits.ends.clear()
        with pytest.raises(httpx.ReadTimeout):
            if route == "evict":
                http.post("/v1/evict", params={"wait": 60}, json={"mode": "unused"}, timeout=0.5)
            elif route == "operation":
                http.get(op["href"], params={"wait": 60}, timeout=0.5)
            else:
                http.get("/v1/tasks/gone-client", params={"wait": 60}, timeout=0.5)
        watched = tasks if route == "task" else waits
        eventually(lambda: watched.ends, 10, "the agent to stop waiting for a client that went")
        assert watched.ends == ["cancelled"]
        if route != "task":
            slow.go.set()  # the eviction itself was not cancelled: it ends
            eventually(lambda: slow.finished == 1, 10, "the eviction to go on to its end")
            assert slow.calls == 1


def test_operations_need_the_operator_and_are_bounded(
    agent_app: tuple[str, CacheService], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, svc = agent_app
    slow = SlowEvictions()
    monkeypatch.setattr(svc, "evict", slow)
    with operator(url) as http, httpx.Client(base_url=url, timeout=30) as anonymous:
        assert anonymous.post("/v1/evict", json={"mode": "unused"}).status_code == 401
        ids = []
        for _ in range(operations.MAX_RUNNING):
            answer = http.post("/v1/evict", params={"wait": 0}, json={"mode": "unused"})
            assert answer.status_code == 202
            ids.append(answer.json()["id"])
        refused = http.post("/v1/evict", params={"wait": 0}, json={"mode": "unused"})
        assert refused.status_code == 503 and refused.json()["code"] == "unavailable"
        assert anonymous.get(f"/v1/operations/{ids[0]}").status_code == 401  # nor may it read one
        assert http.get("/v1/operations/evict-0000000000000000").status_code == 404
        assert http.post("/v1/evict", params={"wait": 61}, json={"mode": "unused"}).status_code == 400
        slow.go.set()
        assert all(http.get(f"/v1/operations/{i}", params={"wait": 10}).json()["state"] == "succeeded" for i in ids)


def test_dsctl_evict_follows_a_real_eviction_through_its_operation(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real agent and dataset; the client asks for no hold at all (``wait=0``), so the
    agent answers 202 and dsctl's client follows the operation to the eviction's result."""
    from tests.dsagent.cli.test_agent_process import packed

    www, url, _ = loopback
    request = packed(www, url, "ds1", files=200, size=2_000, seed=5)[1]
    agent = agent_factory(tcp=True)
    monkeypatch.setattr("dsagent.api.client.OPERATION_POLL", 0.0)
    seen: list[dict[str, Any]] = []
    with AgentClient(url=f"http://127.0.0.1:{agent.port}", token=ADMIN_TOKEN) as client:
        client.submit_task("t1", [request], wait=30)
        client.release_task("t1")
        result = client.evict_dataset("ds1", progress=seen.append)
        assert [v["name"] for v in result["evicted"]] == ["ds1"]
        assert result["freedBytes"] > 0
        assert client.datasets()["datasets"] == []
    assert all(op["kind"] == "evict" and op["target"] == "names=ds1" for op in seen)


def test_dsctl_evict_prints_json_and_exits_0(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    from tests.dsagent.cli.test_agent_process import packed

    www, url, _ = loopback
    request = packed(www, url, "ds2", files=20, size=1_000, seed=6)[1]
    agent = agent_factory()
    with AgentClient(socket_path=agent.socket) as client:
        client.submit_task("t2", [request], wait=30)
    env = {"PATH": "/usr/bin:/bin", "DSAGENT_SOCKET": str(agent.socket), "HOME": str(tmp_path)}
    dsctl = [sys.executable, "-m", "dsagent.cli"]
    busy = subprocess.run([*dsctl, "evict", "ds2", "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert busy.returncode == 4 and busy.stderr.count("error:") == 1  # in use: a conflict, one line
    assert "in use by task t2" in busy.stderr and "dsctl release t2" in busy.stderr  # which task, and the fix
    subprocess.run([*dsctl, "release", "t2"], env=env, check=True, capture_output=True, timeout=60)
    done = subprocess.run([*dsctl, "evict", "ds2", "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [v["name"] for v in json.loads(done.stdout)["evicted"]] == ["ds2"]


def test_ctrl_c_in_dsctl_cache_says_the_caching_goes_on_and_how_to_release(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path
) -> None:
    import signal
    import time

    from tests.dsagent.cli.test_agent_process import packed

    www, url, server = loopback
    request = packed(www, url, "slow", files=8, size=1_000, seed=7)[1]
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 5.0)  # still fetching when Ctrl-C comes
    agent = agent_factory()
    env = {"PATH": "/usr/bin:/bin", "DSAGENT_SOCKET": str(agent.socket), "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsagent.cli", "cache", f"slow={request['source']}", "--bundles", request["bundles"],
         "--task", "t-ctrl-c"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a terminal's Ctrl-C, whatever this test process inherited (a child started with
        # SIGINT ignored keeps it ignored: Python installs its handler only over the default)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    with AgentClient(socket_path=agent.socket) as client:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the task exists: the agent took it
            try:
                client.get_task("t-ctrl-c")
                break
            except Exception:
                time.sleep(0.1)
        time.sleep(0.5)  # dsctl is waiting on the answer, not starting up
        assert client.get_task("t-ctrl-c")["state"] == "pending"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, (out, err, signal.getsignal(signal.SIGINT))
        assert "the agent goes on caching for task t-ctrl-c" in err and "dsctl release t-ctrl-c" in err
        assert "Traceback" not in err
        assert client.get_task("t-ctrl-c")["state"] in ("pending", "ready")  # it did go on


def _dsctl(url: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "DSAGENT_AGENT": url, "DSAGENT_ADMIN_TOKEN": TOKEN, "HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "dsagent.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_dsctl_operation_wait_exits_with_the_failed_operations_own_code(
    agent_app: tuple[str, CacheService], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, svc = agent_app
    slow = SlowEvictions(Conflict("dataset 'x' is in use by a task", hint="release the task first"))
    monkeypatch.setattr(svc, "evict", slow)
    with operator(url) as http:
        op_id = http.delete("/v1/datasets/x", params={"wait": 0}).json()["id"]
    threading.Timer(0.3, slow.go.set).start()
    for args in (["operation", op_id, "--wait"], ["operation", op_id, "--wait", "-o", "json"]):
        done = _dsctl(url, *args, home=tmp_path)
        assert done.returncode == 4, (args, done.stdout, done.stderr)  # a conflict's code, never 0
        assert done.stderr.count("error:") == 1 and "in use by a task" in done.stderr
    shown = _dsctl(url, "operation", op_id, home=tmp_path)  # looked at later: still its failure's code
    assert shown.returncode == 4 and "failed" in shown.stdout


@pytest.mark.parametrize("refused", [False, True], ids=["succeeds", "refused"])
def test_dsctl_evict_timeout_0_means_no_limit_and_a_refusal_keeps_its_code(
    agent_app: tuple[str, CacheService], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, refused: bool
) -> None:
    url, svc = agent_app
    slow = SlowEvictions(Conflict("dataset 'x' is in use by a task") if refused else None)
    monkeypatch.setattr(svc, "evict", slow)
    threading.Timer(1.0, slow.go.set).start()
    done = _dsctl(url, "evict", "--all-unused", "--timeout", "0", home=tmp_path)
    assert done.returncode == (4 if refused else 0), done.stderr  # waited for the end: never 14
    assert "still running" not in done.stderr
    help_text = _dsctl(url, "evict", "--help", home=tmp_path).stdout
    assert "0: no limit" in " ".join(help_text.split())
