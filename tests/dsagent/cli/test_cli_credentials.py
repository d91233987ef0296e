"""Refused credentials are exit 11 and a denied permission exit 12, whatever the verb, against
a real S3 server that checks signatures (moto in server mode with IAM enforced).

A wrong secret key for a valid key id is the case that used to read as "permission denied":
S3 answers a HEAD request with a bodiless 403, so the first request of ``digest`` or ``pack``
(does the source exist?) cannot tell refused credentials from a missing permission.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsagent.cli import main
from tests.conftest import isolate_aws
from tools.support.harness import wait_ready
from tools.support.s3server import S3Server, strict_s3_server


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, dict[str, str]]]:
    server, user = strict_s3_server(tmp_path_factory.mktemp("strict-s3") / "moto.log")
    yield server, user
    server.close()


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def verbs(endpoint: str, key: str, secret: str, tmp: Path) -> dict[str, list[str]]:
    options = {"endpoint_url": endpoint, "key": key, "secret": secret}
    source = [f"--source-option={k}={v}" for k, v in options.items()]
    store = [f"--store-option={k}={v}" for k, v in options.items()]
    local = tmp / "local"
    local.mkdir(parents=True, exist_ok=True)
    (local / "a.txt").write_bytes(b"a")
    return {
        "digest": ["digest", "s3://datasets/src", *source],
        "pack from the store": ["pack", "s3://datasets/src", "--to", str(tmp / "store"), "--name", "x", *source],
        "pack into the store": ["pack", str(local), "--to", "s3://datasets/store", "--name", "x", *store],
        "unpack": ["unpack", "s3://datasets/store", str(tmp / "out"), "--name", "x", *store],
    }


@pytest.mark.parametrize("verb", ["digest", "pack from the store", "pack into the store", "unpack"])
def test_a_wrong_secret_is_refused_credentials_and_no_policy_is_a_denied_permission(
    verb: str,
    strict_s3: tuple[S3Server, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    server, user = strict_s3
    isolate_aws(monkeypatch)
    code, err = run(verbs(server.endpoint, user["key"], "wrong-secret", tmp_path)[verb], capsys)
    assert (code, err.count("\n")) == (11, 1), err
    assert "credentials missing or refused" in err and "Traceback" not in err
    code, err = run(verbs(server.endpoint, user["key"], user["secret"], tmp_path / "ok")[verb], capsys)
    assert (code, err.count("\n")) == (12, 1), err
    assert "permission denied" in err


def test_the_agent_reports_a_wrong_secret_as_refused_credentials(
    strict_s3: tuple[S3Server, dict[str, str]], agent_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, user = strict_s3
    isolate_aws(monkeypatch)
    agent = agent_factory()
    options = {"endpoint_url": server.endpoint, "key": user["key"], "secret": "wrong-secret"}
    with agent.client() as client:
        client.submit_task("pod-1", [{"name": "x", "source": "s3://datasets/x", "storageOptions": options}], wait=30)
        record = wait_ready(client, "pod-1")
    assert record["state"] == "failed" and record["datasets"][0]["error"]["code"] == "credentials", record
