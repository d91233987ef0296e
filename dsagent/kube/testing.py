"""A simulated kubelet that runs a (mutated) pod's containers as local processes.

It follows the order the kubelet uses to start a pod (``kuberuntime`` SyncPod): init
containers one after the other, each pulled when it starts; a native sidecar (an init
container with ``restartPolicy: Always``) is started and the kubelet moves on without
waiting for it to exit; app containers are then pulled and started in order. Image pulls
are a callable you provide (sleep for a benchmark, a gate for a test), so what overlaps
with what is exactly what a kubelet would overlap.

Containers run their real ``command + args`` with their ``env`` (downward-API
``metadata.uid`` and ``secretKeyRef`` values are filled in) as local processes; volume
mount paths are rewritten to host directories (``emptyDir`` volumes get a fresh
directory, ``hostPath`` volumes map through ``host_paths``, inline ``csi`` volumes are
published by the ``csi`` callable, which returns the target directory, before any
container is pulled, as the kubelet does), textually in the argv and environment: enough
for the dsplatform containers, not a container runtime.

Who calls it: ``tests/dsagent/webhook/test_overlap.py`` and ``tools/bench/overlap.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Pull = Callable[[str], None]


@dataclass
class ContainerRun:
    name: str
    pull_started: float = 0.0
    started: float = 0.0
    exited: float | None = None
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    process: subprocess.Popen[str] | None = field(default=None, repr=False)


class SimulatedKubelet:
    """Run one pod; ``run()`` returns each container's timeline (monotonic seconds)."""

    def __init__(
        self,
        pod: Mapping[str, Any],
        *,
        pull: Pull,
        host_paths: Mapping[str, str] | None = None,
        secrets: Mapping[tuple[str, str], str] | None = None,
        uid: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        csi: Callable[[Mapping[str, Any]], str] | None = None,
    ) -> None:
        self.pod = pod
        self.pull = pull
        self.host_paths = dict(host_paths or {})
        self.secrets = dict(secrets or {})
        self.uid = uid or (pod.get("metadata") or {}).get("uid") or "00000000-0000-4000-8000-000000000000"
        self.extra_env = dict(extra_env or {})
        self.csi = csi
        self._scratch = tempfile.TemporaryDirectory(prefix="simkubelet-")
        self.runs: dict[str, ContainerRun] = {}
        self.volume_dirs: dict[str, str] = {}  # volume name -> host directory, once running

    def run(self, timeout: float = 120.0) -> dict[str, ContainerRun]:
        spec = self.pod["spec"]
        volumes = self.volume_dirs = self._volumes(spec.get("volumes") or [])
        sidecars: list[ContainerRun] = []
        try:
            for container in spec.get("initContainers") or []:
                run = self._start(container, volumes)
                if container.get("restartPolicy") == "Always":
                    sidecars.append(run)
                else:
                    self._wait(run, timeout)
                    if run.returncode != 0:
                        raise RuntimeError(f"init container {run.name} failed: {run.stderr[-500:]}")
            apps = [self._start(container, volumes) for container in spec.get("containers") or []]
            for run in apps:
                self._wait(run, timeout)
        finally:
            for run in sidecars:
                if run.process is not None and run.process.poll() is None:
                    run.process.terminate()
                    self._wait(run, 10)
            self._scratch.cleanup()
        return self.runs

    def _start(self, container: Mapping[str, Any], volumes: Mapping[str, str]) -> ContainerRun:
        run = ContainerRun(container["name"], pull_started=time.monotonic())
        self.pull(container.get("image", ""))
        mounts = {
            m["mountPath"]: os.path.join(volumes[m["name"]], m.get("subPath", ""))
            for m in container.get("volumeMounts") or []
            if m["name"] in volumes
        }
        words = [*(container.get("command") or []), *(container.get("args") or [])]
        # a shell's script gets each host path as one quoted word (a path may hold a space)
        script = len(words) >= 3 and os.path.basename(words[0]).endswith("sh") and words[1] == "-c"
        argv = [self._map(a, mounts, quote=script and i == 2) for i, a in enumerate(words)]
        env = {
            **os.environ,
            **self.extra_env,
            **{e["name"]: self._map(self._value(e), mounts) for e in container.get("env") or []},
        }
        run.started = time.monotonic()
        run.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.runs[run.name] = run
        return run

    def _wait(self, run: ContainerRun, timeout: float) -> None:
        assert run.process is not None
        run.stdout, run.stderr = run.process.communicate(timeout=timeout)
        run.returncode = run.process.returncode
        run.exited = time.monotonic()

    def _value(self, env: Mapping[str, Any]) -> str:
        if "value" in env:
            return str(env["value"])
        source = env.get("valueFrom") or {}
        if (source.get("fieldRef") or {}).get("fieldPath") == "metadata.uid":
            return self.uid
        ref = source.get("secretKeyRef") or {}
        return self.secrets[(str(ref.get("name")), str(ref.get("key")))]

    def _volumes(self, volumes: list[Mapping[str, Any]]) -> dict[str, str]:
        found = {}
        for volume in volumes:
            if "emptyDir" in volume:
                path = Path(self._scratch.name) / volume["name"]
                path.mkdir()
                found[volume["name"]] = str(path)
            elif "hostPath" in volume:
                found[volume["name"]] = self.host_paths.get(volume["hostPath"]["path"], volume["hostPath"]["path"])
            elif "csi" in volume and self.csi is not None:
                found[volume["name"]] = self.csi(volume)
        return found

    @staticmethod
    def _map(text: str, mounts: Mapping[str, str], *, quote: bool = False) -> str:
        """``text`` with each container path a mount gives replaced by its host path, in one
        pass (a host path put in is never mapped again), as one shell word where ``quote``
        (the text is a shell's script and a host path may hold a space)."""
        if not mounts:
            return text
        paths = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))  # longest first

        def host(match: re.Match[str]) -> str:
            path = mounts[match.group(1)] + (match.group(2) or "")
            return shlex.quote(path) if quote else path

        return re.sub(rf"({paths})(/[^\s'\"&|;<>]*)?", host, text)


__all__ = ["ContainerRun", "SimulatedKubelet"]
