"""Which simulator a result came from: a digest of the code that decides the figures.

A results document (``run.py --json``, ``results.py``'s per-workload and held-out runs)
records :func:`model_digest` under ``"model"``; ``results.py`` runs again the documents whose
digest is not the current one, and says so when it only renders them, so that a figure on a
page is never one an older simulator or an older product policy produced beside one the
current code did.

What it digests: the simulator's entry point (:mod:`tools.sim.run`) and every module of the
repository it imports, directly or not (the product's policies in :mod:`dsagent.policy`, the
stripe rules in :mod:`dsplatform.stripe`, ...), found by reading their import statements
(those under ``TYPE_CHECKING`` too: a few modules more than run, never fewer), each as
:func:`ast.unparse` writes it back with its docstrings left out: an edit to a comment, a
docstring or the layout leaves the digest as it was; one to a statement does not. With them,
the data the simulation draws from (:data:`DATA`: the job run times, the node types'
topologies). Pure reading of files: nothing is imported, so the digest does not depend on
what the calling process imported before.

Decision: a module the simulator reads values from without running its logic is a leaf
(:data:`LEAVES`): its own code counts, the modules it imports do not. The agent's settings
are one: the simulator reads two of their defaults, literals in the module's own text,
and following its imports took in the agent's storage, egress and source rules, which no
simulation calls, so that a change to them (a record's type in the format layer) made
every committed run another simulator's.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the repository's top-level packages whose modules count (anything else is a library)
PACKAGES = ("tools", "dsagent", "dsplatform", "scheduler_plugin", "gpu_topology", "scheduling")
ENTRY = "tools.sim.run"
#: the data files the simulation reads, as globs under the repository
DATA = ("tools/sim/data/*.csv", "tests/fixtures/topology/*")
#: modules read for values written in their own text (see the decision above): their code
#: counts, what they import does not
LEAVES = frozenset({"dsagent.cache.settings"})


def _file(module: str, root: Path) -> Path | None:
    """The file of ``module`` under ``root`` (a package's ``__init__.py``), None when it has none."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported(module: str, tree: ast.Module, is_package: bool, root: Path) -> set[str]:
    """The repository modules ``tree`` (the source of ``module``) names in its imports: each
    module imported, its parent packages (run on import), and a name imported from a package
    where it is a submodule."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts[: len(parts) - node.level + (1 if is_package else 0)]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            names = [prefix, *(f"{prefix}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in PACKAGES:
                continue
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in found if _file(name, root) is not None}


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return tree


def modules(entry: str = ENTRY, root: Path = REPO, leaves: frozenset[str] = LEAVES) -> dict[str, str]:
    """Every module of the repository at ``root`` that ``entry`` imports, directly or not,
    with ``entry`` itself, not past ``leaves``: its name -> its code without docstrings
    (:func:`ast.unparse`)."""
    code: dict[str, str] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        path = _file(name, root)
        if name in code or path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if name not in leaves:
            todo.extend(_imported(name, tree, path.name == "__init__.py", root) - code.keys())
        code[name] = ast.unparse(_without_docstrings(tree))
    return code


def model_digest(entry: str = ENTRY, root: Path = REPO, leaves: frozenset[str] = LEAVES) -> str:
    """A short digest of :func:`modules` and the :data:`DATA` files: the same code and data
    give the same digest."""
    digest = hashlib.sha256()
    for name, code in sorted(modules(entry, root, leaves).items()):
        digest.update(f"{name}\0{code}\0".encode())
    for path in sorted({p for pattern in DATA for p in root.glob(pattern) if p.is_file()}):
        digest.update(f"{path.relative_to(root)}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def model_stamp() -> str:
    """What a document records under ``"model"``: :func:`model_digest` of the simulator and
    the interpreter's version (whose :func:`ast.unparse` wrote the code digested),
    ``"<digest>/py3.11"``."""
    return f"{model_digest()}/py{sys.version_info[0]}.{sys.version_info[1]}"
