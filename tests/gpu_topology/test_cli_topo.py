"""``dsctl topo show`` and ``dsctl topo best`` over the real fixtures, through dsctl's edge."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from dsagent.cli import main

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "gpu_topology" / "topology.schema.json").read_text())


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def fixture(folder: Path, stem: str) -> str:
    return str(next(p for p in folder.iterdir() if p.name.startswith(stem) and p.suffix in (".txt", ".xml")))


def test_show_json_is_valid_against_the_committed_schema_for_every_fixture(
    topology_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in sorted(topology_fixtures.iterdir()):
        if path.suffix not in (".txt", ".xml"):
            continue
        code, out, err = run(["topo", "show", "--from", str(path), "--json"], capsys)
        assert (code, err) == (0, ""), path.name
        jsonschema.validate(json.loads(out), SCHEMA)


def test_show_prints_gpus_nics_classes_and_the_score_matrix(
    topology_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["topo", "show", "--from", fixture(topology_fixtures, "oneflow")], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "GPUs (8)"
    assert "  0    0     0-23,48-71    -           mlx5_0 (NODE)" in lines
    assert "  2    0     0-23,48-71    -           mlx5_0 (PIX)" in lines
    assert any(line.split() == ["mlx5_1", "1", "-", "-", "-", "-"] for line in lines)
    assert any(line.split() == ["gpu-roce2", "mlx5_1", "1", "4,5,6,7", "-"] for line in lines)
    row = next(line for line in lines if line.startswith("  GPU0 "))
    # NVLink + the PCIe level beneath it (NODE inside a socket, SYS across): go-gpuallocator's rule.
    assert row.split() == ["GPU0", "-", "120", "220", "120", "10", "10", "10", "210"]


def test_show_uses_the_class_prefix(topology_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture(topology_fixtures, "princeton-della")
    code, out, _ = run(["topo", "show", "--from", path, "--json", "--prefix", "example.com/roce"], capsys)
    assert code == 0
    assert [c["name"] for c in json.loads(out)["classes"]] == ["example.com/roce1", "example.com/roce2"]


def test_show_reads_its_own_json_back(
    topology_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = fixture(topology_fixtures, "ibm-cloud")
    _, first, _ = run(["topo", "show", "--from", path, "--json"], capsys)
    saved = tmp_path / "topology.json"
    saved.write_text(first)
    code, second, _ = run(["topo", "show", "--from", str(saved), "--format", "json", "--json"], capsys)
    assert code == 0 and json.loads(second) == json.loads(first)


def test_show_reads_stdin(
    topology_fixtures: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(Path(fixture(topology_fixtures, "princeton-della")).read_text()))
    code, out, _ = run(["topo", "show", "--from", "-", "--json"], capsys)
    assert code == 0 and json.loads(out)["nearestNics"] == {"0": ["mlx5_0"], "1": ["mlx5_1"]}


def test_best_prints_the_chosen_set_and_its_score(topology_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture(topology_fixtures, "dgx1")
    # GPU2-GPU3 NV2 over PIX (250); GPU0 is NV2 to GPU3 and NV1 to GPU2, GPU1 the other way
    # round, all over PHB: a tie at 610 that goes to the partition found first, {0,2,3}.
    code, out, _ = run(
        ["topo", "best", "--from", path, "--count", "3", "--must-include", "2,3", "--free", "0,1,2,3"], capsys
    )
    assert code == 0
    assert out.strip() == "GPUs 0,2,3  score 610  single NUMA node: yes  closest NIC: PIX"
    code, out, _ = run(["topo", "best", "--from", path, "-k", "2", "--free", "0,4,7", "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {"gpus": [4, 7], "score": 230, "singleNuma": True, "nicLevel": "PIX"}


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--count", "9"], 1, "no set of 9 GPUs"),
        (["--count", "2", "--must-include", "0,5", "--free", "0,1"], 1, "no set of 2 GPUs"),
        (["--count", "2", "--free", "0,x"], 2, "expected comma-separated GPU indices"),
        (["--count", "0"], 2, "--count"),
        (["--count", "2", "--free", "0,42"], 2, "no GPU 42 in this topology"),
    ],
)
def test_best_refuses_what_cannot_be_met_with_a_clear_line(
    args: list[str], code: int, message: str, topology_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got, _, err = run(["topo", "best", "--from", fixture(topology_fixtures, "dgx1"), *args], capsys)
    assert got == code
    assert message in err


def test_a_missing_or_unreadable_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["topo", "show", "--from", str(tmp_path / "nope.txt")], capsys)
    assert code == 2
    assert err.startswith("dsctl: error: cannot read topology file") and err.count("\n") == 1
    bad = tmp_path / "bad.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV9Z\n")
    code, _, err = run(["topo", "show", "--from", str(bad)], capsys)
    assert code == 2 and "bad.txt: line 2 (row GPU0): unknown link type 'NV9Z'" in err


def test_format_without_from_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["topo", "show", "--format", "nccl-xml"], capsys)
    assert code == 2 and "--format applies to --from only" in err
