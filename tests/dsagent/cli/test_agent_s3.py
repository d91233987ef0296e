"""The agent caching from S3 (a real S3 server on loopback), with and without bundles,
credentials taken from its own (pod) environment; storage failures come back as codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsagent.cli import main
from dsagent.format.bundles.bundle import pack, verify_tree
from tests.conftest import isolate_aws
from tests.dsagent.conftest import AWKWARD_FILES
from tools.support.harness import wait_ready
from tools.support.s3server import S3Server


def upload(s3: S3Server, local: Path, url: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3.endpoint, skip_instance_cache=True)
    fs.put(str(local) + "/", url.split("://", 1)[1], recursive=True)


def test_the_agent_caches_from_s3_with_and_without_bundles(
    s3: S3Server, agent_factory: Any, awkward_dataset: Path, tmp_path: Path
) -> None:
    s3.create_bucket("datasets")
    upload(s3, awkward_dataset, "s3://datasets/raw/awk")
    options = {"endpoint_url": s3.endpoint}
    manifest = pack(awkward_dataset, "s3://datasets/store", name="awk", max_files=3, store_options=options)
    agent = agent_factory()  # inherits AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, as a pod from a Secret
    with agent.client() as client:
        bundled = client.submit_task(
            "pod-b",
            [
                {
                    "name": "awk",
                    "source": "s3://datasets/raw/awk",
                    "bundles": "s3://datasets/store",
                    "storageOptions": options,
                }
            ],
            wait=60,
        )
        raw = client.submit_task(
            "pod-r", [{"name": "raw", "source": "s3://datasets/raw/awk", "storageOptions": options}], wait=60
        )
    assert bundled["state"] == "ready", bundled
    assert raw["state"] == "ready", raw
    verify_tree(Path(bundled["datasets"][0]["path"]), manifest)
    files = sorted(
        p.relative_to(raw["datasets"][0]["path"]).as_posix()
        for p in Path(raw["datasets"][0]["path"]).rglob("*")
        if p.is_file()
    )
    assert files == sorted(AWKWARD_FILES)  # the digest differs: object stores hold no empty directories
    assert all((Path(raw["datasets"][0]["path"]) / name).read_bytes() == data for name, data in AWKWARD_FILES.items())


def test_agent_storage_failures_are_codes_and_dsctl_cache_exits_with_them(
    s3: S3Server, agent_factory: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s3.create_bucket("datasets")
    isolate_aws(monkeypatch)  # this agent's pod has no credentials
    agent = agent_factory()
    with agent.client() as client:
        record = client.submit_task(
            "pod-1",
            [{"name": "x", "source": "s3://datasets/x", "storageOptions": {"endpoint_url": s3.endpoint}}],
            wait=30,
        )
        record = wait_ready(client, "pod-1")
    error = record["datasets"][0]["error"]
    assert record["state"] == "failed" and error["code"] == "credentials" and "AWS_ACCESS_KEY_ID" in error["hint"]

    try:
        main(
            [
                "cache",
                "y=s3://datasets/y",
                "--source-option",
                f"endpoint_url={s3.endpoint}",
                "--socket",
                str(agent.socket),
                "-o",
                "json",
            ]
        )
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 11 and err.count("\n") == 1 and "credentials missing or refused" in err


def test_dsctl_cache_calls_a_near_url_malformed(agent_factory: Any, capsys: pytest.CaptureFixture[str]) -> None:
    agent = agent_factory()
    try:
        main(["cache", "x=s3:/x", "--socket", str(agent.socket), "--no-wait"])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and "malformed URL 's3:/x'" in err and "outside the directories" not in err


def test_a_store_without_the_dataset_is_bundle_missing_unless_the_request_allows_per_file(
    s3: S3Server, agent_factory: Any, awkward_dataset: Path, tmp_path: Path
) -> None:
    """A dataset missing from the ``bundles`` store is not copied file by file and
    reported ready: it fails (bundle_missing, 404's family) with nothing ready, and
    only ``allowPerFile`` takes the per-file path; an unreachable store keeps its own code."""
    from tools.support.harness import held_port

    s3.create_bucket("datasets")
    upload(s3, awkward_dataset, "s3://datasets/raw/awk")
    options = {"endpoint_url": s3.endpoint}
    pack(awkward_dataset, "s3://datasets/store", name="other", max_files=3, store_options=options)  # a real store
    request = {"name": "awk", "source": "s3://datasets/raw/awk", "bundles": "s3://datasets/store"}
    agent = agent_factory()
    with agent.client() as client:
        client.submit_task("pod-m", [{**request, "storageOptions": options}], wait=30)
        record = wait_ready(client, "pod-m")
        error = record["datasets"][0]["error"]
        assert record["state"] == "failed" and record["datasets"][0]["path"] is None, record
        assert error["code"] == "bundle_missing", error
        assert error["message"] == "no dataset 'awk' in bundle store s3://datasets/store"
        assert "s3://datasets/store" in error["hint"] and "--allow-per-file" in error["hint"]
        assert "\n" not in error["hint"]
        assert not [d for d in client.datasets()["datasets"] if d["name"] == "awk"]  # nothing cached, nothing ready

        # the same task asked again with the opt-in: the slow per-file path
        client.submit_task("pod-m", [{**request, "storageOptions": options, "allowPerFile": True}], wait=60)
        record = wait_ready(client, "pod-m")
        assert record["state"] == "ready", record
        copied = Path(record["datasets"][0]["path"])
        assert all((copied / name).read_bytes() == data for name, data in AWKWARD_FILES.items())

        # a store that cannot be reached is not "missing": it keeps source_unavailable
        with held_port() as port:  # held, never listened on: nothing answers there
            down = {"endpoint_url": f"http://127.0.0.1:{port}"}
            client.submit_task("pod-d", [{**request, "name": "down", "storageOptions": down}], wait=30)
            record = wait_ready(client, "pod-d")
        assert record["datasets"][0]["error"]["code"] == "source_unavailable", record
