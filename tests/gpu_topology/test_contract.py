"""The version-1 JSON contract: schema-valid, round-trips, and rejects what is malformed."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpu_topology import ParseError, Topology, UnknownDevice, from_json, to_json
from gpu_topology.contract import (
    classes_from_dict,
    schema,
    topology_from_dict,
    topology_to_dict,
)
from gpu_topology.dumps import parse_dump
from gpu_topology.errors import InvalidTopology

DGX_A100 = "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend"
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "gpu_topology" / "topology.schema.json"


def fixture_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix in (".txt", ".xml"))


@pytest.fixture(scope="module")
def all_topologies(topology_fixtures: Path) -> dict[str, Topology]:
    return {name: parse_dump((topology_fixtures / name).read_text()) for name in fixture_names(topology_fixtures)}


def test_the_committed_schema_is_a_valid_json_schema() -> None:
    committed = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(committed)
    assert schema() == committed


def test_every_fixture_serialises_to_schema_valid_json_that_round_trips(all_topologies: dict[str, Topology]) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    for name, topology in all_topologies.items():
        document = topology_to_dict(topology)
        assert list(validator.iter_errors(document)) == [], name
        assert topology_from_dict(document) == topology, name
        assert from_json(to_json(topology)) == topology, name


def test_compact_json_fits_the_annotation_budget(all_topologies: dict[str, Topology]) -> None:
    for name, topology in all_topologies.items():
        assert len(to_json(topology).encode()) < 32 * 1024, name
        assert ": " not in to_json(topology) and ", " not in to_json(topology), name


def test_the_dgx_a100_document_matches_the_issue_example(read_fixture: Callable[[str], str]) -> None:
    document = topology_to_dict(parse_dump(read_fixture(DGX_A100)))
    assert document["version"] == 1
    assert document["gpus"][0] == {
        "index": 0,
        "uuid": None,
        "pciBusId": None,
        "numaNode": 3,
        "cpuAffinity": "48-63,176-191",
    }
    assert document["nics"][0]["name"] == "mlx5_0"
    assert document["nics"][0]["numaNode"] == 3
    assert document["links"]["GPU0"]["GPU1"] == "NV12"
    assert document["links"]["GPU0"]["mlx5_0"] == "PXB"
    assert document["links"]["mlx5_0"]["GPU0"] == "PXB"
    assert "GPU0" not in document["links"]["GPU0"]
    assert document["nearestNics"]["0"] == ["mlx5_0", "mlx5_1"]
    assert document["nearestNics"]["7"] == ["mlx5_6", "mlx5_7"]
    assert document["classes"][0] == {
        "name": "gpu-roce1",
        "nics": ["mlx5_0", "mlx5_1"],
        "numaNode": 3,
        "subnets": [],
        "gpus": [0, 1],
    }


def test_the_class_prefix_is_configurable_and_published_names_can_be_read_back(
    read_fixture: Callable[[str], str],
) -> None:
    document = topology_to_dict(parse_dump(read_fixture(DGX_A100)), prefix="example.com/gpu-roce")
    assert [c["name"] for c in document["classes"]] == [f"example.com/gpu-roce{i}" for i in range(1, 5)]
    classes = classes_from_dict(document)
    assert classes[3].name == "example.com/gpu-roce4"
    assert classes[3].gpus == (6, 7)
    assert classes[3].numa_node == 5


def minimal() -> dict[str, Any]:
    return {
        "version": 1,
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "numaNode": 0, "cpuAffinity": "0-7"},
            {"index": 1, "uuid": None, "numaNode": None, "cpuAffinity": None},
        ],
        "nics": [{"name": "mlx5_0", "numaNode": 0, "addresses": ["10.0.0.2/24"], "subnets": ["10.0.0.0/24"]}],
        "links": {"GPU0": {"GPU1": "NV4", "mlx5_0": "PIX"}},
    }


def test_a_minimal_hand_written_document_reads_and_fills_the_reverse_links() -> None:
    topology = topology_from_dict(minimal())
    assert str(topology.link("GPU1", "GPU0")) == "NV4"
    assert str(topology.link("mlx5_0", "GPU0")) == "PIX"
    assert topology.link("GPU1", "mlx5_0") is None
    assert topology.nic("mlx5_0").subnets == ("10.0.0.0/24",)
    assert topology_to_dict(topology)["classes"][0]["subnets"] == ["10.0.0.0/24"]


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(document: dict[str, Any]) -> None:
        target: Any = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return apply


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (_set(("version",), 2), ParseError, "at version"),
        (_set(("gpus",), "all"), ParseError, "at gpus"),
        (_set(("gpus", 0, "index"), -1), ParseError, "at gpus/0/index"),
        (_set(("gpus", 0, "cpuAffinity"), "zero to seven"), ParseError, "at gpus/0/cpuAffinity"),
        (_set(("links", "GPU0", "GPU1"), "FAST"), ParseError, "at links/GPU0/GPU1"),
        (_set(("links", "GPU0", "GPU9"), "SYS"), UnknownDevice, "GPU9"),
        (_set(("links", "GPU1"), {"GPU0": "NV2"}), InvalidTopology, "contradictory links between GPU1 and GPU0"),
        (_set(("gpus", 1, "index"), 0), InvalidTopology, "duplicate devices: GPU0"),
        (_set(("nics", 0, "name"), ""), ParseError, "at nics/0/name"),
    ],
    ids=[
        "future-version",
        "gpus-not-a-list",
        "negative-index",
        "bad-cpu-list",
        "unknown-link-type",
        "link-to-unknown-gpu",
        "contradictory-links",
        "duplicate-gpu",
        "empty-nic-name",
    ],
)
def test_malformed_documents_are_rejected_with_where_and_why(
    change: Callable[[dict[str, Any]], None], error: type[Exception], match: str
) -> None:
    document = copy.deepcopy(minimal())
    change(document)
    with pytest.raises(error, match=match):
        topology_from_dict(document)


@pytest.mark.parametrize("text", ["{", "[]", "null", '"topology"'])
def test_text_that_is_not_a_json_object_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        from_json(text)


def test_contract_errors_carry_the_cli_and_http_codes() -> None:
    with pytest.raises(ParseError) as excinfo:
        from_json("{")
    assert (excinfo.value.exit_code, excinfo.value.http_status, excinfo.value.code) == (2, 400, "topology_parse_error")


@pytest.mark.parametrize(("mode", "count"), [("numa", 2), ("none", 1)])
def test_the_document_says_how_its_classes_were_cut(read_fixture: Callable[[str], str], mode: str, count: int) -> None:
    topology = parse_dump(read_fixture("mystous-8xH100-11nic-ansi-escapes-captured"))
    document = topology_to_dict(topology, mode=mode)
    assert document["classMode"] == mode
    assert len(document["classes"]) == count
    assert len(classes_from_dict(json.loads(to_json(topology, mode=mode)))) == count


def test_a_document_with_an_unknown_class_mode_is_refused() -> None:
    with pytest.raises(ParseError, match="classMode"):
        topology_from_dict({**minimal(), "classMode": "per-nic"})


def test_measured_pcie_levels_beneath_nvlinks_round_trip(read_fixture: Callable[[str], str]) -> None:
    topology = parse_dump(read_fixture("ibm-cloud-gx3d-8xH100-vsi-nccl-topo"))
    document = topology_to_dict(topology)
    assert document["nvlinkPcie"]["GPU0"]["GPU1"] == "PHB"
    assert document["nvlinkPcie"]["GPU0"]["GPU7"] == "SYS"
    assert "GPU1" not in document["nvlinkPcie"] or "GPU0" not in document["nvlinkPcie"]["GPU1"]  # one direction
    back = topology_from_dict(json.loads(json.dumps(document)))
    assert back == topology
    assert back.link("GPU1", "GPU0") == topology.link("GPU0", "GPU1")


def test_nvidia_smi_matrices_publish_no_measured_pcie_levels(read_fixture: Callable[[str], str]) -> None:
    assert topology_to_dict(parse_dump(read_fixture(DGX_A100)))["nvlinkPcie"] == {}


def test_a_bad_nvlink_pcie_level_is_refused() -> None:
    with pytest.raises(ParseError, match="nvlinkPcie"):
        topology_from_dict({**minimal(), "nvlinkPcie": {"GPU0": {"GPU1": "NV2"}}})
