"""The environment is read at the edges only. Settings come from pydantic-settings
classes (the one mechanism) and entry points, and are passed down as values; nothing below
reads ``os.environ``, so a variable cannot steer a layer behind its settings' back (as
``DSAGENT_STORAGE_*`` did inside ``dsagent.format``).

Every module of the platform's packages is parsed; only the modules named in
:data:`MAY_READ_ENVIRONMENT` may touch ``os.environ`` / ``os.getenv`` (or import them).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("dsagent", "scheduler_plugin", "scheduling", "gpu_topology", "dsplatform")

#: module -> why it may read the environment
MAY_READ_ENVIRONMENT: dict[str, str] = {
    "dsagent/cli": "the dsctl / dsagent command line: the CLI edge (flags with envvars, DSCTL_DEBUG, the pod's env)",
    "dsagent/envsettings.py": "the local agent's XDG defaults: its root and its socket record",
    "dsagent/nodeagent/nodeparts.py": "the cluster agent's settings, read where serve --kubernetes starts it",
    "dsagent/nodeagent/clusteragent.py": "the cluster agent's settings when it is built without them (tests)",
    "dsagent/webhook/server.py": "the webhook's entry point and settings",
    "dsagent/kube/apiclient.py": "the Kubernetes client's own variables (KUBERNETES_SERVICE_HOST, KUBECONFIG)",
    "dsagent/kube/testing.py": "test support: the environment of agent processes it starts",
    "dsagent/kube/envnames.py": "start-up's check for unknown DSAGENT_* variables",
    "scheduler_plugin/settings.py": "the extender's settings and its check for unknown DSEXT_* variables",
    "dsplatform/settings.py": "EnvSettings.read: the one place settings objects read the environment",
    "dsplatform/data.py": "StripedDataset.from_env: the reader's edge in a training pod (the webhook's env, RANK)",
    "gpu_topology/discovery/nccl_xml.py": "NCCL_TOPO_FILE is NCCL's own variable: the file NCCL in this process reads",
}

_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def _reads_environment(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _NAMES:
            if isinstance(node.value, ast.Name) and node.value.id in ("os", "posix", "nt"):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "posix", "nt"):
            if any(alias.name in _NAMES or alias.name == "*" for alias in node.names):
                lines.append(node.lineno)
    return lines


def _allowed(relative: str) -> bool:
    return any(relative == allowed or relative.startswith(allowed + "/") for allowed in MAY_READ_ENVIRONMENT)


def test_only_the_edges_read_the_environment() -> None:
    offenders = {}
    parsed = 0
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            lines = _reads_environment(ast.parse(path.read_text(encoding="utf-8"), relative))
            parsed += 1
            if lines and not _allowed(relative):
                offenders[relative] = lines
    assert parsed > 100, "the packages were not found: the check would prove nothing"
    assert offenders == {}, (
        f"modules below the edges read the environment: {offenders}; take the value from settings and pass it down"
    )


def test_the_allow_list_names_only_modules_that_exist_and_read_the_environment() -> None:
    for allowed in MAY_READ_ENVIRONMENT:
        path = REPO / allowed
        assert path.exists(), f"{allowed} no longer exists: drop it from the allow-list"
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        assert any(_reads_environment(ast.parse(f.read_text(encoding="utf-8"))) for f in files), (
            f"{allowed} reads no environment: drop it from the allow-list"
        )


def test_the_check_sees_each_way_of_reading_it() -> None:
    for source in ("os.environ.get('X')", "os.getenv('X')", "from os import environ", "from os import getenv as g"):
        assert _reads_environment(ast.parse(source)), source
    assert not _reads_environment(ast.parse("environ = {}; settings.environ; os.path.join('a')"))
