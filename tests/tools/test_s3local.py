"""``make s3-local``'s server (tools/s3local/serve.py): a real S3 endpoint with the bucket made,
the environment it prints is enough for fsspec, and SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from contextlib import ExitStack

import pytest

from tests.conftest import REPO_ROOT
from tools.support.harness import held_port

pytestmark = pytest.mark.slow  # each test starts the server as a process


def test_the_local_s3_server_serves_its_bucket_to_the_environment_it_prints() -> None:
    import s3fs

    hold = ExitStack()
    port = hold.enter_context(held_port())  # nobody else's until the server listens on it
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "tools/s3local/serve.py"), "--port", str(port), "--bucket", "trial"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        hold.close()  # it printed its endpoint: it listens
        assert f"S3 server on http://127.0.0.1:{port}" in lines[0] and "s3://trial" in lines[0], lines
        exports = dict(part.split("=", 1) for part in lines[2].split()[1:])
        assert exports["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        fs = s3fs.S3FileSystem(
            key=exports["AWS_ACCESS_KEY_ID"],
            secret=exports["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=exports["AWS_ENDPOINT_URL"],
            skip_instance_cache=True,
        )
        fs.pipe("trial/store/hello.txt", b"round trip")
        assert fs.cat("trial/store/hello.txt") == b"round trip"
    finally:
        hold.close()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0


def test_a_busy_port_is_one_line_and_exit_2() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "tools/s3local/serve.py"), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )
    assert result.returncode == 2
    assert result.stderr.startswith(f"s3-local: error: cannot listen on 127.0.0.1:{port}"), result.stderr
    assert "Traceback" not in result.stderr
