"""The lock is in step with pyproject.toml.

``requirements-test.txt`` pins the whole test environment (``make test``, ``make demo`` and CI
install from it). It must pin every requirement the ``test`` extra brings in, our own extras
followed, at a version that requirement admits, and name as direct requirements exactly the
packages pyproject.toml declares. Whoever changes a dependency and forgets ``make lock`` fails
here, not on a fresh machine.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements-test.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
DIRECT = "dsplatform (pyproject.toml)"


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project


def declared(extra: str = "test") -> list[Requirement]:
    """The requirements ``pip install .[extra]`` asks for, our own extras expanded."""
    project = _project()
    own = canonicalize_name(project["name"])
    found = [Requirement(line) for line in project["dependencies"]]
    seen: set[str] = set()
    todo = [extra]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in project["optional-dependencies"][name]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == own:
                todo.extend(requirement.extras)
            else:
                found.append(requirement)
    return found


def locked() -> tuple[dict[NormalizedName, list[Version]], set[NormalizedName]]:
    """Every pinned version per package, and the packages the lock says pyproject.toml asked for."""
    pins: dict[NormalizedName, list[Version]] = {}
    direct: set[NormalizedName] = set()
    current: NormalizedName | None = None
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            pins.setdefault(current, []).append(Version(match.group(2)))
        elif current is not None and line.strip().lstrip("#").strip().removeprefix("via ").strip() == DIRECT:
            direct.add(current)
    return pins, direct


def test_the_lock_pins_every_declared_requirement_at_a_version_it_admits() -> None:
    pins, _ = locked()
    assert len(pins) > 50, "the lock parsed to almost nothing: the check would prove nothing"
    problems = []
    for requirement in declared():
        versions = pins.get(canonicalize_name(requirement.name))
        if not versions:
            problems.append(f"{requirement} is not in the lock")
        for version in versions or []:
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{requirement} does not admit the locked {version}")
    assert problems == [], "requirements-test.txt is out of step with pyproject.toml (run make lock): " + "; ".join(
        problems
    )


def test_the_lock_names_no_direct_requirement_pyproject_dropped() -> None:
    _, direct = locked()
    wanted = {canonicalize_name(r.name) for r in declared()}
    assert direct, "no package in the lock is marked as asked for by pyproject.toml"
    assert sorted(direct - wanted) == [], "run make lock: the lock still carries requirements pyproject.toml dropped"
    assert sorted(wanted - direct) == [], "run make lock: pyproject.toml asks for packages the lock does not know"


def test_the_kubelet_grpc_stack_is_an_extra_not_a_runtime_requirement() -> None:
    runtime = {canonicalize_name(Requirement(line).name) for line in _project()["dependencies"]}
    assert not runtime & {"grpcio", "protobuf"}
    kubelet = {canonicalize_name(Requirement(line).name) for line in _project()["optional-dependencies"]["kubelet"]}
    assert kubelet == {"grpcio", "protobuf"}
