"""The tools' imports: no cycle among the modules under ``tools/``, and nothing from ``tests/``.

Every module under ``tools/`` is parsed, and every import it holds counts, wherever it is:
at module level, inside a function (an import moved into a function to break a cycle is
still the cycle) or under ``TYPE_CHECKING``. The simulator (``tools/sim/``) is built in
layers: the policy names (``policies.py``) and the records at the bottom, the state, its
flows, reads and placement above them, the engine above those, and the runner, the report
and the sweeps on top; a cycle among them is a layer that reaches up. The tests may import
the tools (``tools/support/``: the fakes and harnesses both use), never the other way
round, so that the two trees do not import each other in a circle either.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
#: a string that names a module of the test suite, as ``python -m tests.x`` or
#: ``importlib.import_module("tests.x")`` would be given it
TESTS_MODULE = re.compile(r"tests(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _modules() -> dict[str, Path]:
    """Every module under ``tools/`` by its dotted name (a package by its ``__init__.py``)."""
    out: dict[str, Path] = {}
    for path in sorted(TOOLS.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, name)`` for every import in the module: ``import X`` as ``X``, ``from X import y``
    as ``X.y`` (a submodule or not), a relative import resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def _graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other modules under ``tools/``: the longest known prefix of
    every imported name (``tools.sim.engine.Simulation`` is ``tools.sim.engine``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, set())
        for _, imported in _imports(name, path):
            parts = imported.split(".")
            for end in range(len(parts), 0, -1):
                target = ".".join(parts[:end])
                if target in modules:
                    if target != name:
                        edges.add(target)
                    break
    return graph


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each as its members in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def _path_around(members: list[str], graph: Mapping[str, set[str]]) -> list[str]:
    """One cycle through the first member of a component, for the failure message."""
    inside = set(members)
    start = members[0]
    seen = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & inside):
            if child == start:
                return [*seen[node], start]
            if child not in seen:
                seen[child] = [*seen[node], child]
                queue.append(child)
    return members


def test_the_checks_see_imports_anywhere_and_find_a_cycle(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from tools.sim.engine import Simulation\n"
        "def f():\n    import tests.s3server\n    from . import sibling\n    from ..sim import state\n",
        encoding="utf-8",
    )
    assert [n for _, n in _imports("tools.bench.m", module)] == [
        "typing.TYPE_CHECKING",
        "tools.sim.engine.Simulation",
        "tests.s3server",
        "tools.bench.sibling",
        "tools.sim.state",
    ]
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _path_around(["a", "b", "c"], graph) == ["a", "b", "c", "a"]


def test_no_module_under_tools_is_in_an_import_cycle() -> None:
    modules = _modules()
    graph = _graph(modules)
    sim = [m for m in graph if m.startswith("tools.sim.")]
    assert len(sim) > 20 and graph["tools.sim.engine"], "too few simulator modules or imports: would prove nothing"
    cycles = _cycles(graph)
    assert cycles == [], "import cycles under tools/: " + "; ".join(
        f"{' -> '.join(_path_around(c, graph))} (a circle of {len(c)}: {', '.join(c)})" for c in cycles
    )


def test_the_simulators_layers_below_the_engine_do_not_import_it() -> None:
    graph = _graph(_modules())

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for child in graph.get(todo.pop(), set()) - seen:
                seen.add(child)
                todo.append(child)
        return seen

    assert reaches("tools.sim.policies") <= {"tools.sim.fluid"}
    for lower in ("state", "hooks", "flows", "stripereads", "reads", "placement", "policies"):
        assert "tools.sim.engine" not in reaches(f"tools.sim.{lower}"), lower


def test_no_tool_imports_the_test_suite() -> None:
    offenders = []
    modules = _modules()
    for name, path in modules.items():
        where = path.relative_to(REPO)
        for line, imported in _imports(name, path):
            if imported == "tests" or imported.startswith("tests."):
                offenders.append(f"{where}:{line} imports {imported}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and TESTS_MODULE.fullmatch(node.value):
                offenders.append(f"{where}:{node.lineno} names the module {node.value}")
    assert len(modules) > 40, "too few modules under tools/: the check would prove nothing"
    assert sorted(set(offenders)) == [], "tools/ must not use tests/: move what both need to tools/support/"
