"""The nvidia-smi matrix parser copes with every way the text gets mangled, and says where it can't."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from gpu_topology import ParseError
from gpu_topology.discovery.nvidia_smi import (
    parse_gpu_query,
    parse_id_list,
    parse_topo_matrix,
)
from gpu_topology.dumps import detect_format, parse_dump

DELLA = "princeton-della-2xA100-pcie-2nic-epyc"
DGX_A100 = "dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend"
MYSTOUS = "mystous-8xH100-11nic-ansi-escapes-captured"
CGROUP = "mystous-8xH100-11nic-cgroup-empty-cpu-affinity-derived"


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda t: t.expandtabs(8), id="tabs-expanded-to-spaces"),
        pytest.param(lambda t: t.replace("\t", "\t\t"), id="doubled-tabs"),
        pytest.param(lambda t: t.replace("\t", " \t  "), id="stray-spaces"),
        pytest.param(lambda t: t.replace("\n", "\r\n"), id="crlf"),
        pytest.param(lambda t: "$ nvidia-smi topo -m\n" + t, id="shell-prompt-line"),
        pytest.param(lambda t: t.rstrip("\n"), id="no-final-newline"),
        pytest.param(lambda t: "\n\n" + t.lstrip("\t"), id="leading-blank-lines-and-stripped-header-tab"),
        pytest.param(lambda t: re.sub(r"\nLegend:.*?(?=\nNIC Legend|$)", "", t, flags=re.S), id="no-legend"),
        pytest.param(lambda t: "\x1b[4m" + t.replace("NUMA Affinity", "NUMA Affinity\x1b[0m", 1), id="ansi"),
    ],
)
def test_mangled_text_parses_like_the_original(
    mangle: Callable[[str], str], read_fixture: Callable[[str], str]
) -> None:
    for name in (DELLA, DGX_A100):
        original = read_fixture(name)
        assert parse_topo_matrix(mangle(original)) == parse_topo_matrix(original), name


def test_without_the_nic_legend_nics_keep_their_column_names(read_fixture: Callable[[str], str]) -> None:
    text = read_fixture(MYSTOUS).split("NIC Legend")[0]
    topology = parse_topo_matrix(text)
    assert [n.name for n in topology.nics] == [f"NIC{i}" for i in range(11)]
    assert str(topology.link("GPU7", "NIC8")) == "PXB"


def test_a_nic_name_without_a_trailing_number_is_a_device_when_it_has_a_row() -> None:
    text = "\tGPU0\tbnxt_re_bond\tCPU Affinity\nGPU0\t X \tPIX\t0-7\nbnxt_re_bond\tPIX\t X \t\n"
    topology = parse_topo_matrix(text)
    assert [n.name for n in topology.nics] == ["bnxt_re_bond"]
    assert str(topology.link("GPU0", "bnxt_re_bond")) == "PIX"


def test_old_drivers_soc_reads_as_sys() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t8-15\n"
    topology = parse_topo_matrix(text)
    assert str(topology.link("GPU0", "GPU1")) == "SYS"
    assert [g.cpu_affinity for g in topology.gpus] == ["0-7", "8-15"]


def test_na_affinities_are_unknown() -> None:
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tN/A\tN/A\t\tN/A\n"
    gpu = parse_topo_matrix(text).gpu(0)
    assert (gpu.cpu_affinity, gpu.numa_node, gpu.numa_affinity) == (None, None, ())


def test_an_unknown_cell_is_an_error_naming_its_line_and_row(read_fixture: Callable[[str], str]) -> None:
    text = read_fixture(DELLA).replace("GPU1\tSYS", "GPU1\tWAT", 1)
    with pytest.raises(ParseError, match=r"line 3 \(row GPU1\): unknown link type 'WAT'"):
        parse_topo_matrix(text)


def test_a_misaligned_matrix_is_an_error_not_a_wrong_topology(read_fixture: Callable[[str], str]) -> None:
    # Drop mlx5_0's cell for GPU0: every later cell of the row shifts one column left.
    text = read_fixture(DELLA).replace("mlx5_0\tNODE\t", "mlx5_0\t", 1)
    with pytest.raises(ParseError, match="row mlx5_0 has X in column GPU1.*misaligned"):
        parse_topo_matrix(text)


def test_an_asymmetric_matrix_is_an_error(read_fixture: Callable[[str], str]) -> None:
    text = read_fixture(DELLA).replace("mlx5_0\tNODE\t", "mlx5_0\tPHB\t", 1)
    with pytest.raises(ParseError, match="GPU0-mlx5_0 is NODE but mlx5_0-GPU0 is PHB"):
        parse_topo_matrix(text)


def test_a_self_cell_off_the_diagonal_is_a_misalignment(read_fixture: Callable[[str], str]) -> None:
    text = read_fixture(DELLA).replace("mlx5_1\tSYS\tNODE\tSYS\t X", "mlx5_1\tSYS\tNODE\t X \tSYS", 1)
    with pytest.raises(ParseError, match="row mlx5_1 has X in column mlx5_0"):
        parse_topo_matrix(text)


def test_a_lost_cell_in_a_gpu_row_runs_into_the_affinity_and_fails(read_fixture: Callable[[str], str]) -> None:
    text = read_fixture(DELLA).replace("GPU0\t X \tSYS\t", "GPU0\t X \t", 1)
    with pytest.raises(ParseError, match=r"line 2 \(row GPU0\): unknown link type '0-63'"):
        parse_topo_matrix(text)


@pytest.mark.parametrize(
    "text",
    ["", "hello\nworld\n", "GPU0 X NV1\n", "\tGPU0\tGPU1\tBOGUS Column\nGPU0\t X \tNV1\t0\n"],
    ids=["empty", "prose", "rows-without-header", "unknown-header-column"],
)
def test_text_that_is_not_a_matrix_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_topo_matrix(text)


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("0", (0,)),
        ("3", (3,)),
        ("0-3", (0, 1, 2, 3)),
        ("0,8,252-255", (0, 8, 252, 253, 254, 255)),
        ("1, 0", (0, 1)),
        ("2-2", (2,)),
    ],
)
def test_id_lists_and_ranges(text: str, ids: tuple[int, ...]) -> None:
    assert parse_id_list(text) == ids


@pytest.mark.parametrize("text", ["a", "0-", "-1", "0,,1", "1-x", "5-3", ""])
def test_bad_id_lists_are_parse_errors(text: str) -> None:
    with pytest.raises(ParseError):
        parse_id_list(text)


def test_gpu_query_gives_uuids_and_normalised_bus_ids() -> None:
    text = (
        "0, GPU-6c3a1c1e-7f1b-2a64-b6e1-0f2d6f0b9a11, 00000000:07:00.0\n"
        "1, GPU-0d7e2b3c-1111-2222-3333-444455556666, 00000000:0F:00.0\n"
        "\n"
        "2, [N/A], N/A\n"
    )
    assert parse_gpu_query(text) == {
        0: ("GPU-6c3a1c1e-7f1b-2a64-b6e1-0f2d6f0b9a11", "0000:07:00.0"),
        1: ("GPU-0d7e2b3c-1111-2222-3333-444455556666", "0000:0f:00.0"),
        2: ("[N/A]", None),
    }


def test_a_garbled_gpu_query_line_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="line 2"):
        parse_gpu_query("0, GPU-x, 00000000:07:00.0\nnot a line\n")


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ("<system version='1'/>", "nccl-xml"),
        ("\ufeff  <system>", "nccl-xml"),
        ('{"version": 1}', "json"),
        ("\tGPU0\tCPU Affinity", "nvidia-smi"),
        (re.sub("x", "y", "GPU0"), "nvidia-smi"),
    ],
)
def test_format_detection(text: str, fmt: str) -> None:
    assert detect_format(text) == fmt


def test_parse_dump_names_the_formats_it_knows() -> None:
    from gpu_topology import InvalidTopology

    with pytest.raises(InvalidTopology, match="one of auto, nvidia-smi, nccl-xml, json"):
        parse_dump("", "yaml")


# -- empty attribute cells (cgroup-limited containers)


def test_empty_cpu_affinity_cells_neither_shift_the_numa_column_nor_hide_the_numa_nodes(
    read_fixture: Callable[[str], str],
) -> None:
    original = parse_topo_matrix(read_fixture(MYSTOUS))
    limited = parse_topo_matrix(read_fixture(CGROUP))
    assert [g.numa_node for g in limited.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.cpu_affinity for g in limited.gpus] == [None] * 8
    assert limited.links == original.links and limited.nics == original.nics


@pytest.mark.parametrize(
    ("cells", "cpus", "numa"),
    [
        ("0-7\t0\t\tN/A", "0-7", 0),
        ("\t0\t\tN/A", None, 0),
        ("0-7\t\t\tN/A", "0-7", None),
        ("\t\t\tN/A", None, None),
        ("\t1", None, 1),
    ],
    ids=["all", "no-cpus", "no-numa", "neither", "no-gpu-numa-id-column"],
)
def test_each_empty_attribute_cell_is_placed_by_its_tab(cells: str, cpus: str | None, numa: int | None) -> None:
    three = "GPU NUMA ID" in cells or cells.count("\t") > 1
    header = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity" + ("\tGPU NUMA ID" if three else "")
    text = f"{header}\nGPU0\t X \tNV4\t{cells}\nGPU1\tNV4\t X \t{cells}\n"
    gpu = parse_topo_matrix(text).gpu(1)
    assert (gpu.cpu_affinity, gpu.numa_node) == (cpus, numa)


def test_without_tabs_an_empty_cell_that_cannot_be_placed_is_refused(read_fixture: Callable[[str], str]) -> None:
    with pytest.raises(ParseError, match="the tabs that would place the empty ones are lost") as caught:
        parse_topo_matrix(read_fixture(CGROUP).expandtabs(8))
    assert "with its tabs" in (caught.value.hint or "")


def test_without_tabs_aligned_values_are_placed_by_their_column() -> None:
    header = "        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID"
    row0 = "GPU0     X      NV4                     0               N/A"
    row1 = "GPU1    NV4      X                      1               N/A"
    topology = parse_topo_matrix("\n".join([header, row0, row1]) + "\n")
    assert [(g.cpu_affinity, g.numa_node) for g in topology.gpus] == [(None, 0), (None, 1)]


# -- text copied from web pages and documents


COPIES = [
    pytest.param(lambda t: t.replace("\x1b", ""), id="escapes-without-their-esc-byte"),
    pytest.param(lambda t: t.replace("\x1b", "^["), id="escapes-in-caret-notation"),
    pytest.param(lambda t: "[1m" + t.replace("\n", "[0m\n", 1), id="bold-escapes-without-esc"),
    pytest.param(lambda t: "\n".join("# " + line for line in t.split("\n")), id="hash-comment-on-every-line"),
    pytest.param(lambda t: "\n".join("#" + line for line in t.split("\n")), id="hash-without-space"),
    pytest.param(lambda t: "\n".join("// " + line for line in t.split("\n")), id="slash-comment-on-every-line"),
    pytest.param(
        lambda t: "# $ nvidia-smi topo -m\n" + "\n".join(("# " + line) if line else "#" for line in t.split("\n")),
        id="commented-block-with-prompt-and-bare-markers",
    ),
    pytest.param(
        lambda t: "\n".join("    // " + line for line in t.replace("\x1b", "").split("\n")),
        id="indented-comment-and-lost-escapes",
    ),
]


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("name", [DELLA, DGX_A100, MYSTOUS, CGROUP])
def test_copies_from_web_pages_parse_like_the_original(
    copy: Callable[[str], str], name: str, read_fixture: Callable[[str], str]
) -> None:
    original = read_fixture(name)
    assert parse_topo_matrix(copy(original)) == parse_topo_matrix(original)


@pytest.mark.parametrize(
    ("prefix", "shown"),
    [("| ", "'|'"), ("1  ", "'1'"), (">>> ", "'>>>'"), ("-- ", "'--'")],
)
def test_another_prefix_on_every_line_is_refused_naming_what_to_strip(
    prefix: str, shown: str, read_fixture: Callable[[str], str]
) -> None:
    text = "\n".join(prefix + line for line in read_fixture(DELLA).split("\n"))
    with pytest.raises(ParseError, match=f"names GPU0 after {re.escape(shown)}") as caught:
        parse_topo_matrix(text)
    assert f"strip {shown}" in (caught.value.hint or "")


def test_escape_remnants_the_cleaner_cannot_read_are_named_in_the_hint(read_fixture: Callable[[str], str]) -> None:
    text = read_fixture(MYSTOUS).replace("\x1b[4m", "").replace("GPU0\tGPU1", "GPU0\t[4;GPU1", 1)
    with pytest.raises(ParseError, match="unexpected column") as caught:
        parse_topo_matrix(text)
    assert "escape codes" in (caught.value.hint or "")
    broken = read_fixture(MYSTOUS).replace("\x1b[4m", "[4")
    with pytest.raises(ParseError, match="names GPU0 after '\\[4'") as caught:
        parse_topo_matrix(broken)
    assert "strip '[4'" in (caught.value.hint or "")
