"""Benchmark docs/design.md#rule-3: with dsplatform a pod starts training no later than without it.

A simulated kubelet (``dsagent.kube.testing.SimulatedKubelet``) starts one training pod
three ways, each against a fresh real agent process caching a local dataset of
``--files`` files:

- ``baseline``: the pod as the user wrote it (no dsplatform): training starts when the
  app image is pulled;
- ``overlap``: the webhook's default mutation (a native sidecar caches while the kubelet
  pulls the app image; the app command waits for the ready mark);
- ``init``: a blocking init-container (``dsagent.io/wait: init``), for contrast: caching
  and the pull are serialised;
- ``csi``: the chart's default (``volumeMode: csi``): the simulated kubelet
  publishes the pod's inline CSI volume through the agent's real CSI socket (gRPC) before
  it pulls anything, the agent caches from that call and bind-mounts the dataset into the
  volume when ready, and the wrapped app command waits for the volume's ready mark. Needs
  root with mount rights (bind mounts); skipped with the reason otherwise.

Image pulls are simulated by sleeping ``--pull`` seconds (the dsplatform image is
already on the node: it runs the DaemonSet). Prints when training started in each mode,
caching's own duration, and overlap/baseline (target: <= 1.0 + noise whenever the pull
takes longer than caching).

    .venv/bin/python tools/bench/overlap.py                       # small: 2,000 files, 3 s pull
    .venv/bin/python tools/bench/overlap.py --files 50000 --pull 60   # full scale
    .venv/bin/python tools/bench/overlap.py --smoke                   # seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: tools.support is the repository's

from dsagent.api.client import AgentClient
from dsagent.errors import AgentUnreachable
from dsagent.kube.testing import SimulatedKubelet
from dsagent.webhook.mutation import Injection, ResolvedDataset, mutate
from tools.support.harness import LOOPBACK

TRAINING = [sys.executable, "-c", "import time; print(time.monotonic())"]
APP_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


def make_source(root: Path, files: int, size: int) -> Path:
    source = root / "imagenet"
    for i in range(files):
        folder = source / f"n{i % 100:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:07d}.JPEG").write_bytes(os.urandom(size))
    return source


class Agent:
    def __init__(self, work: Path, source: Path, *, csi: bool = False) -> None:
        self.sockets = Path(tempfile.mkdtemp(prefix="dsb-", dir="/tmp"))
        self.root = work / f"cache-{time.monotonic_ns()}"
        self.pods = work / f"kubelet-{time.monotonic_ns()}" / "pods"
        self.csi_socket = self.sockets / "csi.sock"
        self.log = open(work / "agent.log", "ab")
        env = {**os.environ, "DSAGENT_EGRESS_ALLOW": ",".join(LOOPBACK)}  # its store is on loopback
        if csi:
            self.pods.mkdir(parents=True)
            env.update(DSAGENT_CSI_SOCKET=str(self.csi_socket), DSAGENT_CSI_KUBELET_PODS_DIR=str(self.pods))
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dsagent",
                "serve",
                "--root",
                str(self.root),
                "--socket",
                str(self.sockets / "dsagent.sock"),
                "--local-source",
                str(source),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with AgentClient(socket_path=self.sockets / "dsagent.sock", timeout=5) as client:
                    if client.health():
                        return
            except AgentUnreachable:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the agent did not start; see agent.log") from None
                time.sleep(0.05)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()
        shutil.rmtree(self.sockets, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)


class CsiKubelet:
    """The kubelet's CSI calls for one pod, over the agent's real CSI socket."""

    def __init__(self, agent: Agent, pod_meta: dict[str, Any]) -> None:
        import grpc

        from dsagent.nodeplugins.proto.csi import csi_pb2, csi_pb2_grpc

        self.pb = csi_pb2
        self.agent, self.meta = agent, pod_meta
        deadline = time.monotonic() + 60
        while not agent.csi_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the agent's CSI socket did not appear; see agent.log")
            time.sleep(0.05)
        self.channel = grpc.insecure_channel(f"unix://{agent.csi_socket}")
        self.node = csi_pb2_grpc.NodeStub(self.channel)
        self.published: list[tuple[str, str]] = []

    def publish(self, volume: Any) -> str:
        target = self.agent.pods / self.meta["uid"] / "volumes" / "kubernetes.io~csi" / volume["name"] / "mount"
        target.parent.mkdir(parents=True)
        context = {
            "csi.storage.k8s.io/pod.uid": self.meta["uid"],
            "csi.storage.k8s.io/pod.name": self.meta["name"],
            "csi.storage.k8s.io/pod.namespace": self.meta["namespace"],
            "csi.storage.k8s.io/ephemeral": "true",
            **volume["csi"]["volumeAttributes"],
        }
        capability = self.pb.VolumeCapability(mount=self.pb.VolumeCapability.MountVolume())
        volume_id = "csi-" + os.urandom(16).hex()
        self.node.NodePublishVolume(
            self.pb.NodePublishVolumeRequest(
                volume_id=volume_id,
                target_path=str(target),
                volume_capability=capability,
                readonly=True,
                volume_context=context,
            ),
            timeout=60,
        )
        self.published.append((volume_id, str(target)))
        return str(target)

    def close(self) -> None:
        for volume_id, target in self.published:
            self.node.NodeUnpublishVolume(
                self.pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target), timeout=60
            )
        self.channel.close()


def mount_rights() -> str | None:
    """None when bind mounts work here, else why the csi mode is skipped."""
    if os.geteuid() != 0:
        return "csi mode needs root with CAP_SYS_ADMIN (bind mounts)"
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        a.mkdir()
        b.mkdir()
        done = subprocess.run(["mount", "--bind", str(a), str(b)], capture_output=True, text=True)
        if done.returncode != 0:
            return f"csi mode skipped: bind mounts refused: {done.stderr.strip()}"
        subprocess.run(["umount", str(b)], check=True)
    return None


def pod(mode: str) -> dict[str, Any]:
    base: dict[str, Any] = {
        "metadata": {
            "name": "train",
            "namespace": "default",
            "uid": "6c1f9d2e-3b4a-4c5d-8e7f-9a0b1c2d3e4f",
            "annotations": {"dsagent.io/datasets": "imagenet"},
        },
        "spec": {
            "containers": [{"name": "train", "image": APP_IMAGE, "command": TRAINING}],
            "schedulerName": "default-scheduler",
            "securityContext": {},
        },
    }
    if mode == "baseline":
        return base
    if mode == "init":
        base["metadata"]["annotations"]["dsagent.io/wait"] = "init"
    return base


def mutated(source: Path, mode: str) -> dict[str, Any]:
    spec = pod(mode)
    if mode == "baseline":
        return spec
    injection = Injection(image="dsplatform", volume_mode="csi" if mode == "csi" else "hostPath")
    ops = mutate(spec, (ResolvedDataset("imagenet", str(source)),), injection)
    return apply_patch(spec, ops)


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The few RFC 6902 operations the webhook emits (add, replace) on a copy."""
    doc = json.loads(json.dumps(doc))
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        key = parts[-1]
        if not isinstance(parent, list):
            parent[key] = op["value"]
        elif op["op"] == "add":
            parent.insert(len(parent) if key == "-" else int(key), op["value"])
        else:
            parent[int(key)] = op["value"]
    return doc


def run_mode(work: Path, source: Path, mode: str, pull_seconds: float) -> float:
    agent = Agent(work, source, csi=mode == "csi")
    csi = CsiKubelet(agent, pod(mode)["metadata"]) if mode == "csi" else None
    try:
        spec = mutated(source, mode)

        def pull(image: str) -> None:
            if image == APP_IMAGE:
                time.sleep(pull_seconds)

        kubelet = SimulatedKubelet(
            spec,
            pull=pull,
            host_paths={"/run/dsagent": str(agent.sockets), "/var/lib/dsagent": str(agent.root)},
            extra_env={"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]},
            csi=csi.publish if csi is not None else None,
        )
        t0 = time.monotonic()
        runs = kubelet.run(timeout=3600)
        train = runs["train"]
        if train.returncode != 0:
            raise RuntimeError(f"{mode}: training failed: {train.stderr[-400:]}")
        return float(train.stdout.strip().splitlines()[-1]) - t0
    finally:
        if csi is not None:
            csi.close()
        agent.close()


def caching_alone(work: Path, source: Path) -> float:
    agent = Agent(work, source)
    try:
        with AgentClient(socket_path=agent.sockets / "dsagent.sock", timeout=3600) as client:
            t0 = time.monotonic()
            client.submit_task("bench", [{"name": "imagenet", "source": str(source)}], wait=3600)
            return time.monotonic() - t0
    finally:
        agent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--file-size", type=int, default=8000)
    parser.add_argument("--pull", type=float, default=3.0, help="seconds the app image pull takes")
    parser.add_argument("--workdir", type=Path, help="where the data and caches go (default: a temporary directory)")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 200 files, a 0.5 s pull")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.pull = 200, 0.5
    with tempfile.TemporaryDirectory(prefix="bench-overlap-", dir=args.workdir) as tmp:
        work = Path(tmp)
        source = make_source(work, args.files, args.file_size)
        cache = caching_alone(work, source)
        skip_csi = mount_rights()
        modes = ("baseline", "overlap", "init") + (() if skip_csi else ("csi",))
        starts = {mode: run_mode(work, source, mode, args.pull) for mode in modes}
    print(
        f"dataset: {args.files} files x {args.file_size} B; app image pull: {args.pull:.2f}s; "
        f"caching alone: {cache:.2f}s"
    )
    for mode, start in starts.items():
        print(f"  training starts after {start:6.2f}s  ({mode})")
    print(f"overlap / baseline = {starts['overlap'] / starts['baseline']:.3f}  (<= 1 + noise when pull > caching)")
    print(
        f"init    / baseline = {starts['init'] / starts['baseline']:.3f}  (pull + caching: why overlap is the default)"
    )
    if skip_csi:
        print(skip_csi)
    else:
        print(
            f"csi     / baseline = {starts['csi'] / starts['baseline']:.3f}"
            "  (the CSI volume: <= 1 + noise when pull > caching)"
        )


if __name__ == "__main__":
    main()
