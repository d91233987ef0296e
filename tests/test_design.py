"""docs/design.md#layers is drawn from the import contracts: the picture names the layers and
packages the contracts in pyproject.toml enforce, in their order. docs/design.md#code-map
states the version each wire contract writes."""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from tests.conftest import REPO_ROOT


def _contracts() -> dict[str, object]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]


def _picture() -> str:
    text = (REPO_ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- layers -->\n```text\n(.*?)```\n<!-- /layers -->", text, re.S)
    assert found, "docs/design.md has no layers picture between <!-- layers --> and <!-- /layers -->"
    return found.group(1)


def test_the_pictures_dsagent_layers_are_the_contracts_in_their_order() -> None:
    [layers] = [c for c in _contracts()["contracts"] if c["type"] == "layers" and c["containers"] == ["dsagent"]]
    rows = [line.strip() for line in _picture().splitlines()]
    positions = []
    for layer in layers["layers"]:
        drawn = [i for i, row in enumerate(rows) if re.match(rf"{re.escape(layer)}(\s{{2,}}|$)", row)]
        assert drawn, f"the layer {layer!r} of pyproject.toml is not drawn in docs/design.md#layers"
        positions.append(drawn[0])
    assert positions == sorted(positions), "the picture draws dsagent's layers in another order than the contract"


def test_the_picture_names_every_root_package_and_the_shared_ones_in_their_order() -> None:
    picture = _picture()
    for package in _contracts()["root_packages"]:
        assert re.search(rf"\b{package}\b", picture), f"{package} is not in docs/design.md#layers"
    shared = [line.split()[0] for line in picture.splitlines() if line.startswith("   ") and line.split()]
    order = [p for p in shared if p in ("scheduling", "gpu_topology", "dsplatform")]
    assert order == ["scheduling", "gpu_topology", "dsplatform"], order


def test_every_process_folder_has_a_contract_forbidding_the_other_processes() -> None:
    forbidden = {
        tuple(c["source_modules"]): set(c["forbidden_modules"])
        for c in _contracts()["contracts"]
        if c["type"] == "forbidden"
    }
    assert {"scheduler_plugin", "dsagent.webhook"} <= forbidden[("dsagent.controller",)]
    assert {"scheduler_plugin", "dsagent.controller"} <= forbidden[("dsagent.webhook",)]
    assert {"dsagent.nodeagent", "dsagent.cache"} <= forbidden[("dsagent.controller",)]
    assert {"dsagent.nodeagent", "dsagent.cache"} <= forbidden[("dsagent.webhook",)]
    agent = ("dsagent.nodeagent", "dsagent.api", "dsagent.nodeplugins", "dsagent.cache")
    assert {"scheduler_plugin", "dsagent.controller", "dsagent.webhook"} <= forbidden[agent]
    assert {"dsagent.controller", "dsagent.webhook", "dsagent.nodeagent"} <= forbidden[("dsagent.kube",)]
    assert "dsagent" in forbidden[("scheduler_plugin",)]
    assert {"dsagent", "scheduler_plugin"} <= forbidden[("scheduling",)]


def _wire_versions() -> dict[str, int]:
    """Each wire contract's module (as docs/design.md cites it) and the ``VERSION`` it writes."""
    import dsplatform.wire

    versions = {}
    for info in pkgutil.iter_modules(dsplatform.wire.__path__):
        version = getattr(importlib.import_module(f"dsplatform.wire.{info.name}"), "VERSION", None)
        if isinstance(version, int):
            versions[f"dsplatform/wire/{info.name}.py"] = version
    return versions


def test_the_code_map_states_the_version_each_wire_contract_writes() -> None:
    lines = (REPO_ROOT / "docs" / "design.md").read_text(encoding="utf-8").splitlines()
    versions = _wire_versions()
    assert "dsplatform/wire/csivolume.py" in versions
    for path, version in versions.items():
        stated = {int(n) for line in lines if f"`{path}`" in line for n in re.findall(r"\(version (\d+)", line)}
        assert stated, f"docs/design.md#code-map names {path} with no '(version N)'"
        assert stated == {version}, f"docs/design.md calls {path} version {sorted(stated)}; its VERSION is {version}"
