"""A real S3 server on loopback for the tests: moto in server mode, in its own process.

Who uses it: the S3 tests of the bundle CLI, the storage error translation and the agent, and
the per-file fault sweep (``tools/faults/sweep.py --per-file``, through :mod:`tools.support.faults`).
A separate process (``python -m moto.server``) rather than moto's in-process mocks: the
code under test speaks the real wire protocol through s3fs/aiobotocore, and a second
server can enforce authentication (``INITIAL_NO_AUTH_ACTION_COUNT``), which moto reads
once per process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tools.support.harness import held_port

KEY, SECRET = "testing-key", "testing-secret"


class S3Server:
    """``moto.server`` on 127.0.0.1; ``auth_actions`` unauthenticated calls, then IAM is enforced."""

    def __init__(self, log: Path, *, auth_actions: int | None = None) -> None:
        with held_port() as port:  # nobody else's until the server listens on it
            self.port = port
            self._start(log, auth_actions)

    def _start(self, log: Path, auth_actions: int | None) -> None:
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        if auth_actions is not None:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(auth_actions)
        self._log = open(log, "ab")  # noqa: SIM115 - the server's output, closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto.server exited: {log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("moto.server did not start")

    def env(self) -> dict[str, str]:
        """The pod-style environment that makes s3fs find this server's credentials."""
        return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}

    def options(self, **extra: Any) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, **extra}

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        ).create_bucket(Bucket=name)

    def buckets(self) -> list[str]:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )
        return sorted(b["Name"] for b in client.list_buckets()["Buckets"])

    def reset(self) -> None:
        httpx.post(f"{self.endpoint}/moto-api/reset", timeout=10)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def strict_s3_server(log: Path) -> tuple[S3Server, dict[str, str]]:
    """An S3 server enforcing IAM after three set-up calls: a bucket ``datasets``, and a
    user without policies whose keys are valid but may do nothing (``key``, ``secret``)."""
    import boto3

    server = S3Server(log, auth_actions=3)
    try:
        server.create_bucket("datasets")
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint,
            aws_access_key_id="x",
            aws_secret_access_key="y",
            region_name="us-east-1",
        )
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
    except BaseException:
        server.close()
        raise
    return server, {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
