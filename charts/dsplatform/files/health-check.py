# `helm test`: every agent, the extender and the webhook answer /healthz and /readyz with 200.
# Standard library only (it runs in the dsplatform image); tests/charts/test_chart_helm_test.py
# runs it against real servers. Exit 0: all answered; 1: each failure named on stderr.
import os
import socket
import ssl
import sys
import time
import urllib.request

failures = []


def check(name, base, context=None):
    for path in ("/healthz", "/readyz"):
        try:
            with urllib.request.urlopen(base + path, timeout=10, context=context) as answer:
                status = answer.status
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none raised
            failures.append(f"{name} {base}{path}: {exc}")
            continue
        print(f"ok {name} {base}{path} {status}")


agents = os.environ.get("CHECK_AGENTS")
if agents:
    port = int(os.environ["CHECK_AGENT_PORT"])
    addresses = set()
    # the hook Service's DNS records may lag its creation
    deadline = time.monotonic() + float(os.environ.get("CHECK_DNS_WAIT", "60"))
    while not addresses and time.monotonic() < deadline:
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(agents, port, proto=socket.IPPROTO_TCP)}
        except socket.gaierror:
            time.sleep(2)
    if not addresses:
        failures.append(f"no agent behind {agents}")
    for address in sorted(addresses):
        host = f"[{address}]" if ":" in address else address
        check("agent", f"http://{host}:{port}")
if os.environ.get("CHECK_EXTENDER"):
    check("extender", os.environ["CHECK_EXTENDER"])
if os.environ.get("CHECK_WEBHOOK"):
    # Health only: the CA may be cert-manager's or the operator's; the API server verifies it.
    check("webhook", os.environ["CHECK_WEBHOOK"], ssl._create_unverified_context())
for failure in failures:
    print(f"FAILED {failure}", file=sys.stderr)
sys.exit(1 if failures else 0)
