"""Benchmark one Dataset controller pass over a large cluster's state, and what the agents
add to each Node object.

For each of ``--nodes`` (default 1,000, 5,000 and 15,000) the fake API server
(``tools/support/fake_apiserver.py``, lists served from memory: each list's JSON is made
once per change of its resource type, as the real API server serves lists from its watch
cache) holds:

- N GPU Nodes as kubelet registers them, with what this release's agents put on them (the
  free-GPU annotation, the device-plugin labels, the RoCE-class condition);
- N ``NodeCache`` objects, each with a realistic inventory (``--held`` datasets of the M,
  mostly ready at the Dataset's current digest, some at an older digest, fetching or
  failed) and the two-class 8-GPU topology;
- N agent pods (the controller finds the agents by label) and ``--pods-per-node`` (6)
  running training pods on each node, as the API server holds them (managed fields,
  container statuses), every other one naming a Dataset; and M Datasets in four
  namespaces, each with its packer's status; one in 20 asks for warm-up on 2 nodes, one in
  20 for 2 replicas and one in 20 is striped (``stripe: auto``): the replicated and striped
  Datasets make every pass read every pod.

The controller (``DatasetController.reconcile_all``, the real code over HTTP with the
``kubernetes`` client) runs in a child process of its own. Its agent calls do not leave
that process: they go to an in-process fake that answers as an agent does, by default at
once, with no network and no waiting (``agent calls`` counts them: in a cluster every one
would be an HTTP request to a node; ``--agent-ms`` adds that round trip to each). A first pass writes
every Dataset's status; before each of the ``--repeat`` timed passes 1% of the nodes'
inventories change (a fetch finishes, another starts), as between two resyncs of a busy
cluster. The fake answers at once; ``--api-write-ms`` makes each write (a status, an Event)
take that long, as a real API server's round trip to etcd does.

Printed and written to ``--json`` (tools/bench/support/record.py) per size:

- ``first_pass_s``: the wall time of the first pass (the child's ``perf_counter``), with its
  CPU time: it writes every Dataset's status and records an Event for each node that holds,
  fetches or failed a copy (a later pass records one per change only), so it takes far
  longer than the others; its own line and row, no goal;
- ``pass_s_median``: the wall time of a pass (the child's ``perf_counter``), median of the
  repeats, with its CPU time (the child's user + system);
- ``peak_rss_bytes``: the controller process's peak resident set (``VmHWM`` from
  ``/proc/self/status``) over the timed passes; it is reset before them (``clear_refs``), so
  it is the process's whole footprint during a pass (interpreter, imports and the state it
  keeps included), not what the pass alone allocates; ``rss_before_bytes`` is its resident
  set before the first pass;
- ``node_object_bytes_added_max``: the most bytes the platform adds to one Node object:
  the agents' annotations (``dsagent.nodeagent.publisher.node_annotations``, every GPU
  free and the most namespaces naming a follow-up job, each of the longest name: the
  longest values), the device-plugin labels and the RoCE-class condition
  (``dsagent.nodeagent.hardware``) and the class resources its device plugin advertises
  in capacity and allocatable, as compact JSON of the Node after less before, the
  largest over the decisions an agent can make.

The load average is printed beside every figure: the machine may be shared.

    .venv/bin/python tools/bench/controller.py --json docs/results/performance/controller.json
    .venv/bin/python tools/bench/controller.py --nodes 1000,5000 --repeat 3
    .venv/bin/python tools/bench/controller.py --smoke          # seconds: checks that it runs

Goals: at most 1 KiB added to a Node; a pass over 5,000 nodes and 1,000 Datasets within
1 s and 500 MiB; growth at most linear to 15,000 nodes (pass_s(15,000) / pass_s(5,000) <=
3.3). ``--json`` records each as a headroom, the goal over the measured figure (>= 1 meets
it).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.bench.support.record import Record  # noqa: E402

NS = "dsplatform"
NAMESPACES = ("ml", "vision", "speech", "nlp")
GIB = 1 << 30
#: the published-at of every NodeCache, and the controller's clock (fresh inventories)
PUBLISHED = 1_800_000_000.0
GOAL_NODE_BYTES = 1024
GOAL_PASS_S_5K = 1.0
GOAL_RSS_5K = 500 * 2**20
GOAL_GROWTH = 3.3


def digest_of(name: str, version: int) -> str:
    return f"{abs(hash((name, version))) % 16**32:032x}"


def dataset_names(count: int) -> list[str]:
    return [f"ds-{i:05d}" for i in range(count)]


def inventory(node: str, rng: random.Random, names: list[str], held: int, sizes: dict[str, int]) -> str:
    """A node's inventory JSON (dsplatform.wire.inventory), as its agent publishes it."""
    from dsplatform.wire import inventory as wire_inventory

    datasets: dict[str, Any] = {}
    for name in rng.sample(names, min(held, len(names))):
        roll = rng.random()
        size = sizes[name]
        entry: dict[str, Any] = {
            "digest": digest_of(name, 1 if roll < 0.9 else 0),
            "sizeBytes": size,
            "files": 1000 + size % 100_000,
            "state": "ready",
            "inUse": rng.random() < 0.3,
            "lastUsed": "2026-11-21T10:00:00Z",
        }
        if 0.80 <= roll < 0.87:
            entry["state"], entry["heldBytes"] = "fetching", size // 3
        elif 0.87 <= roll < 0.9:
            entry["state"] = "failed"
        datasets[name] = entry
    doc = {"version": 1, "node": node, "capacityBytes": 7000 * GIB, "freeBytes": 2500 * GIB, "datasets": datasets}
    return wire_inventory.compact(doc)


def platform_node_parts(
    follow_ups: bool = False,
) -> list[tuple[dict[str, str], dict[str, str], dict[str, Any], dict[str, str]]]:
    """What this release's agent puts on its Node, for each decision it can make: (annotations,
    labels, the condition, the extended resources its device plugin advertises). ``follow_ups``:
    with the most namespaces naming a follow-up job, each as long as a name can be (the
    longest value; the cluster's Nodes are built without: no pod there names one)."""
    from dsagent.nodeagent import hardware, publisher
    from dsplatform.gpus import RESOURCE_PREFIX
    from dsplatform.published import FOLLOW_UPS_MAX
    from gpu_topology import Topology
    from scheduler_plugin.testing import two_class_topology

    longest = [f"{i:x}".rjust(63, "n") for i in range(FOLLOW_UPS_MAX)] if follow_ups else []
    annotations = publisher.node_annotations(list(range(8)), longest)  # every GPU free: the longest value
    decisions = [hardware.roce_path(two_class_topology()), hardware.roce_path(Topology(gpus=(), nics=(), links={}))]
    parts = []
    for decision in decisions:
        labels = hardware.node_patch(decision, {}).get("metadata", {}).get("labels", {})
        condition = hardware.status_patch(decision, "2026-11-21T10:00:00Z")["status"]["conditions"][0]
        resources = {f"{RESOURCE_PREFIX}/{c}": "4" for c in decision.classes} if decision.on else {}
        parts.append(({k: v for k, v in annotations.items()}, dict(labels), condition, resources))
    return parts


def with_platform(
    node: dict[str, Any], part: tuple[dict[str, str], dict[str, str], dict[str, Any], dict[str, str]]
) -> dict[str, Any]:
    annotations, labels, condition, resources = part
    out = json.loads(json.dumps(node))
    meta = out["metadata"]
    meta.setdefault("annotations", {}).update(annotations)
    meta.setdefault("labels", {}).update({k: v for k, v in labels.items() if v is not None})
    out["status"]["conditions"].append(condition)
    out["status"]["capacity"].update(resources)
    out["status"]["allocatable"].update(resources)
    return out


def compact_len(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")).encode())


def node_bytes_added() -> tuple[int, dict[str, int]]:
    """The most bytes the platform adds to one Node, and its parts for that decision."""
    from tools.support.fake_apiserver import make_node

    bare = make_node("gpu-node-00000")
    best, detail = -1, {}
    for part in platform_node_parts(follow_ups=True):
        annotations, labels, condition, resources = part
        added = compact_len(with_platform(bare, part)) - compact_len(bare)
        if added > best:
            best = added
            detail = {
                "annotations": compact_len(annotations),
                "labels": compact_len(labels),
                "condition": compact_len(condition),
                "resources": 2 * compact_len(resources),
            }
    return best, detail


def training_pod(node: str, index: int, k: int, dataset: str | None) -> dict[str, Any]:
    """A running training pod as the API server holds it: what its writers' managed fields
    and the kubelet's container statuses add to what the user sent."""
    from tools.support.fake_apiserver import make_pod

    pod = make_pod(
        f"train-{index:05d}-{k}", namespace=NAMESPACES[k % len(NAMESPACES)], node_name=node, phase="Running", gpus=1,
        annotations={"dsagent.io/datasets": dataset} if dataset else None,
    )  # fmt: skip
    fields = {"f:metadata": {"f:annotations": {".": {}}}, "f:spec": {"f:containers": {'k:{"name":"train"}': {}}}}
    pod["metadata"]["managedFields"] = [
        {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2027-01-15T08:00:00Z",
         "fieldsType": "FieldsV1", "fieldsV1": fields}
        for manager in ("kubectl-client-side-apply", "kube-scheduler", "kubelet")
    ]  # fmt: skip
    pod["status"]["containerStatuses"] = [
        {"name": "train", "ready": True, "restartCount": 0, "started": True,
         "image": "nvcr.io/nvidia/pytorch:24.05-py3", "imageID": "nvcr.io/nvidia/pytorch@sha256:" + "0" * 64,
         "containerID": "containerd://" + f"{index:032x}{k:032x}",
         "state": {"running": {"startedAt": "2027-01-15T08:00:00Z"}}, "lastState": {}}
    ]  # fmt: skip
    return pod


def build(
    nodes: int, datasets: int, held: int, seed: int = 5, pods_per_node: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """Every object of the cluster, as the API server would hold them."""
    from scheduler_plugin.testing import topology_json
    from tools.support.fake_apiserver import make_dataset, make_node, make_nodecache, make_pod

    rng = random.Random(seed)
    names = dataset_names(datasets)
    sizes = {name: rng.randint(1, 400) * GIB for name in names}
    topology = topology_json()
    published = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(PUBLISHED))
    on = platform_node_parts()[0]
    out: dict[str, list[dict[str, Any]]] = {"nodes": [], "nodecaches": [], "pods": [], "datasets": []}
    for i in range(nodes):
        name = f"gpu-node-{i:05d}"
        out["nodes"].append(with_platform(make_node(name), on))
        out["nodecaches"].append(
            make_nodecache(
                name, inventory=inventory(name, rng, names, held, sizes), topology=topology, published_at=published
            )
        )
        pod = make_pod(
            f"dsagent-{i:05d}", namespace=NS, node_name=name, phase="Running",
            labels={"app.kubernetes.io/component": "agent"},
        )  # fmt: skip
        pod["status"]["podIP"] = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
        out["pods"].append(pod)
        for k in range(pods_per_node):
            reads = names[(i * 7 + k) % len(names)] if k % 2 == 0 else None
            out["pods"].append(training_pod(name, i, k, reads))
    for j, name in enumerate(names):
        ds = make_dataset(
            name,
            namespace=NAMESPACES[j % len(NAMESPACES)],
            source=f"s3://datasets/{name}",
            status={"digest": digest_of(name, 1), "files": 1000 + sizes[name] % 100_000, "bytes": sizes[name]},
        )
        if j % 20 == 3:
            ds["spec"]["warm"] = {"nodes": 2}
        elif j % 20 == 7:
            ds["spec"]["replicas"] = 2
        elif j % 20 == 11:
            ds["spec"]["stripe"], ds["spec"]["bundles"] = "auto", f"s3://bundles/{name}"
        out["datasets"].append(ds)
    return out


def churn(api: Any, nodecaches: list[dict[str, Any]], rng: random.Random, fraction: float, round_: int) -> int:
    """Change ``fraction`` of the nodes' inventories: a fetch finishes, a failed copy is retried."""
    from dsplatform.wire import inventory as wire_inventory

    changed = 0
    for cache in rng.sample(nodecaches, max(1, int(len(nodecaches) * fraction))):
        doc = json.loads(cache["status"]["inventory"])
        for entry in doc["datasets"].values():
            if entry["state"] == "fetching":
                entry["state"] = "ready"
                entry.pop("heldBytes", None)
            elif entry["state"] == "failed":
                entry["state"], entry["heldBytes"] = "fetching", round_
        doc["freeBytes"] -= GIB * round_
        cache["status"]["inventory"] = wire_inventory.compact(doc)
        api.patch("nodecaches", cache["metadata"]["name"], {"status": {"inventory": cache["status"]["inventory"]}})
        changed += 1
    return changed


# -- the child process: the controller ----------------------------------------------------


def rss_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes (Linux)."""
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        out["VmHWM"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def reset_peak() -> bool:
    """Reset VmHWM to the current resident set (Linux >= 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(url: str, watch: bool, agent_s: float = 0.0) -> None:
    """Serve passes over stdin/stdout: ``pass`` runs one, ``reset`` resets the peak RSS,
    ``sync N`` waits until the node watch has applied the NodeCache changes up to
    resourceVersion N (``watch``: the controller keeps the Nodes by list+watch, as it does by
    default; else it lists them every pass)."""
    from kubernetes import client

    from dsagent.controller.controllersettings import ControllerSettings
    from dsagent.controller.reconcile import DatasetController

    calls = [0]
    counting = threading.Lock()

    def agent_call(node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any]:
        with counting:  # the controller asks several agents at a time
            calls[0] += 1
        if agent_s:
            time.sleep(agent_s)  # the agent's round trip and its answer
        if method == "GET" and path == "/v1/tasks":
            return 200, {"tasks": []}
        if method == "GET" and path == "/v1/preparations":
            return 200, {"preparations": []}
        if method == "PUT" and path.startswith("/v1/stripes/"):  # the member holds its share
            return 200, {"complete": True, "bytesHeld": GIB, "bytesOwned": GIB}
        if method == "PUT":
            wanted = [d.get("name") for d in (body or {}).get("datasets", []) if isinstance(d, dict)] or [who]
            return 200, {
                "datasets": [{"name": n, "state": "ready", "sizeBytes": GIB, "bytesDone": GIB} for n in wanted]
            }
        return 200, {}

    config = client.Configuration()
    config.host = url
    settings = ControllerSettings(
        namespace=NS, identity="bench", pack_image="registry.example/dsp:1", watch_nodes=watch, watch_pods=watch
    )
    controller = DatasetController(
        client.ApiClient(config), settings, clock=lambda: PUBLISHED + 30, agent_call=agent_call
    )
    controller.pods.start_watch = watch  # as the process does: started by the first pass that reads every pod
    if controller.node_watch is not None:
        controller.node_watch.start()
        if not controller.node_watch.wait_synced(600):
            raise SystemExit("the node watch did not list the nodes within 600 s")
    print(json.dumps({"ready": True, **rss_status()}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command.startswith("sync "):
            target, t0 = int(command.split()[1]), time.perf_counter()
            while (
                controller.node_watch is not None
                and int(controller.node_watch.versions.get("nodecaches") or 0) < target
            ):
                if time.perf_counter() - t0 > 120:
                    raise SystemExit("the node watch did not catch up within 120 s")
                time.sleep(0.005)
            pods = controller.pods.watch
            if pods is not None and pods.started and not pods.wait_synced(600):
                raise SystemExit("the pods watch did not list the pods within 600 s")
            print(json.dumps({"synced_s": time.perf_counter() - t0}), flush=True)
        elif command == "reset":
            print(json.dumps({"reset": reset_peak()}), flush=True)
        elif command in ("pass", "profile"):
            calls[0] = 0
            profiler = cProfile.Profile() if command == "profile" else None
            cpu0, t0 = time.process_time(), time.perf_counter()
            if profiler is not None:
                profiler.runcall(controller.reconcile_all)
            else:
                controller.reconcile_all()
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            if profiler is not None:
                stats = pstats.Stats(profiler, stream=sys.stderr)
                stats.sort_stats("cumulative").print_stats(40)
            print(json.dumps({"pass_s": wall, "cpu_s": cpu, "agent_calls": calls[0], **rss_status()}), flush=True)
        elif command == "quit":
            return


class Child:
    def __init__(self, url: str, watch: bool, agent_ms: float = 0.0) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                url,
                "--agent-ms",
                str(agent_ms),
                *(["--watch"] if watch else []),
            ],  # fmt: skip
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.started = self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the controller process ended (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        self.proc.wait(30)


# -- the parent ------------------------------------------------------------------------------


def record_size(record: Record, result: dict[str, Any], size: int, datasets: int, added: int, suffix: str) -> None:
    """The first pass's row and the timed passes' row of one cluster size and mode."""
    first = result["first_pass"]
    timed = {
        "pass_s_median": result["pass_s_median"],
        "pass_s": [p["pass_s"] for p in result["passes"]],
        "peak_rss_bytes": result["peak_rss_bytes"],
        "rss_before_bytes": result["rss_before_bytes"],
        "node_object_bytes_added_max": added,
    }
    loads = [p["load"] for p in result["passes"]]
    for step, wall, cpu, extra, load_ in (
        (f"first pass at {size} nodes{suffix}", first["pass_s"], first["cpu_s"], {}, first["load"]),
        (f"pass at {size} nodes{suffix}", result["pass_s_median"], result["cpu_s_median"], timed, loads),
    ):
        record.row(
            step, "controller", wall, cpu, nodes=size, datasets=datasets, first_pass_s=first["pass_s"],
            agent_calls=first["agent_calls"] if not extra else result["agent_calls"], load=load_, **extra,
        )  # fmt: skip


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def run_size(
    nodes: int,
    datasets: int,
    held: int,
    repeat: int,
    churn_fraction: float,
    profile: bool = False,
    write_latency: float = 0.0,
    watch: bool = True,
    agent_ms: float = 0.0,
    pods_per_node: int = 0,
) -> dict[str, Any]:
    from tools.support.fake_apiserver import FakeApiServer, _parse_path

    t0 = time.perf_counter()
    objects = build(nodes, datasets, held, pods_per_node=pods_per_node)
    rng = random.Random(nodes)
    with FakeApiServer(list_cache=True, write_latency=write_latency) as api:
        for kind in ("nodes", "nodecaches", "pods", "datasets"):
            for obj in objects[kind]:
                api.create(obj)
        # the nodes' NodeCaches as the server holds them (churn edits and patches these)
        caches = api.list("nodecaches")
        api.store.log.clear()  # the watches start from a list made after this

        def prime() -> None:  # as the controller lists them: from the watch cache (resourceVersion=0)
            for path in ("/api/v1/nodes", "/apis/dsagent.io/v1alpha1/nodecaches", "/api/v1/pods"):
                api.list_bytes(_parse_path(path), {"resourceVersion": "0"})

        prime()
        print(f"# {nodes} nodes built and loaded in {time.perf_counter() - t0:.1f} s (load {load()})", flush=True)
        controller = Child(api.url, watch, agent_ms)
        try:
            first = controller.ask("pass")  # writes every Dataset's status: reported on its own
            first["load"] = os.getloadavg()[0]
            print(
                f"first pass at {nodes} nodes (writes every status): {first['pass_s']:.3f} s, "
                f"CPU {first['cpu_s']:.3f} s, {first['agent_calls']} agent calls, load {first['load']:.2f}",
                flush=True,
            )
            passes = []
            for round_ in range(1, repeat + 1):
                churn(api, caches, rng, churn_fraction, round_)
                if watch:  # a pass starts once the watch has the changes, as a resync after them would
                    controller.ask(f"sync {api.store.rv}")
                else:
                    api.store.log.clear()  # kept for the watches only
                prime()
                if round_ == 1:
                    controller.ask("reset")
                result = controller.ask("profile" if profile and round_ == repeat else "pass")
                result["load"] = os.getloadavg()[0]
                passes.append(result)
        finally:
            controller.close()
    return {
        "nodes": nodes,
        "datasets": datasets,
        "first_pass": first,
        "passes": passes,
        "pass_s_median": statistics.median(p["pass_s"] for p in passes),
        "cpu_s_median": statistics.median(p["cpu_s"] for p in passes),
        "peak_rss_bytes": max(p.get("VmHWM", 0) for p in passes),
        "rss_before_bytes": controller.started.get("VmRSS"),
        "agent_calls": passes[-1]["agent_calls"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,5000,15000", help="comma-separated cluster sizes")
    parser.add_argument("--datasets", type=int, default=1000, help="Datasets in the cluster (M)")
    parser.add_argument("--held", type=int, default=12, help="datasets each node's inventory lists")
    parser.add_argument("--pods-per-node", type=int, default=6, help="running training pods on each node")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per size")
    parser.add_argument("--churn", type=float, default=0.01, help="fraction of inventories changed before a pass")
    parser.add_argument(
        "--api-write-ms", type=float, default=0.0, help="each API write answered this much later (a real round trip)"
    )
    parser.add_argument(
        "--agent-ms", type=float, default=0.0, help="each agent call answered this much later (a node's round trip)"
    )
    parser.add_argument("--json", type=Path, help="write the results here (tools/bench/support/record.py)")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a temporary one)")
    parser.add_argument("--smoke", action="store_true", help="seconds: 100 nodes, 50 Datasets, 2 passes")
    parser.add_argument(
        "--profile", action="store_true", help="profile the last timed pass (cProfile, to stderr; slows it)"
    )
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--watch", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child, opts.watch, opts.agent_ms / 1000)
        return
    if opts.smoke:
        opts.nodes, opts.datasets, opts.repeat = "100", 50, 2
    sizes = [int(s) for s in opts.nodes.split(",")]
    record = Record(
        "controller",
        {
            "nodes": sizes,
            "datasets": opts.datasets,
            "held_per_node": opts.held,
            "pods_per_node": opts.pods_per_node,
            "repeat": opts.repeat,
            "churn": opts.churn,
            "api_write_ms": opts.api_write_ms,
            "agent_ms": opts.agent_ms,
            "peak_rss": "VmHWM of the controller process over the timed passes",
        },
    )
    added, parts = node_bytes_added()
    print(f"# load average at the start: {load()} ({os.cpu_count()} CPUs)")
    print(
        f"node object bytes added max: {added} B (annotations {parts['annotations']}, labels {parts['labels']}, "
        f"condition {parts['condition']}, class resources {parts['resources']}); goal <= {GOAL_NODE_BYTES} B; "
        f"load {load()}"
    )
    record.row("node object bytes added", "max", 0.0, None, bytes=added, **{f"{k}_bytes": v for k, v in parts.items()})
    record.ratio(
        f"bytes the platform adds to a Node: {GOAL_NODE_BYTES} B / measured",
        GOAL_NODE_BYTES / added,
        1.0,
        f"{added} B; load {load()}",
    )
    print(
        f"{'nodes':>6} {'datasets':>8} {'nodes by':>8} {'pass s':>8} {'CPU s':>7} {'peak RSS MiB':>13} "
        f"{'agent calls':>12} {'load':>6}"
    )
    results, listing = {}, {}
    with tempfile.TemporaryDirectory(dir=opts.workdir):
        for size in sizes:
            # the baseline first: the same cluster with the Nodes and pods listed every pass, as without the watches
            for watch in (False, True):
                result = run_size(
                    size, opts.datasets, opts.held, opts.repeat, opts.churn, opts.profile, opts.api_write_ms / 1000,
                    watch=watch, agent_ms=opts.agent_ms, pods_per_node=opts.pods_per_node,
                )  # fmt: skip
                (results if watch else listing)[size] = result
                mode = "watch" if watch else "list"
                print(
                    f"{size:>6} {opts.datasets:>8} {mode:>8} {result['pass_s_median']:>8.3f} "
                    f"{result['cpu_s_median']:>7.3f} {result['peak_rss_bytes'] / 2**20:>13.1f} "
                    f"{result['agent_calls']:>12} {load():>6}",
                    flush=True,
                )
                record_size(
                    record, result, size, opts.datasets, added, "" if watch else " (Nodes and pods listed every pass)"
                )
            faster = listing[size]["pass_s_median"] / results[size]["pass_s_median"]
            record.ratio(
                f"controller pass at {size:,} nodes: Nodes and pods listed every pass / watched",
                faster,
                None,
                f"{listing[size]['pass_s_median']:.3f} s / {results[size]['pass_s_median']:.3f} s; load {load()}",
            )
            print(
                f"# at {size} nodes a pass with the Nodes and pods watched is {faster:.2f}x one listing them",
                flush=True,
            )
    if 5000 in results:
        five = results[5000]
        record.ratio(
            f"controller pass at 5,000 nodes, {opts.datasets:,} Datasets: {GOAL_PASS_S_5K:g} s / measured",
            GOAL_PASS_S_5K / five["pass_s_median"],
            1.0,
            f"{five['pass_s_median']:.3f} s; load {five['passes'][-1]['load']:.2f}",
        )
        record.ratio(
            "controller peak RSS at 5,000 nodes: 500 MiB / measured",
            GOAL_RSS_5K / five["peak_rss_bytes"],
            1.0,
            f"{five['peak_rss_bytes'] / 2**20:.0f} MiB (the process's VmHWM)",
        )
        print(
            f"goal: pass at 5,000 nodes <= {GOAL_PASS_S_5K:g} s: {five['pass_s_median']:.3f} s "
            f"({'met' if five['pass_s_median'] <= GOAL_PASS_S_5K else 'NOT met'}); peak RSS <= 500 MiB: "
            f"{five['peak_rss_bytes'] / 2**20:.0f} MiB "
            f"({'met' if five['peak_rss_bytes'] <= GOAL_RSS_5K else 'NOT met'})"
        )
    if 5000 in results and 15000 in results:
        growth = results[15000]["pass_s_median"] / results[5000]["pass_s_median"]
        record.ratio(
            f"controller growth 5,000 -> 15,000 nodes: {GOAL_GROWTH:g} / pass_s(15k)/pass_s(5k)",
            GOAL_GROWTH / growth,
            1.0,
            f"pass_s(15k)/pass_s(5k) = {growth:.2f}",
        )
        print(
            f"goal: pass_s(15k)/pass_s(5k) <= {GOAL_GROWTH:g}: {growth:.2f} "
            f"({'met' if growth <= GOAL_GROWTH else 'NOT met'})"
        )
    print(
        f"goal: <= {GOAL_NODE_BYTES} B added per Node: {added} B ({'met' if added <= GOAL_NODE_BYTES else 'NOT met'})"
    )
    print(f"# load average at the end: {load()}")
    record.write(opts.json)


if __name__ == "__main__":
    main()
