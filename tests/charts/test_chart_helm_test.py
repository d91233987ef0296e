"""``helm test``: the chart's test hook pod and the script it runs.

The script is taken from the rendered Pod (its ``python -c`` argument and environment, with
the cluster's names swapped for 127.0.0.1) and run against real HTTP and HTTPS servers:
every answer 200 passes, one agent's failing /readyz or an unreachable extender fails,
naming the endpoint.
"""

from __future__ import annotations

import datetime as dt
import http.server
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.charts.test_chart import DIGEST, find, kinds, render
from tests.podsecurity import violations
from tools.support.harness import held_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render({})


def test_the_test_hooks_render_a_restricted_pod_and_a_headless_service_of_every_agent(
    default: list[dict[str, Any]],
) -> None:
    pod = find(default, "Pod", "-test-health")
    service = find(default, "Service", "-test-agents")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert service["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert int(service["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0  # before the pod
    agent_labels = find(default, "DaemonSet", "-agent")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= agent_labels.items()
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert violations({"metadata": pod["metadata"], "spec": pod["spec"]}) == []
    [container] = pod["spec"]["containers"]
    assert container["resources"]["requests"] and pod["spec"]["restartPolicy"] == "Never"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["CHECK_AGENTS"] == f"{service['metadata']['name']}.dsplatform.svc"
    extender = find(default, "Service", "-extender")
    assert env["CHECK_EXTENDER"] == f"http://{extender['metadata']['name']}.dsplatform.svc:8888"
    # the agents' NetworkPolicy lets exactly this pod in, on the agents' port
    policy = find(default, "NetworkPolicy")
    [rule] = [
        r
        for r in policy["spec"]["ingress"]
        if r["from"][0].get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "test"
    ]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert rule["ports"] == [{"port": 7420, "protocol": "TCP"}]


def test_the_test_pod_takes_the_image_digest_and_can_be_switched_off() -> None:
    pinned = render({"image": {"digest": DIGEST}})
    assert find(pinned, "Pod", "-test-health")["spec"]["containers"][0]["image"].endswith("@" + DIGEST)
    off = render({"tests": {"enabled": False}})
    assert "Pod" not in kinds(off)
    assert not [d for d in off if d["kind"] == "Service" and d["metadata"]["name"].endswith("-test-agents")]
    assert not [r for r in find(off, "NetworkPolicy")["spec"]["ingress"] if "test" in str(r)]


# -- the script, against real servers


class Health(http.server.BaseHTTPRequestHandler):
    statuses: dict[str, int] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status = self.statuses.get(self.path, 200)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}' if status == 200 else b'{"status":"failing"}')

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def server(statuses: dict[str, int] | None = None, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    handler = type("H", (Health,), {"statuses": statuses or {}})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def self_signed(tmp: Path) -> ssl.SSLContext:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dsp-dsplatform-webhook.dsplatform.svc")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "tls.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    return context


def run_script(default: list[dict[str, Any]], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    [container] = find(default, "Pod", "-test-health")["spec"]["containers"]
    assert container["command"] == ["python", "-c"]
    rendered_env = {e["name"] for e in container["env"]}
    assert set(env) - {"CHECK_DNS_WAIT"} <= rendered_env  # the variables the chart sets
    return subprocess.run(
        [sys.executable, "-c", container["args"][0]],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_script_passes_when_every_endpoint_answers_200(default: list[dict[str, Any]], tmp_path: Path) -> None:
    with server() as agent, server() as extender, server(tls=self_signed(tmp_path)) as webhook:
        done = run_script(
            default,
            {
                "CHECK_AGENTS": "127.0.0.1",
                "CHECK_AGENT_PORT": str(agent),
                "CHECK_EXTENDER": f"http://127.0.0.1:{extender}",
                "CHECK_WEBHOOK": f"https://127.0.0.1:{webhook}",
            },
        )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["agent"] * 2 + ["extender"] * 2 + ["webhook"] * 2
    assert all(line.startswith("ok ") and line.endswith(" 200") for line in lines)


def test_the_script_fails_naming_each_failing_endpoint(default: list[dict[str, Any]]) -> None:
    # held, never listened on: nothing answers there, and no other server is given the port
    with held_port() as closed, server({"/readyz": 503}) as agent:
        done = run_script(
            default,
            {
                "CHECK_AGENTS": "127.0.0.1",
                "CHECK_AGENT_PORT": str(agent),
                "CHECK_EXTENDER": f"http://127.0.0.1:{closed}",
            },
        )
    assert done.returncode == 1
    assert f"FAILED agent http://127.0.0.1:{agent}/readyz" in done.stderr
    assert f"FAILED extender http://127.0.0.1:{closed}/healthz" in done.stderr
    assert f"ok agent http://127.0.0.1:{agent}/healthz" in done.stdout


def test_the_script_fails_when_no_agent_can_be_found(default: list[dict[str, Any]]) -> None:
    done = run_script(
        default, {"CHECK_AGENTS": "no-such-agent.invalid", "CHECK_AGENT_PORT": "7420", "CHECK_DNS_WAIT": "0"}
    )
    assert done.returncode == 1 and "FAILED no agent behind no-such-agent.invalid" in done.stderr
