"""The simulator's workload file, --list-node-types, and the cache-pressure sweep's smoke size."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools.sim import sweep
from tools.sim.engine import ClusterParams, build_nodes
from tools.sim.policies import PRODUCT_POLICY
from tools.sim.rates import READ_MIX
from tools.sim.results import GOALS
from tools.sim.workload import WorkloadParams
from tools.sim.workload_file import WorkloadError, WorkloadFile, datasets_total_bytes, load, total_gpus

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "tools" / "sim" / "workloads"
RUN = REPO / "tools" / "sim" / "run.py"


def good() -> dict:
    return json.loads((WORKLOADS / "smoke.json").read_text())


def write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_default_preset_is_the_generators_defaults() -> None:
    wf = load(WORKLOADS / "default.json")
    assert wf.workload() == WorkloadParams()
    cluster = wf.cluster()
    defaults = ClusterParams()
    assert (cluster.nodes, cluster.cache_bytes, cluster.storage_bw) == (500, defaults.cache_bytes, defaults.storage_bw)
    assert total_gpus(cluster) == 4000


def test_every_shipped_workload_loads() -> None:
    for path in sorted(WORKLOADS.glob("*.json")):
        wf = load(path)
        assert datasets_total_bytes(wf) > 0, path


@pytest.mark.parametrize(
    ("edit", "mix"),
    [
        (lambda d: d, [(c.name, c.share, c.bytes_per_s) for c in READ_MIX]),
        (lambda d: {**d, "gpu_read_bytes_per_s": 1e8}, []),
        (
            lambda d: {
                **d,
                "gpu_read_mix": [
                    {"name": "a", "share": 0.25, "bytes_per_s": 1e6},
                    {"name": "b", "share": 0.75, "bytes_per_s": 2e8},
                ],
            },
            [("a", 0.25, 1e6), ("b", 0.75, 2e8)],
        ),
    ],
)
def test_a_copy_of_a_workload_file_reads_as_the_file_does(edit: Callable[[dict], dict], mix: list) -> None:
    """A seeded or overridden copy (``{**wf.model_dump(), ...}``, as results.py, sweeps and
    --seed build it) draws its jobs' read rates as the file does: a file that leaves the
    per-GPU rate out keeps the read mix."""
    wf = WorkloadFile.model_validate(edit(good()))
    copy = WorkloadFile.model_validate({**wf.model_dump(), "seed": wf.seed + 1})
    assert [tuple(m) for m in copy.cluster().gpu_read_mix] == [tuple(m) for m in wf.cluster().gpu_read_mix] == mix
    assert copy.cluster().gpu_read_bw == wf.cluster().gpu_read_bw


def test_node_counts_are_exact(tmp_path: Path) -> None:
    doc = good()
    doc["nodes"] = [{"type": "h100-11nic", "count": 3}, {"type": "a100-pcie-2gpu", "count": 2}]
    nodes = build_nodes(load(write(tmp_path, doc)).cluster(), seed=1)
    names = sorted(n.type.name for n in nodes)
    assert len(nodes) == 5 and sum(len(n.free) for n in nodes) == 3 * 8 + 2 * 2
    assert names.count("princeton-della-2xA100-pcie-2nic-epyc") == 2


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update(colour="blue"), "colour: unknown key"),
        (lambda d: d["datasets"].update(zipf=1.0), "datasets.zipf: unknown key"),
        (lambda d: d["nodes"][0].update(gpus=8), "nodes.0.gpus: unknown key"),
        (lambda d: d["nodes"][0].update(type="dgx-z"), "unknown node type 'dgx-z'"),
        (lambda d: d["jobs"].update(workers={"1": 0.5, "2": 0.4}), "sum to 0.9, not 1"),
        (lambda d: d["jobs"].update(gpus_per_worker={"x": 1.0}), "keys are whole numbers"),
        (lambda d: d["jobs"].update(deadline_alpha=[]), "jobs.deadline_alpha"),
        (lambda d: d.pop("seed"), "seed: Field required"),
        (lambda d: d.update(cache_bytes_per_node=-1), "cache_bytes_per_node"),
    ],
)
def test_bad_files_are_refused_in_one_line(tmp_path: Path, edit: Callable[[dict], object], expected: str) -> None:
    doc = good()
    edit(doc)
    with pytest.raises(WorkloadError) as err:
        load(write(tmp_path, doc))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_not_json_and_missing_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(WorkloadError, match="not JSON"):
        load(bad)
    with pytest.raises(WorkloadError, match="cannot read"):
        load(tmp_path / "absent.json")


def test_run_refuses_a_bad_file_with_exit_2_and_one_line(tmp_path: Path) -> None:
    doc = good()
    doc["jobs"]["lode"] = 0.9
    done = subprocess.run(
        [sys.executable, str(RUN), "--workload", str(write(tmp_path, doc))],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "jobs.lode: unknown key" in done.stderr
    assert "Traceback" not in done.stderr


def test_list_node_types_prints_gpus_and_class_layouts() -> None:
    done = subprocess.run(
        [sys.executable, str(RUN), "--list-node-types"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    types = {t["name"]: t for t in json.loads(done.stdout)}
    assert types["dgx-a100"]["gpus"] == 8
    assert [c["gpus"] for c in types["dgx-a100"]["roce_classes"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [c["gpus"] for c in types["v100-2nic"]["roce_classes"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert types["a100-pcie-2gpu"]["gpus"] == 2


def _sweep_smoke(out: Path, policies: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "sim" / "sweep.py"), "--smoke", "--procs", "1", "--out", str(out)]
        + ["--policies", policies],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads((out / "sweep.json").read_text())
    return rows


def test_sweep_smoke_writes_its_table_and_json(tmp_path: Path) -> None:
    rows = _sweep_smoke(tmp_path, f"default,fluid,juicefs+pack,{PRODUCT_POLICY}")
    assert [r["ratio"] for r in rows][:2] == [0.05, 1.0] and rows[2]["regime"].startswith("multi-TB")
    for row in rows:
        assert set(row["policies"]) == {"default", "fluid", "juicefs+pack", PRODUCT_POLICY}
        assert row["cache_bytes_per_node"] == row["workload"]["cache_bytes_per_node"]
        # the results pages' goals, the product's policy against the rivals that ran
        assert [g[0] for g in row["goals"]] == [label for label, *_ in GOALS]
        for field in ("queued_data_wait_mean_s", "storage_first_bytes", "storage_uncached_bytes", "local_fraction"):
            assert field in row["policies"][PRODUCT_POLICY]
    # more cache never reads more from storage for the node-cache policies' baseline
    assert rows[0]["policies"]["default"]["storage_bytes"] == rows[1]["policies"]["default"]["storage_bytes"]
    text = (tmp_path / "sweep.md").read_text()
    assert f"| {PRODUCT_POLICY} |" in text and "| regime | local bytes >= 1.5x best Fluid |" in text
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_sweep_goals_put_the_product_policy_against_the_best_rival_that_ran() -> None:
    def figures(local: float, store: float, ttfs: float = 10.0) -> dict[str, Any]:
        return {
            "local_fraction": local, "storage_bytes": store, "ttfs_mean_s": ttfs, "gpu_hours_idle_for_data": 5.0,
            "jct_mean_s": 3600.0, "jobs_across_subnets_avoidable": 0, "queued_ttfs_mean_s": 0.0,
        }  # fmt: skip

    by = {
        PRODUCT_POLICY: figures(0.9, 110.0),
        "fluid": figures(0.2, 200.0),
        "fluid-r4+passive": figures(0.5, 300.0, ttfs=5.0),
        "juicefs+pack": figures(0.05, 100.0),
    }
    got = {label: (figure, met) for label, figure, met in sweep.goals(by)}
    assert got["local bytes >= 1.5x best Fluid"] == ("1.80x (fluid-r4+passive)", True)
    assert got["store bytes <= 1.0x"] == ("1.10x (juicefs+pack)", False)
    assert got["TTFS <= 1.0x"] == ("2.00x (fluid-r4+passive)", False)
    assert got["avoidable split jobs = 0"] == ("0", True)
    # without a Fluid setting, the local-byte goal has no rival and is left out
    alone = {
        label for label, _, _ in sweep.goals({PRODUCT_POLICY: by[PRODUCT_POLICY], "juicefs+pack": by["juicefs+pack"]})
    }
    assert "local bytes >= 1.5x best Fluid" not in alone and "store bytes <= 1.0x" in alone


def test_sweep_smoke_reports_what_preparation_and_replication_change(tmp_path: Path) -> None:
    rows = _sweep_smoke(tmp_path, "ours,ours+prepare,ours+replicas")
    for row in rows:
        assert set(row["policies"]) == {"ours", "ours+prepare", "ours+replicas"}
        # no Fluid-style here: only the preparation goal, ours against ours+prepare
        assert [g[0] for g in row["goals"]] == ["queued TTFS -50% with preparation"]
    prepared = sum(r["policies"]["ours+prepare"]["prepare_fetch_bytes"] for r in rows)
    assert prepared > 0 and all(r["policies"]["ours"]["prepare_fetch_bytes"] == 0 for r in rows)
    assert sum(r["policies"]["ours+replicas"]["replica_fetch_bytes"] for r in rows) > 0
    text = (tmp_path / "sweep.md").read_text()
    assert "| ours+replicas |" in text and "queued data wait s ours / +prepare" in text
