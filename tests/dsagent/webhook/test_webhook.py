"""The admission webhook over HTTPS, with the certificate the chart generates."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from dsagent.kube.datasets import DatasetClient
from dsagent.webhook.mutation import INIT_CONTAINER, Injection
from dsagent.webhook.server import decide, response
from tools.support.fake_apiserver import FakeApiServer, json_patch, make_dataset
from tools.support.harness import held_port

pytestmark = pytest.mark.slow

REVIEW = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "admission" / "admission-review-pytorchjob.json").read_text()
)
INJECTION = Injection(image="img:1", scheduler_name="dsplatform-scheduler")


def webhook_environment() -> dict[str, str]:
    """The suite's environment less the agents' settings it sets (tests/conftest.py), which
    the webhook, reading only its own settings, would refuse as unknown."""
    return {k: v for k, v in os.environ.items() if k not in ("DSAGENT_PROTOCOLS", "DSAGENT_EGRESS_ALLOW")}


def review(annotation: str | None = "imagenet,coco", **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(REVIEW)
    annotations = body["request"]["object"]["metadata"]["annotations"]
    if annotation is None:
        annotations.pop("dsagent.io/datasets")
    else:
        annotations["dsagent.io/datasets"] = annotation
    body["request"]["object"]["spec"].update(spec)
    return body


def seed_datasets(apiserver: FakeApiServer) -> None:
    imagenet = make_dataset("imagenet", namespace="ml-team", source="s3://ml/imagenet", bundles="s3://ml/bundles")
    imagenet["spec"]["storageSecretRef"] = {"name": "s3-creds"}
    apiserver.create(imagenet)
    apiserver.create(make_dataset("coco", namespace="ml-team", source="/mnt/nfs/coco"))


def patched(answer: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    result: dict[str, Any] = json_patch(pod, ops)
    return result


# -- the decision, with Datasets read over HTTP from the fake API server


def test_names_are_resolved_through_the_pods_namespace(apiserver: FakeApiServer, api_client: Any) -> None:
    seed_datasets(apiserver)
    pod = review()["request"]["object"]
    decision = decide(pod, "ml-team", INJECTION, DatasetClient(api_client).get)
    assert decision.warnings == ()
    init = json_patch(pod, decision.patch)["spec"]["initContainers"][0]
    env = {e["name"]: e for e in init["env"]}
    assert json.loads(env["DSAGENT_DATASETS"]["value"])[0]["source"] == "s3://ml/imagenet"
    assert env["DSAGENT_STORAGE_OPTIONS_IMAGENET"]["valueFrom"]["secretKeyRef"]["name"] == "s3-creds"
    gets = [r.path for r in apiserver.requests_matching("GET")]
    assert "/apis/dsagent.io/v1alpha1/namespaces/ml-team/datasets/imagenet" in gets


def test_a_missing_dataset_admits_the_pod_unchanged_with_a_warning(apiserver: FakeApiServer, api_client: Any) -> None:
    pod = review("nonexistent")["request"]["object"]
    decision = decide(pod, "ml-team", INJECTION, DatasetClient(api_client).get)
    assert decision.patch == []
    assert "not found" in decision.warnings[0] and "runs without the cache" in decision.warnings[0]


def test_an_unreachable_api_server_admits_the_pod_unchanged(apiserver: FakeApiServer, api_client: Any) -> None:
    apiserver.stop()
    decision = decide(
        review("imagenet")["request"]["object"], "ml-team", INJECTION, DatasetClient(api_client, request_timeout=1).get
    )
    assert decision.patch == [] and "unreachable" in decision.warnings[0]


def test_a_bad_annotation_admits_the_pod_unchanged_with_the_reason() -> None:
    decision = decide(review('[{"name": 1}]')["request"]["object"], "ml-team", INJECTION, _no_lookup)
    assert decision.patch == [] and "invalid dataset name" in decision.warnings[0]


def test_a_bug_never_blocks_the_pod() -> None:
    def broken(namespace: str, name: str) -> Any:
        raise ZeroDivisionError

    decision = decide(review("imagenet")["request"]["object"], "ml-team", INJECTION, broken)
    assert decision.patch == [] and "internal error" in decision.warnings[0]


def test_the_answer_is_an_admission_review_v1_that_allows() -> None:
    pod = review('[{"name": "coco", "source": "/nfs/coco"}]')["request"]["object"]
    answer = response("uid-1", decide(pod, "ml-team", INJECTION, _no_lookup))
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "uid-1" and answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    assert patched(answer, pod)["spec"]["initContainers"][0]["name"] == INIT_CONTAINER


def _no_lookup(namespace: str, name: str) -> Any:
    raise AssertionError("no lookup expected")


# -- the real server process, over TLS with the chart's certificate


@pytest.fixture(scope="module")
def module_apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        seed_datasets(server)
        yield server


@pytest.fixture(scope="module")
def webhook_server(
    chart_tls: dict[str, Any], module_apiserver: FakeApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with webhook_process(chart_tls, module_apiserver, tmp_path_factory.mktemp("kubeconfig")) as server:
        yield server


@contextmanager
def webhook_process(
    chart_tls: dict[str, Any], apiserver: FakeApiServer, folder: Path, extra_env: dict[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """``python -m dsagent.webhook`` with the chart's TLS, reading Datasets
    from ``apiserver``; yields ``{"port", "context", "host", "process"}``."""
    kubeconfig = apiserver.write_kubeconfig(folder / "config")
    hold = ExitStack()
    port = hold.enter_context(held_port())  # nobody else's until the webhook listens on it
    files = chart_tls["files"]
    env = {
        **webhook_environment(),
        "DSAGENT_WEBHOOK_LISTEN": f"127.0.0.1:{port}",
        "DSAGENT_WEBHOOK_CERT_FILE": str(files["tls.crt"]),
        "DSAGENT_WEBHOOK_KEY_FILE": str(files["tls.key"]),
        "DSAGENT_WEBHOOK_INJECTION_FILE": str(files["injection"]),
        "DSAGENT_WEBHOOK_KUBECONFIG": str(kubeconfig),
        **(extra_env or {}),
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "dsagent.webhook"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        context = ssl.create_default_context(cadata=chart_tls["ca"])
        server = {"port": port, "context": context, "host": chart_tls["host"], "process": process}
        deadline = time.monotonic() + 30
        while True:
            try:
                if call(server, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"webhook did not start: {process.stdout.read() if process.stdout else ''!r}"
                    ) from None
                time.sleep(0.1)
        hold.close()
        yield server
    finally:
        hold.close()
        process.terminate()
        process.wait(10)
        if process.stdout:
            process.stdout.close()


class _Connection(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 that verifies the certificate for the Service's DNS name."""

    def __init__(self, server: dict[str, Any]) -> None:
        super().__init__("127.0.0.1", server["port"], context=server["context"], timeout=10)
        self._sni = server["host"]

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._sni)  # type: ignore[attr-defined]


def call(server: dict[str, Any], method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = _Connection(server)
    try:
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        conn.close()


def test_the_api_server_can_call_the_webhook_with_the_charts_ca_bundle(webhook_server: dict[str, Any]) -> None:
    status, answer = call(webhook_server, "POST", "/mutate", review())
    assert status == 200
    assert answer["response"]["uid"] == REVIEW["request"]["uid"] and answer["response"]["allowed"] is True
    pod = patched(answer, review()["request"]["object"])
    # the chart's default injection wires the agent's CSI volume, no hostPath
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "dsagent-datasets"]
    assert volume["csi"]["driver"] == "datasets.dsagent.io"
    assert not any("hostPath" in v for v in pod["spec"]["volumes"])
    assert pod["spec"]["schedulerName"] == "dsplatform-scheduler"


def test_a_certificate_for_another_name_is_refused(webhook_server: dict[str, Any]) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        call({**webhook_server, "host": "evil.example.com"}, "GET", "/healthz")


def test_pods_without_datasets_get_an_empty_allow(webhook_server: dict[str, Any]) -> None:
    status, answer = call(webhook_server, "POST", "/mutate", review(None))
    assert status == 200 and answer["response"] == {"uid": REVIEW["request"]["uid"], "allowed": True}


def test_a_missing_dataset_is_a_warning_not_a_refusal(webhook_server: dict[str, Any]) -> None:
    status, answer = call(webhook_server, "POST", "/mutate", review("imagenet,unknown"))
    assert status == 200 and answer["response"]["allowed"] is True
    assert "patch" not in answer["response"] and "unknown" in answer["response"]["warnings"][0]


@pytest.mark.parametrize(
    "body", [b"not json", {"kind": "AdmissionReview"}, {"apiVersion": "v1", "kind": "x", "request": {}}]
)
def test_malformed_reviews_get_a_400(webhook_server: dict[str, Any], body: Any) -> None:
    status, answer = call(webhook_server, "POST", "/mutate", body)
    assert status == 400 and answer["code"] == "invalid_input"


def test_bad_settings_stop_the_webhook_with_one_clear_line(tmp_path: Path) -> None:
    env = {**webhook_environment(), "DSAGENT_WEBHOOK_INJECTION_FILE": str(tmp_path / "missing.json")}
    result = subprocess.run(
        [sys.executable, "-m", "dsagent.webhook"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "INJECTION_FILE: cannot read" in result.stderr and "Traceback" not in result.stderr


# -- hostile reviews: a 400 with a reason, or an allow without a patch


def test_a_deeply_nested_review_is_a_400_not_a_500(webhook_server: dict[str, Any]) -> None:
    # 100,000 levels: the old code's json.loads raised RecursionError, which became a 500
    status, answer = call(webhook_server, "POST", "/mutate", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and answer["code"] == "invalid_input"
    assert "nested deeper" in answer["message"]


def test_a_review_nested_past_the_depth_limit_is_a_400(webhook_server: dict[str, Any]) -> None:
    body = review()
    body["request"]["object"]["metadata"]["labels"] = {"x": json.loads("[" * 40 + "]" * 40)}
    status, answer = call(webhook_server, "POST", "/mutate", body)
    assert status == 400 and "nested deeper than 32" in answer["message"]


def test_an_oversized_review_is_a_400_naming_the_limit(webhook_server: dict[str, Any]) -> None:
    from dsagent.webhook.server import REVIEW_MAX_BYTES

    body = review()
    body["request"]["object"]["metadata"]["labels"] = {"pad": "x" * REVIEW_MAX_BYTES}
    status, answer = call(webhook_server, "POST", "/mutate", body)
    assert status == 400 and f"over {REVIEW_MAX_BYTES} bytes" in answer["message"]


@pytest.mark.parametrize("spec", [None, [], ["x"], "spec"])
def test_a_pod_whose_spec_is_not_an_object_is_admitted_without_a_patch(
    webhook_server: dict[str, Any], spec: Any
) -> None:
    body = review('[{"name": "coco", "source": "/nfs/coco"}]')
    body["request"]["object"]["spec"] = spec
    status, answer = call(webhook_server, "POST", "/mutate", body)
    # the old code answered with a patch adding /spec/initContainers, which cannot apply
    assert status == 200 and answer["response"]["allowed"] is True
    assert "patch" not in answer["response"]
    assert "spec is" in answer["response"]["warnings"][0]


@pytest.mark.parametrize("metadata", [[], "m", 3])
def test_a_pod_whose_metadata_is_not_an_object_is_admitted_without_a_patch(
    webhook_server: dict[str, Any], metadata: Any
) -> None:
    body = review()
    body["request"]["object"]["metadata"] = metadata
    status, answer = call(webhook_server, "POST", "/mutate", body)
    assert status == 200 and "patch" not in answer["response"]
    assert "metadata is" in answer["response"]["warnings"][0]


def test_the_tls_webhook_exits_soon_after_sigterm_with_a_client_holding_a_connection(
    chart_tls: dict[str, Any], module_apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """A client that opened TCP and never finished the TLS handshake (or an idle keep-alive)
    used to hold the TLS webhook past its SIGTERM deadline; now the grace period ends it."""
    from dsagent.webhook.server import SHUTDOWN_GRACE_S

    hold = ExitStack()
    port = hold.enter_context(held_port())  # nobody else's until the webhook listens on it
    files = chart_tls["files"]
    env = {
        **webhook_environment(),
        "DSAGENT_WEBHOOK_LISTEN": f"127.0.0.1:{port}",
        "DSAGENT_WEBHOOK_CERT_FILE": str(files["tls.crt"]),
        "DSAGENT_WEBHOOK_KEY_FILE": str(files["tls.key"]),
        "DSAGENT_WEBHOOK_INJECTION_FILE": str(files["injection"]),
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    kubeconfig = module_apiserver.write_kubeconfig(tmp_path / "config")
    env["DSAGENT_WEBHOOK_KUBECONFIG"] = str(kubeconfig)
    process = subprocess.Popen(
        [sys.executable, "-m", "dsagent.webhook"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    server = {"port": port, "context": ssl.create_default_context(cadata=chart_tls["ca"]), "host": chart_tls["host"]}
    idle: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if call(server, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "webhook did not start"
                time.sleep(0.1)
        hold.close()
        # one connection with a finished request kept alive, one that never starts its handshake
        kept = socket.create_connection(("127.0.0.1", port))
        tls = server["context"].wrap_socket(kept, server_hostname=chart_tls["host"])
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        tls.recv(1024)
        idle += [tls, socket.create_connection(("127.0.0.1", port))]
        process.terminate()
        # the grace period plus a generous margin for a loaded machine, well under the chart's 30 s
        process.wait(SHUTDOWN_GRACE_S + 20)
    finally:
        hold.close()
        for sock in idle:
            sock.close()
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


@pytest.mark.parametrize("certificate", ["missing", "not-pem"])
def test_a_missing_or_unreadable_certificate_is_one_line_and_exit_2(
    certificate: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # uvicorn loads the certificate only when it starts serving: this was a 40-line traceback, exit 1
    from dsagent.webhook.server import main

    injection = tmp_path / "injection.json"
    injection.write_text(json.dumps({"image": "dsplatform:test"}))
    cert = tmp_path / "tls.crt"
    if certificate == "not-pem":
        cert.write_text("not a certificate\n")
    monkeypatch.delenv("DSAGENT_PROTOCOLS", raising=False)  # webhook_environment()
    monkeypatch.delenv("DSAGENT_EGRESS_ALLOW", raising=False)
    monkeypatch.setenv("DSAGENT_WEBHOOK_INJECTION_FILE", str(injection))
    monkeypatch.setenv("DSAGENT_WEBHOOK_CERT_FILE", str(cert))
    monkeypatch.setenv("DSAGENT_WEBHOOK_KEY_FILE", str(cert))
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "cannot load the serving certificate" in err and str(cert) in err and "Traceback" not in err
    assert err.count("\n") == 1


# -- what an operator sees: admissions by outcome, one probe shape, JSON logs


def scrape(server: dict[str, Any]) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    conn = _Connection(server)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {
        s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_admissions_are_counted_by_outcome_and_every_outcome_exists_before_its_first(
    webhook_server: dict[str, Any],
) -> None:
    before = scrape(webhook_server)
    outcomes = ("patched", "unpatched", "failed_open", "invalid")
    for outcome in outcomes:  # pre-initialised: a failure ratio reads 0, not "no data"
        assert f"dsplatform_webhook_admissions_total{{outcome={outcome}}}" in before, sorted(before)
    assert "patch" in call(webhook_server, "POST", "/mutate", review("imagenet"))[1]["response"]
    call(webhook_server, "POST", "/mutate", review(None))  # nothing to do
    call(webhook_server, "POST", "/mutate", review("unknown"))  # admitted without its wiring
    call(webhook_server, "POST", "/mutate", review("unknown-too"))
    assert call(webhook_server, "POST", "/mutate", b"not json")[0] == 400
    after = scrape(webhook_server)

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    got = {o: delta(f"dsplatform_webhook_admissions_total{{outcome={o}}}") for o in outcomes}
    assert got == {"patched": 1, "unpatched": 1, "failed_open": 2, "invalid": 1}
    assert delta("dsplatform_webhook_request_duration_seconds_count{route=/mutate}") == 5


def test_the_probes_answer_the_one_shape(webhook_server: dict[str, Any]) -> None:
    assert call(webhook_server, "GET", "/healthz") == (200, {"status": "ok"})
    assert call(webhook_server, "GET", "/readyz") == (200, {"status": "ready"})


def test_json_logs_put_uvicorns_lines_and_the_access_log_in_the_same_format(
    chart_tls: dict[str, Any], module_apiserver: FakeApiServer, tmp_path: Path
) -> None:
    env = {"DSAGENT_LOG_FORMAT": "json", "DSAGENT_ACCESS_LOG": "1"}
    with webhook_process(chart_tls, module_apiserver, tmp_path, env) as server:
        call(server, "POST", "/mutate", review("unknown"))
        process = server["process"]
        process.terminate()
        output = process.stdout.read().decode()
    docs = [json.loads(line) for line in output.splitlines() if line.strip()]  # a line not JSON fails here
    assert {"uvicorn.error", "uvicorn.access", "dsagent.webhook"} <= {d["logger"] for d in docs}, docs
    assert any(d.get("path") == "/mutate" and d.get("status") == 200 for d in docs)
    assert any(d["level"] == "warning" and "admitted without dsplatform" in d["message"] for d in docs)


def test_a_review_with_a_key_twice_is_a_400_naming_the_key(webhook_server: dict[str, Any]) -> None:
    text = json.dumps(review())
    body = text.replace('"kind": "AdmissionReview"', '"kind": "AdmissionReview", "kind": "AdmissionReview"', 1)
    assert body != text
    status, answer = call(webhook_server, "POST", "/mutate", body.encode())
    assert status == 400 and answer["code"] == "invalid_input"
    assert "the key 'kind' twice" in answer["message"], answer
