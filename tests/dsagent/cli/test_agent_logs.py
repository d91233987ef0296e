"""The agent's log as an operator reads it: a real ``dsagent serve`` process in
JSON or text, uvicorn's lines in the same format as ours, and the access log only on request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _fail_one_dataset(agent: Any, tmp_path: Path) -> None:
    with agent.client() as client:
        record = client.submit_task("t-missing", [{"name": "gone", "source": str(tmp_path / "nfs" / "nope")}], wait=30)
    assert record["datasets"][0]["state"] == "failed", record


def test_json_format_makes_every_line_one_object_uvicorns_and_the_access_log_included(
    agent_factory: Any, tmp_path: Path
) -> None:
    (tmp_path / "nfs").mkdir()
    agent = agent_factory(
        local_sources=(tmp_path / "nfs",), env={"DSAGENT_LOG_FORMAT": "json", "DSAGENT_ACCESS_LOG": "true"}
    )
    _fail_one_dataset(agent, tmp_path)
    agent.stop()  # (uvicorn re-raises SIGTERM: the code is -15 by design)
    lines = [line for line in agent.log.read_text().splitlines() if line.strip()]
    docs = [json.loads(line) for line in lines]  # a line that is not JSON fails here
    loggers = {doc["logger"] for doc in docs}
    assert "uvicorn.error" in loggers, loggers  # start-up and shutdown lines, in our format
    access = [doc for doc in docs if doc["logger"] == "uvicorn.access"]
    assert any(doc["path"] == "/healthz" and doc["status"] == 200 and doc["method"] == "GET" for doc in access), access
    assert any(doc["path"].startswith("/v1/tasks/t-missing") for doc in access), access
    (failed,) = [doc for doc in docs if doc["message"].startswith("dataset failed")]
    assert failed["level"] == "warning"
    assert (failed["code"], failed["task"], failed["dataset"]) == ("not_found", "t-missing", "gone")
    assert failed["source"] == str(tmp_path / "nfs" / "nope")


def test_the_default_is_text_in_one_format_and_no_access_log(agent_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "nfs").mkdir()
    agent = agent_factory(local_sources=(tmp_path / "nfs",))
    _fail_one_dataset(agent, tmp_path)
    agent.stop()
    lines = [line for line in agent.log.read_text().splitlines() if line.strip()]
    assert any(" INFO uvicorn.error: Application startup complete." in line for line in lines), lines
    assert not [line for line in lines if "uvicorn.access" in line or "GET /healthz" in line]
    assert not [line for line in lines if line.startswith("{")]
    assert any(" WARNING dsagent: dataset failed: code=not_found task=t-missing" in line for line in lines), lines


def test_the_flags_win_over_the_environment(agent_factory: Any, tmp_path: Path) -> None:
    from tools.support.harness import AgentProcess

    agent = AgentProcess(tmp_path / "flags", env={"DSAGENT_LOG_FORMAT": "text", "DSAGENT_ACCESS_LOG": "1"})
    agent.args += ["--log-format", "json", "--no-access-log"]
    agent.start()
    try:
        with agent.client() as client:
            assert client.health()
    finally:
        agent.stop()
    docs = [json.loads(line) for line in agent.log.read_text().splitlines() if line.strip()]
    assert docs and not [doc for doc in docs if doc["logger"] == "uvicorn.access"]
