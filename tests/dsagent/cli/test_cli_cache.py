"""``dsctl cache / ls / evict / status / release / wait`` against a real agent process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dsagent.cli import main
from dsagent.cli.cache import datasets_from_env, default_task_id, parse_specs
from dsagent.errors import InvalidInput
from dsagent.format.bundles.bundle import pack
from tests.dsagent.cli.test_agent_process import make_dataset
from tools.support.harness import AgentProcess


@pytest.fixture
def local_agent(agent_factory: Any, tmp_path: Path) -> tuple[AgentProcess, Path]:
    nfs = tmp_path / "nfs"
    make_dataset(nfs / "mnist", 6, 2000)
    make_dataset(nfs / "cifar", 4, 2000, seed=3)
    return agent_factory(local_sources=(nfs,)), nfs


def dsctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cache_waits_until_ready_and_ls_lists_it(
    local_agent: tuple[AgentProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    agent, nfs = local_agent
    sock = str(agent.socket)
    code, out, err = dsctl(capsys, "cache", f"mnist={nfs / 'mnist'}", "--task", "job-1", "--socket", sock)
    assert code == 0, err
    assert "task job-1: ready" in out and "mnist" in out
    code, out, _ = dsctl(capsys, "ls", "--socket", sock)
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "DIGEST", "STATE", "SIZE", "FILES", "IN", "USE", "LAST", "USED"]
    assert row.split()[:6] == ["mnist", row.split()[1], "ready", "12", "kB", "6"] and " yes " in row
    code, out, _ = dsctl(capsys, "ls", "--socket", sock, "-o", "json")
    assert json.loads(out)["datasets"][0]["name"] == "mnist"
    code, out, _ = dsctl(capsys, "status", "job-1", "--socket", sock)
    assert "ready" in out
    code, out, _ = dsctl(capsys, "evict", "mnist", "--socket", sock)
    assert code == 4  # in use: a conflict
    code, out, _ = dsctl(capsys, "release", "job-1", "--socket", sock)
    assert code == 0 and "released task job-1" in out
    code, out, _ = dsctl(capsys, "evict", "--all-unused", "--dry-run", "--socket", sock)
    assert "would evict mnist@" in out
    code, out, _ = dsctl(capsys, "evict", "mnist", "--socket", sock)
    assert code == 0 and "evicted 1 dataset version(s), freed" in out
    # one unit per figure, said: ls's SIZE is the data, every other figure is cache space
    assert out.count("of cache space") == 2
    code, out, _ = dsctl(capsys, "ls", "--socket", sock)
    assert out.splitlines()[-2].startswith("cache space: used ")
    assert out.splitlines()[-1].startswith(f"agent at {sock}")  # which agent answered


def test_cache_no_wait_returns_at_once_and_status_fails_for_unknown_tasks(
    local_agent: tuple[AgentProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    agent, nfs = local_agent
    code, out, err = dsctl(
        capsys, "cache", f"cifar={nfs / 'cifar'}", "--no-wait", "--socket", str(agent.socket), "-o", "json"
    )
    assert code == 0, err
    assert json.loads(out)["state"] in ("pending", "ready")
    code, _, err = dsctl(capsys, "status", "nope", "--socket", str(agent.socket))
    assert code == 3 and err.startswith("dsctl: error: no task 'nope'")


def test_an_unreachable_agent_is_one_line_saying_how_to_start_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = dsctl(capsys, "ls", "--socket", str(tmp_path / "no.sock"))
    assert code == 8
    assert err.count("\n") == 1 and "dsagent serve" in err and str(tmp_path / "no.sock") in err


@pytest.mark.slow
def test_init_container_mode_reads_datasets_task_and_options_from_env_and_wait_execs(
    local_agent: tuple[AgentProcess, Path], tmp_path: Path
) -> None:
    agent, nfs = local_agent
    env = {
        **os.environ,
        "DSAGENT_SOCKET": str(agent.socket),
        "DSAGENT_TASK_ID": "3f1c-pod-uid",
        "DSAGENT_DATASETS": json.dumps([{"name": "mnist", "source": str(nfs / "mnist")}]),
    }
    init = subprocess.run(
        [sys.executable, "-m", "dsagent.cli", "cache", "--from-env", "--no-wait"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert init.returncode == 0, init.stderr
    marker = tmp_path / "trained"
    main_container = subprocess.run(
        [
            sys.executable,
            "-m",
            "dsagent.cli",
            "wait",
            "--from-env",
            "--",
            sys.executable,
            "-c",
            f"open({str(marker)!r}, 'w').write('ok')",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert main_container.returncode == 0, main_container.stderr
    assert marker.read_text() == "ok"  # the training command ran after the wait, in place of dsctl
    with agent.client() as client:
        assert client.get_task("3f1c-pod-uid")["state"] == "ready"


def test_storage_options_come_from_the_environment_per_dataset() -> None:
    env = {
        "DSAGENT_DATASETS": '[{"name": "imagenet", "source": "s3://b/imagenet"}, {"name": "coco-2017", "source": "s3://b/coco"}]',
        "DSAGENT_STORAGE_OPTIONS": '{"anon": false}',
        "DSAGENT_STORAGE_OPTIONS_COCO_2017": '{"key": "k", "secret": "s"}',
        "DSAGENT_BUNDLES": "s3://b/packed",
    }
    first, second = datasets_from_env(env)
    assert first == {
        "name": "imagenet",
        "source": "s3://b/imagenet",
        "bundles": "s3://b/packed",
        "allow_per_file": True,  # the cluster path keeps the per-file fallback (dsagent.kube.podenv)
        "storage_options": {"anon": False},
    }
    assert second["storage_options"] == {"anon": False, "key": "k", "secret": "s"}


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"DSAGENT_DATASETS": "not json"},
        {"DSAGENT_DATASETS": '{"name": "x"}'},
        {"DSAGENT_DATASETS": '[{"name": "x", "source": "y"}]', "DSAGENT_STORAGE_OPTIONS": "[1]"},
    ],
    ids=["unset", "not-json", "not-a-list", "options-not-an-object"],
)
def test_bad_init_container_environments_are_invalid_input(env: dict[str, str]) -> None:
    with pytest.raises(InvalidInput):
        datasets_from_env(env)


def test_a_secret_in_bad_storage_options_json_is_never_echoed() -> None:
    with pytest.raises(InvalidInput) as excinfo:
        datasets_from_env(
            {"DSAGENT_DATASETS": '[{"name": "x", "source": "y"}]', "DSAGENT_STORAGE_OPTIONS": '{"secret": "hunter2"'}
        )
    assert "hunter2" not in str(excinfo.value)


def test_name_source_arguments_and_the_default_task_id_are_stable() -> None:
    specs = parse_specs(["a=s3://x/a", "b=/data/b"], "s3://x/packed")
    assert specs[1] == {"name": "b", "source": "/data/b", "bundles": "s3://x/packed"}
    assert default_task_id(specs) == default_task_id(list(reversed(specs)))
    with pytest.raises(InvalidInput):
        parse_specs(["just-a-name"], None)


def test_a_dataset_missing_from_the_bundles_store_fails_unless_allow_per_file(
    local_agent: tuple[AgentProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A name the --bundles store lacks is an error, not a silent, slow per-file success."""
    agent, nfs = local_agent
    store = nfs / "store"
    pack(nfs / "cifar", str(store), name="cifar")  # a real store, without mnist
    sock = str(agent.socket)
    code, out, err = dsctl(capsys, "cache", f"mnist={nfs / 'mnist'}", "--bundles", str(store), "--socket", sock)
    assert code == 3 and out == "" and err.count("\n") == 1, (code, out, err)
    assert f"no dataset 'mnist' in bundle store {store}" in err and "--allow-per-file" in err
    code, out, _ = dsctl(capsys, "ls", "--socket", sock, "-o", "json")
    assert not [d for d in json.loads(out)["datasets"] if d["name"] == "mnist"]  # nothing reported ready

    code, out, err = dsctl(
        capsys, "cache", f"mnist={nfs / 'mnist'}", "--bundles", str(store), "--allow-per-file", "--socket", sock
    )
    assert code == 0 and "ready" in out, err
    code, out, err = dsctl(capsys, "cache", f"cifar={nfs / 'cifar'}", "--bundles", str(store), "--socket", sock)
    assert code == 0 and "ready" in out, err  # a packed dataset needs no flag

    code, _, err = dsctl(capsys, "cache", f"mnist={nfs / 'mnist'}", "--allow-per-file", "--socket", sock)
    assert code == 2 and "--allow-per-file applies only with --bundles" in err
    code, _, err = dsctl(capsys, "cache", "--from-env", "--bundles", str(store), "--socket", sock)
    assert code == 2 and "not both" in err


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("250ms", 0.25), ("5m", 300.0), ("90", 90.0), ("1.5", 1.5)]
)
def test_timeouts_take_the_platform_duration_syntax_and_plain_seconds(text: str, seconds: float) -> None:
    from dsagent.cli.options import DURATION

    assert DURATION.convert(text, None, None) == seconds


@pytest.mark.parametrize("command", [["cache", "x=/nope"], ["wait", "--from-env"]])
@pytest.mark.parametrize("bad", ["30x", "soon", "-5s", "inf"])
def test_a_bad_timeout_is_a_usage_error_naming_the_syntax(
    command: list[str], bad: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [*command, "--timeout", bad, "--socket", str(tmp_path / "none.sock")]
    code, out, err = dsctl(capsys, *(argv + (["--", "true"] if command[0] == "wait" else [])))
    assert code == 2 and out == "" and err.count("\n") == 1, (code, err)
    assert f"Invalid value for '--timeout': {bad!r} is not a duration" in err and "30s" in err


def test_a_timeout_in_the_duration_syntax_bounds_the_wait(
    local_agent: tuple[AgentProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    agent, nfs = local_agent
    code, out, err = dsctl(capsys, "cache", f"mnist={nfs / 'mnist'}", "--timeout", "2m", "--socket", str(agent.socket))
    assert code == 0 and "ready" in out, err


@pytest.mark.parametrize(
    "args",
    [
        ("cache", "mnist=/data/mnist", "--task", "team/job-1"),
        ("status", "team/job-1"),
        ("release", "team/job-1"),
        ("cache", "mnist=/data/mnist", "--task", "job 1"),
    ],
)
def test_a_task_id_the_agent_would_refuse_is_refused_before_any_request(
    args: tuple[str, ...], local_agent: tuple[AgentProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # a '/' reached the agent percent-decoded, as another route: exit 3 with a bare "Not Found"
    agent, _ = local_agent
    code, _, err = dsctl(capsys, *args, "--socket", str(agent.socket))
    assert code == 2 and "invalid task id" in err and "Not Found" not in err and err.count("\n") == 1


def test_tasks_lists_the_id_dsctl_cache_chose_so_it_can_be_released(
    local_agent: tuple[AgentProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``dsctl cache`` without ``--task`` picks an id; ``dsctl tasks`` shows it to the
    operator who later wants to release the data."""
    agent, nfs = local_agent
    sock = str(agent.socket)
    assert dsctl(capsys, "cache", f"mnist={nfs / 'mnist'}", "--socket", sock)[0] == 0
    assert dsctl(capsys, "cache", f"cifar={nfs / 'cifar'}", "--task", "job-2", "--socket", sock)[0] == 0
    code, out, err = dsctl(capsys, "tasks", "--socket", sock)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["TASK", "STATE", "DATASETS", "LEASE", "UNTIL"]
    listed = {row.split()[0]: row.split()[1:3] for row in rows}
    chosen = default_task_id(parse_specs([f"mnist={nfs / 'mnist'}"], None))
    assert listed == {chosen: ["ready", "mnist"], "job-2": ["ready", "cifar"]}
    assert dsctl(capsys, "release", chosen, "--socket", sock)[0] == 0
    code, out, _ = dsctl(capsys, "tasks", "--socket", sock, "-o", "json")
    assert [t["task"] for t in json.loads(out)["tasks"]] == ["job-2"]


class _Agent:
    """A client whose task is pending ``pending`` answers, then ready; ``holds``: whether it
    long-polls (else it answers at once, as an agent that predates ``wait``)."""

    def __init__(self, pending: int, holds: bool) -> None:
        self.pending, self.holds, self.waits = pending, holds, []  # type: ignore[var-annotated]

    def get_task(self, task_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        self.waits.append(wait)
        if self.pending:
            self.pending -= 1
            if self.holds:
                time.sleep(wait)
            return {"task": task_id, "state": "pending", "datasets": []}
        return {"task": task_id, "state": "ready", "datasets": []}


@pytest.mark.parametrize("holds", [True, False], ids=["long-poll", "answers-at-once"])
def test_waiting_long_polls_and_never_busy_loops(monkeypatch: pytest.MonkeyPatch, holds: bool) -> None:
    from dsagent.cli import cache as cache_cli

    monkeypatch.setattr(cache_cli, "POLL_SECONDS", 0.05)
    agent = _Agent(pending=3, holds=holds)
    started = time.monotonic()
    record = cache_cli.wait_until_done(agent, "t", timeout=None, show=lambda r: None)  # type: ignore[arg-type]
    assert record["state"] == "ready"
    assert agent.waits == [0.05] * 4  # every look asks the agent to hold it
    assert time.monotonic() - started >= 3 * 0.05  # held by the agent, or slept by dsctl: never a busy loop
