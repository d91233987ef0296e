"""A pod on the node acts only on its own task.

A real ``dsagent serve`` on its unix socket; the test process is the pod: the agent reads
its pid from the socket (``SO_PEERCRED``) and its cgroup from a ``/proc`` the test lays out
(``DSAGENT_PROC_ROOT``), naming a kubepods pod UID as a real kubelet's cgroup does.

"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.support.harness import ADMIN_TOKEN

POD = "6f1c2a4e-9b7d-4c3e-8a21-0d5e7f9a1b2c"
OTHER = "11111111-2222-3333-4444-555555555555"


def fake_proc(root: Path, pid: int, cgroup: str) -> Path:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(cgroup)
    return root


def unix_client(agent: Any, token: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(agent.socket)), base_url="http://agent", timeout=30, headers=headers
    )


@pytest.fixture
def pod_agent(agent_factory: Any, tmp_path: Path, memory_root: str) -> Any:
    systemd_slice = (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-abc.scope\n"
    )
    proc = fake_proc(tmp_path / "proc", os.getpid(), systemd_slice)
    return agent_factory(env={"DSAGENT_PROC_ROOT": str(proc)})


def test_a_pod_acts_only_on_its_own_task(pod_agent: Any, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    dataset = {"name": "mine", "source": "memory://pod-rights/none"}
    with unix_client(pod_agent) as pod, unix_client(pod_agent, ADMIN_TOKEN) as operator:
        assert operator.put(f"/v1/tasks/{OTHER}", json={"datasets": [dataset]}).status_code == 200
        # the pod's own task: create, read, release
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [dataset]}).status_code == 200
        assert pod.get(f"/v1/tasks/{POD}").status_code == 200
        # another pod's task: neither read, nor replace, nor release
        for method in ("GET", "PUT", "DELETE"):
            answer = pod.request(
                method, f"/v1/tasks/{OTHER}", json={"datasets": [dataset]} if method == "PUT" else None
            )
            assert answer.status_code == 403, (method, answer.text)
            assert answer.json()["code"] == "forbidden"
        # evictions need an operator, forced or not
        assert pod.delete("/v1/datasets/mine", params={"force": "true"}).status_code == 403
        assert pod.post("/v1/evict", json={"mode": "unused"}).status_code == 403
        assert pod.post("/v1/evict", json={"mode": "names", "names": ["mine"], "force": True}).status_code == 403
        assert operator.get(f"/v1/tasks/{OTHER}").status_code == 200  # untouched
        # the task list: a pod sees its own task only, an operator every task
        assert [t["task"] for t in pod.get("/v1/tasks").json()["tasks"]] == [POD]
        assert {t["task"] for t in operator.get("/v1/tasks").json()["tasks"]} == {OTHER, POD}
        assert pod.delete(f"/v1/tasks/{POD}").status_code == 200
        assert pod.get("/v1/tasks").json()["tasks"] == []
        assert pod.get("/v1/inventory").status_code == 200  # reads stay open


def test_case_variants_of_a_pods_uid_are_its_one_task(pod_agent: Any, tmp_path: Path) -> None:
    """The permission check lower-cased the id and the records did not,
    so a pod held three tasks (three dataset lists, three leases) under variants of its UID."""
    (tmp_path / "data").mkdir()
    first = {"name": "mine", "source": "memory://pod-rights/none"}
    other = {"name": "more", "source": "memory://pod-rights/none"}
    with unix_client(pod_agent) as pod, unix_client(pod_agent, ADMIN_TOKEN) as operator:
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [first]}).status_code == 200
        # a variant is the same task: the same request is idempotent, another list a conflict
        assert pod.put(f"/v1/tasks/{POD.upper()}", json={"datasets": [first]}).json()["task"] == POD
        answer = pod.put(f"/v1/tasks/{POD.title()}", json={"datasets": [other]})
        assert answer.status_code == 409, answer.text
        assert pod.get(f"/v1/tasks/{POD.upper()}").json()["task"] == POD
        assert pod.delete(f"/v1/tasks/{POD.upper()}").status_code == 200
        # released under any spelling: no variant outlives it
        for variant in (POD, POD.upper(), POD.title()):
            assert operator.get(f"/v1/tasks/{variant}").status_code == 404, variant


def test_an_unidentifiable_peer_may_read_but_not_act(agent_factory: Any, tmp_path: Path) -> None:
    agent = agent_factory(env={"DSAGENT_PROC_ROOT": str(tmp_path / "empty-proc")})  # no cgroup to read
    with unix_client(agent) as caller:
        answer = caller.put(
            f"/v1/tasks/{POD}", json={"datasets": [{"name": "x", "source": "memory://pod-rights/none"}]}
        )
        assert answer.status_code == 403, answer.text
        assert caller.get("/v1/datasets").status_code == 200


def test_a_process_outside_any_pod_is_an_operator(agent_factory: Any, tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", os.getpid(), "0::/user.slice/user-0.slice/session-1.scope\n")
    agent = agent_factory(env={"DSAGENT_PROC_ROOT": str(proc)})
    with unix_client(agent) as node:
        assert node.post("/v1/evict", json={"mode": "unused"}).status_code == 200


def test_cgroupfs_and_systemd_cgroup_paths_both_name_the_pod(tmp_path: Path) -> None:
    from dsagent.api.identity import pod_uid_of_pid

    fake_proc(tmp_path, 7, f"12:memory:/kubepods/besteffort/pod{POD}/0123abcd\n")
    fake_proc(tmp_path, 8, f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-1.scope\n")
    fake_proc(tmp_path, 9, "0::/system.slice/kubelet.service\n")
    assert pod_uid_of_pid(7, tmp_path) == POD
    assert pod_uid_of_pid(8, tmp_path) == POD
    assert pod_uid_of_pid(9, tmp_path) is None
