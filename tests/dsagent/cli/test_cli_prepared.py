"""``PUT/GET/DELETE /v1/preparations`` through :class:`AgentClient` and ``dsctl ls`` against
a real agent process (docs/design.md#next-job-preparation)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.api.client import AgentClient
from dsagent.errors import InvalidInput, NotFound
from dsagent.format.bundles.bundle import pack
from tests.dsagent.cli.test_agent_process import make_dataset
from tests.dsagent.cli.test_cli_cache import dsctl
from tools.support.harness import AgentProcess

pytestmark = pytest.mark.slow

UID = "5f0c6a4e-1b2c-4d5e-8f90-123456789abc"


@pytest.fixture
def agent(agent_factory: Any, tmp_path: Path) -> tuple[AgentProcess, dict[str, Any]]:
    nfs = tmp_path / "nfs"
    make_dataset(nfs / "next", 6, 20_000)
    pack(nfs / "next", nfs / "store", name="next", max_files=2)
    return agent_factory(local_sources=(nfs,), tcp=True), {
        "name": "next",
        "source": str(nfs / "next"),
        "bundles": str(nfs / "store"),
    }


def test_a_preparation_is_reserved_listed_fetched_and_handed_over(
    agent: tuple[AgentProcess, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    process, dataset = agent
    sock = str(process.socket)
    with AgentClient(socket_path=sock) as client:
        view = client.prepare(UID, [dataset], first_threshold=1.0)
        assert view["phase"] == 1 and view["state"] == "reserved" and view["reservedBytes"] > 120_000
        assert client.prepare(UID, [dataset], first_threshold=1.0)["reservedBytes"] == view["reservedBytes"]
        assert client.datasets()["datasets"] == []  # phase 1 fetches no data
        code, out, err = dsctl(capsys, "ls", "--socket", sock)
        assert code == 0, err
        assert "reserved for next tasks" in out
        row = next(line for line in out.splitlines() if line.startswith(UID))
        assert row.split()[1:3] == ["1", "reserved"] and "next" in row
        code, out, _ = dsctl(capsys, "ls", "--socket", sock, "-o", "json")
        assert json.loads(out)["preparations"][0]["task"] == UID

        view = client.prepare(UID, [dataset], phase=2, first_threshold=1.0)
        assert view["phase"] == 2
        deadline = time.monotonic() + 60
        while client.preparation(UID)["state"] != "prepared" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.preparation(UID)["state"] == "prepared"
        assert [d["name"] for d in client.datasets()["datasets"]] == ["next"]

        record = client.submit_task(UID, [dataset], wait=60)  # the pod itself: checked, then ready
        assert record["state"] == "ready"
        deadline = time.monotonic() + 30
        while client.preparations() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.preparations() == []
        with pytest.raises(NotFound):
            client.release_preparation(UID)
        with pytest.raises(InvalidInput):
            client.prepare(UID, [{"name": "raw", "source": dataset["source"]}])  # not packed


def test_only_an_operator_prepares(agent: tuple[AgentProcess, dict[str, Any]]) -> None:
    process, dataset = agent
    with httpx.Client(base_url=process.url, timeout=30) as anonymous:
        answer = anonymous.put(f"/v1/preparations/{UID}", json={"datasets": [dataset]})
        assert answer.status_code == 401 and answer.json()["code"] == "unauthorized"
        answer = anonymous.put(f"/v1/preparations/{UID}", json={"datasets": [dataset], "phase": 3})
        assert answer.status_code in (400, 401)
        assert anonymous.get("/v1/preparations").status_code == 401  # they name other tenants' pods
        assert anonymous.get(f"/v1/preparations/{UID}").status_code == 401
