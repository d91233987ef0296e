"""A pod on the node acts only on its own task.

A real ``dsagent serve`` on its unix socket; the test process is the pod: the agent reads
its pid from the socket (``SO_PEERCRED``) and its cgroup from a ``/proc`` the test lays out
(``DSAGENT_PROC_ROOT``), naming a kubepods pod UID as a real kubelet's cgroup does.

"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.support.harness import ADMIN_TOKEN

POD = "6f1c2a4e-9b7d-4c3e-8a21-0d5e7f9a1b2c"
OTHER = "11111111-2222-3333-4444-555555555555"


def fake_proc(root: Path, pid: int, cgroup: str, *, started: int = 4242) -> Path:
    """``<root>/<pid>/cgroup`` and ``stat`` (its start time ``started``), as the kernel shows them."""
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(cgroup)
    write_stat(root, pid, started)
    return root


def write_stat(root: Path, pid: int, started: int) -> None:
    """``<root>/<pid>/stat`` of a process started at ``started`` (field 22), replaced at once."""
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 8 + ["20", "0", "1", "0", str(started)]
    tmp = root / str(pid) / "stat.tmp"
    tmp.write_text(f"{pid} (python (x) y) {' '.join(fields)} 0 0\n")
    os.replace(tmp, root / str(pid) / "stat")


def pod_cgroup(uid: str) -> str:
    """A pod's cgroup line as the kubelet's systemd driver writes it."""
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/x.scope\n"


def reused_while_read(root: Path, pid: int, cgroup: str) -> threading.Thread:
    """Make ``<root>/<pid>/cgroup`` a FIFO: whoever reads it next finds, by the time it has
    read it, that the pid names another process (its start time changed), as when the
    process that connected ended and its pid was handed to a process of another pod."""
    path = root / str(pid) / "cgroup"
    path.unlink()
    os.mkfifo(path)

    def reuse() -> None:
        with open(path, "w") as out:  # returns once the reader has opened it
            write_stat(root, pid, started=9999)
            out.write(cgroup)

    thread = threading.Thread(target=reuse, daemon=True)
    thread.start()
    return thread


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


def test_a_connection_keeps_the_pod_it_was_accepted_for(pod_agent: Any, tmp_path: Path) -> None:
    """The pod is read once per connection: a pid whose /proc entry names another pod
    later (the process ended and another pod's took its pid) does not change who the
    connection is, and a new connection is who holds the pid then."""
    dataset = {"name": "mine", "source": "memory://pod-rights/none"}
    proc = tmp_path / "proc"
    with unix_client(pod_agent) as pod:
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [dataset]}).status_code == 200
        fake_proc(proc, os.getpid(), pod_cgroup(OTHER), started=5000)  # the pid now names a process of OTHER
        answer = pod.put(f"/v1/tasks/{OTHER}", json={"datasets": [dataset]})  # the same connection: still POD
        assert answer.status_code == 403 and answer.json()["code"] == "forbidden", answer.text
        assert "its own task" in answer.json()["message"]
    with unix_client(pod_agent) as other:  # a new connection: the pod holding the pid now
        assert other.put(f"/v1/tasks/{OTHER}", json={"datasets": [dataset]}).status_code == 200
        assert other.get(f"/v1/tasks/{POD}").status_code == 403


def test_a_pid_reused_while_the_agent_reads_its_cgroup_gets_no_pods_rights(pod_agent: Any, tmp_path: Path) -> None:
    """The start time read before and after the cgroup differs: the agent cannot say which
    process's cgroup it read, so the connection is unidentified (403 with the reason), never
    the pod that holds the pid now."""
    dataset = {"name": "mine", "source": "memory://pod-rights/none"}
    reuse = reused_while_read(tmp_path / "proc", os.getpid(), pod_cgroup(OTHER))
    with unix_client(pod_agent) as caller:
        answer = caller.put(f"/v1/tasks/{OTHER}", json={"datasets": [dataset]})
        assert answer.status_code == 403, answer.text
        assert "reused while the agent read its cgroup" in answer.json()["message"], answer.text
        assert caller.get("/v1/datasets").status_code == 200  # it may still read
    reuse.join(10)
    assert not reuse.is_alive()


def test_identify_peer_holds_the_lookup_to_the_process_that_connected(tmp_path: Path) -> None:
    from dsagent.api.identity import identify_peer

    proc = fake_proc(tmp_path / "proc", os.getpid(), pod_cgroup(POD))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        peer = identify_peer(ours, proc)
        assert (peer.pid, peer.pod_uid, peer.refused) == (os.getpid(), POD, None)
        # the start time moves while the cgroup is read: refused, not the cgroup's pod
        reuse = reused_while_read(proc, os.getpid(), pod_cgroup(OTHER))
        peer = identify_peer(ours, proc)
        reuse.join(10)
        assert peer.pod_uid is None and peer.refused is not None and "reused" in peer.refused
        # no start time to compare: refused too
        (proc / str(os.getpid()) / "stat").unlink()
        assert identify_peer(ours, proc).refused == f"cannot read the cgroup of pid {os.getpid()}"


def test_identify_peer_refuses_a_process_that_ended_before_it_was_looked_up(tmp_path: Path) -> None:
    """The process that connected is gone when the agent looks (its pid free for another
    process): its /proc entry, which names a pod, is not taken for it."""
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = tmp_path / "s.sock"
    listening.bind(str(path))
    listening.listen(1)
    code = f"import os, socket; socket.socket(socket.AF_UNIX).connect({str(path)!r}); print(os.getpid())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    pid = int(child.stdout)
    proc = fake_proc(tmp_path / "proc", pid, pod_cgroup(POD))
    from dsagent.api.identity import identify_peer

    accepted, _ = listening.accept()
    with listening, accepted:
        peer = identify_peer(accepted, proc)
    assert peer.pid == pid and peer.pod_uid is None, peer
    assert peer.refused is not None and "ended" in peer.refused, peer
