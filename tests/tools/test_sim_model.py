"""Which simulator a result came from (tools/sim/model.py): the digest follows the code the
simulation runs, through its imports, and no edit that cannot change a figure."""

from __future__ import annotations

from pathlib import Path

from tools.sim import model


def _tree(root: Path, policy: str = '"""The rule."""\nRATIO = 1.2  # the headroom\n') -> None:
    files = {
        "tools/sim/__init__.py": "",
        "tools/sim/run.py": "from tools.sim.engine import run\nimport json\n",
        "tools/sim/engine.py": "from . import rates\nfrom dsagent.policy import eviction\n\ndef run():\n    return 1\n",
        "tools/sim/rates.py": "GB = 1e9\n",
        "tools/sim/results.py": "LAYOUT = 1\n",
        "dsagent/__init__.py": "",
        "dsagent/policy/__init__.py": "",
        "dsagent/policy/eviction.py": policy,
        "dsagent/policy/unused.py": "X = 1\n",
        "tools/sim/data/runtimes.csv": "1\n2\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_digest_covers_the_modules_the_simulation_imports_and_no_others(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert sorted(model.modules(root=tmp_path)) == [
        "dsagent", "dsagent.policy", "dsagent.policy.eviction", "tools.sim", "tools.sim.engine", "tools.sim.rates",
        "tools.sim.run",
    ]  # fmt: skip
    before = model.model_digest(root=tmp_path)
    (tmp_path / "tools/sim/results.py").write_text("LAYOUT = 2\n")
    (tmp_path / "dsagent/policy/unused.py").write_text("X = 2\n")
    assert model.model_digest(root=tmp_path) == before, "modules the simulation does not import"


def test_a_leaf_counts_its_own_code_not_what_it_imports(tmp_path: Path) -> None:
    """A module read for values in its own text (the agent's settings, for two defaults):
    a change to it counts, one to a module only it imports does not."""
    _tree(tmp_path)
    (tmp_path / "tools/sim/rates.py").write_text("from dsagent.settings import WORKERS\nGB = 1e9\n")
    (tmp_path / "dsagent/settings.py").write_text("from dsagent import storage\nWORKERS = 8\n")
    (tmp_path / "dsagent/storage.py").write_text("TIMEOUT = 10\n")
    leaves = frozenset({"dsagent.settings"})
    assert "dsagent.storage" in model.modules(root=tmp_path, leaves=frozenset())
    assert "dsagent.storage" not in model.modules(root=tmp_path, leaves=leaves)
    before = model.model_digest(root=tmp_path, leaves=leaves)
    (tmp_path / "dsagent/storage.py").write_text("TIMEOUT = 20\n")
    assert model.model_digest(root=tmp_path, leaves=leaves) == before
    (tmp_path / "dsagent/settings.py").write_text("from dsagent import storage\nWORKERS = 16\n")
    assert model.model_digest(root=tmp_path, leaves=leaves) != before


def test_the_simulators_digest_leaves_out_the_agents_storage_and_egress_rules() -> None:
    names = model.modules()
    assert "dsagent.cache.settings" in names and "dsagent.policy.holding" in names
    assert not {"dsagent.format.storageconfig", "dsagent.format.egress", "dsagent.format.sources"} & names.keys()


def test_comments_docstrings_and_layout_leave_the_digest_a_statement_changes_it(tmp_path: Path) -> None:
    _tree(tmp_path)
    before = model.model_digest(root=tmp_path)
    _tree(tmp_path, '"""The rule, said again."""\n\n# why\nRATIO = (1.2)\n')
    assert model.model_digest(root=tmp_path) == before
    _tree(tmp_path, '"""The rule."""\nRATIO = 1.25  # the headroom\n')
    assert model.model_digest(root=tmp_path) != before


def test_the_data_the_simulation_draws_from_counts(tmp_path: Path) -> None:
    _tree(tmp_path)
    before = model.model_digest(root=tmp_path)
    (tmp_path / "tools/sim/data/runtimes.csv").write_text("1\n3\n")
    assert model.model_digest(root=tmp_path) != before


def test_the_stamp_names_the_interpreter() -> None:
    digest, _, interpreter = model.model_stamp().partition("/")
    assert len(digest) == 16 and interpreter.startswith("py3.")
