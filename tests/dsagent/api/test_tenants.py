"""Many namespaces on one node: what an operator request made for one Dataset may do.

A real ``dsagent serve`` over TCP with its admin token, asked as the Dataset controller asks
(``X-Dsagent-For: namespace/name``, docs/operator-guide/tenancy.md). Two namespaces each have a Dataset
``imagenet`` with its own source: one namespace's cleanup, and its new version, must leave
the other's copy alone; a namespace past its share of the cache gets no new pin; every such
request is an audit line and a count naming the Dataset.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tools.support.harness import ADMIN_TOKEN, AgentProcess

pytestmark = pytest.mark.slow  # each test starts an agent process

FOR = "X-Dsagent-For"


def write_dataset(root: Path, seed: int, files: int = 3, size: int = 40_000) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"f{i}.bin").write_bytes(bytes([seed, i]) * (size // 2))
    return root


def operator(agent: AgentProcess) -> httpx.Client:
    return httpx.Client(base_url=agent.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)


def pin(client: httpx.Client, task: str, acting_for: str | None, name: str, source: Path) -> httpx.Response:
    headers = {FOR: acting_for} if acting_for else {}
    return client.put(
        f"/v1/tasks/{task}",
        params={"wait": 30},
        json={"datasets": [{"name": name, "source": str(source)}]},
        headers=headers,
    )


def digests(client: httpx.Client, name: str) -> set[str]:
    answer = client.get(f"/v1/datasets/{name}")
    return {v["digest"] for v in answer.json()["versions"]} if answer.status_code == 200 else set()


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    return {
        "team-a": write_dataset(tmp_path / "nfs" / "team-a", 1),
        "tenant-evil": write_dataset(tmp_path / "nfs" / "evil", 2),
        "coco": write_dataset(tmp_path / "nfs" / "coco", 3),
        "extra": write_dataset(tmp_path / "nfs" / "extra", 4),
    }


def test_a_namespaces_cleanup_and_new_version_leave_another_namespaces_copy(
    tmp_path: Path, sources: dict[str, Path]
) -> None:
    agent = AgentProcess(tmp_path / "agent", tcp=True, local_sources=(tmp_path / "nfs",)).start()
    try:
        with operator(agent) as client:
            first = pin(client, "warm.team-a.imagenet", "team-a/imagenet", "imagenet", sources["team-a"])
            assert first.status_code == 200 and first.json()["state"] == "ready", first.text
            team_a = first.json()["datasets"][0]["digest"]
            assert client.delete("/v1/tasks/warm.team-a.imagenet", headers={FOR: "team-a/imagenet"}).status_code == 200
            # team-a's copy is unused now; another namespace's Dataset of the same name arrives
            evil = pin(client, "warm.tenant-evil.imagenet", "tenant-evil/imagenet", "imagenet", sources["tenant-evil"])
            assert evil.status_code == 200 and evil.json()["state"] == "ready", evil.text
            evil_digest = evil.json()["datasets"][0]["digest"]
            assert digests(client, "imagenet") == {team_a, evil_digest}  # not superseded by the other source
            assert (
                client.delete("/v1/tasks/warm.tenant-evil.imagenet", headers={FOR: "tenant-evil/imagenet"}).status_code
                == 200
            )
            # the other namespace's cleanup: only its own copy goes
            answer = client.post(
                "/v1/evict", json={"mode": "names", "names": ["imagenet"]}, headers={FOR: "tenant-evil/imagenet"}
            )
            assert answer.status_code == 200, answer.text
            assert [v["digest"] for v in answer.json()["evicted"]] == [evil_digest]
            assert digests(client, "imagenet") == {team_a}
            # again: nothing of its own is left, and team-a's copy is not its to evict (nor to see)
            again = client.post(
                "/v1/evict", json={"mode": "names", "names": ["imagenet"]}, headers={FOR: "tenant-evil/imagenet"}
            )
            assert again.status_code == 404 and digests(client, "imagenet") == {team_a}
            # the audit: each request names the Dataset it acted for, and is counted by namespace
            metrics = client.get("/metrics").text
            assert (
                'dsplatform_agent_operator_requests_total{action="evict",namespace="tenant-evil",status="200"} 1.0'
                in (metrics)
            )
            assert 'dsplatform_agent_operator_requests_total{action="pin",namespace="team-a",status="200"} 1.0' in (
                metrics
            )
    finally:
        agent.stop()
    log = agent.log.read_text()
    audit = [line for line in log.splitlines() if "audit action=" in line]
    assert any("action=evict for=tenant-evil/imagenet" in line and "status=200" in line for line in audit), audit
    assert any("action=pin for=team-a/imagenet task=warm.team-a.imagenet" in line for line in audit), audit
    assert any("action=release for=tenant-evil/imagenet" in line for line in audit), audit


def test_a_shared_source_keeps_its_bytes_until_the_last_namespace_lets_go(
    tmp_path: Path, sources: dict[str, Path]
) -> None:
    agent = AgentProcess(tmp_path / "agent", tcp=True, local_sources=(tmp_path / "nfs",)).start()
    try:
        with operator(agent) as client:
            for namespace in ("team-a", "team-b"):
                task = f"warm.{namespace}.imagenet"
                assert pin(client, task, f"{namespace}/imagenet", "imagenet", sources["team-a"]).status_code == 200
                assert client.delete(f"/v1/tasks/{task}").status_code == 200
            (digest,) = digests(client, "imagenet")
            evict = {"mode": "names", "names": ["imagenet"]}
            first = client.post("/v1/evict", json=evict, headers={FOR: "team-b/imagenet"})
            assert first.status_code == 200 and first.json()["evicted"] == []  # team-a still asked for it
            assert digests(client, "imagenet") == {digest}
            last = client.post("/v1/evict", json=evict, headers={FOR: "team-a/imagenet"})
            assert [v["digest"] for v in last.json()["evicted"]] == [digest]
    finally:
        agent.stop()


def test_a_namespace_past_its_share_of_the_node_gets_no_new_pin(tmp_path: Path, sources: dict[str, Path]) -> None:
    env = {
        "DSAGENT_CAPACITY": "2Mi",
        "DSAGENT_NAMESPACE_SHARE": "0.1",  # ~210 kB: one dataset of 120 kB, not two
        "DSAGENT_NAMESPACE_UNKNOWN_BYTES": "50kB",  # what a pin of a size not known yet reserves
    }
    agent = AgentProcess(tmp_path / "agent", tcp=True, env=env, local_sources=(tmp_path / "nfs",)).start()
    try:
        with operator(agent) as client:
            assert (
                pin(client, "warm.team-a.imagenet", "team-a/imagenet", "imagenet", sources["team-a"]).status_code == 200
            )
            # admitted on 50 kB for a size not known yet; once resolved, its 120 kB do not fit
            late = pin(client, "warm.team-a.coco", "team-a/coco", "coco", sources["coco"])
            assert late.status_code == 200 and late.json()["state"] == "failed", late.text
            assert late.json()["datasets"][0]["error"]["code"] == "namespace_share"
            assert digests(client, "coco") == set()  # refused before it was fetched
            # another namespace has its own share; then the size of "extra" is known on the node
            assert pin(client, "warm.team-b.extra", "team-b/extra", "extra", sources["extra"]).status_code == 200
            refused = pin(client, "warm.team-a.extra", "team-a/extra", "extra", sources["extra"])
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == "namespace_share"
            assert refused.json()["details"] == {"pinned": 120_000, "adding": 120_000, "capacity": 2 << 20}
            assert client.delete("/v1/tasks/warm.team-a.imagenet").status_code == 200
            again = pin(client, "warm.team-a.extra", "team-a/extra", "extra", sources["extra"])
            assert again.status_code == 200 and again.json()["state"] == "ready", again.text
            # renewing what it holds is no new pin
            assert pin(client, "warm.team-a.extra", "team-a/extra", "extra", sources["extra"]).status_code == 200
            metrics = client.get("/metrics").text
            assert 'dsplatform_agent_namespace_refusals_total{namespace="team-a"} 2.0' in metrics
    finally:
        agent.stop()


def test_only_an_operator_names_a_dataset_and_a_malformed_name_is_refused(
    tmp_path: Path, sources: dict[str, Path]
) -> None:
    agent = AgentProcess(tmp_path / "agent", tcp=True, local_sources=(tmp_path / "nfs",)).start()
    try:
        with operator(agent) as client:
            bad = pin(client, "warm.x.imagenet", "not a namespace/imagenet", "imagenet", sources["team-a"])
            assert bad.status_code == 400 and bad.json()["code"] == "invalid_input"
        with httpx.Client(base_url=agent.url, timeout=30) as anonymous:
            answer = anonymous.post(
                "/v1/evict", json={"mode": "names", "names": ["imagenet"]}, headers={FOR: "team-a/imagenet"}
            )
            assert answer.status_code == 401  # the header grants nothing
    finally:
        agent.stop()
