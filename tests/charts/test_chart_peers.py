"""The chart's peer-to-peer values (agent.peers, docs/design.md#peers): off by default; on,
the agents share a token from a Secret (a mounted file, never an env value, never in pods),
listen where other agents dial them (the node's InternalIP and the peer port), may list
Nodes, and let each other through their NetworkPolicy.

Every object these renders produce is also validated strictly by test_chart.py (the
``peers`` and ``peers-existing-secret`` value sets).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsagent.cache import settings as agent_settings
from dsagent.nodeagent.clustersettings import ClusterSettings
from tests.charts.test_chart import (
    CHART,
    NAMESPACE,
    PEERS,
    PEERS_EXISTING_SECRET,
    agent_container,
    agent_pod,
    find,
    helm,
    ingress,
    render,
    rules_of,
)

pytestmark = pytest.mark.slow

Docs = list[dict[str, Any]]


@pytest.fixture(scope="module")
def rendered() -> dict[str, Docs]:
    return {
        "default": render(),
        "on": render({"agent": {"peers": {"enabled": True}}}),
        "tuned": render(PEERS),
        "existing": render(PEERS_EXISTING_SECRET),
        "on-without-controller": render({"agent": {"peers": {"enabled": True}}, "controller": {"enabled": False}}),
    }


def env_of(docs: Docs) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in agent_container(docs)["env"]}


def peer_env(docs: Docs) -> dict[str, str]:
    return {name: e["value"] for name, e in env_of(docs).items() if name.startswith("DSAGENT_PEER")}


def secrets(docs: Docs) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}


def peer_volume(docs: Docs) -> dict[str, Any]:
    [volume] = [v for v in agent_pod(docs)["volumes"] if "secret" in v and v["name"] == "peer-token"]
    return volume


def token_path(docs: Docs) -> str:
    """Where the agent container sees the token: the peer-token volume's mount and item path."""
    [mount] = [m for m in agent_container(docs)["volumeMounts"] if m["name"] == "peer-token"]
    [item] = peer_volume(docs)["secret"]["items"]
    return f"{mount['mountPath']}/{item['path']}"


def agent_settings_from(docs: Docs, token_file: Path) -> agent_settings.Settings:
    """The settings the rendered agent starts with, its token file replaced by ``token_file``."""
    env = {name: e["value"] for name, e in env_of(docs).items() if "value" in e}
    env.pop("DSAGENT_ADMIN_TOKEN_FILE")  # a mounted Secret in the cluster
    assert env["DSAGENT_PEER_TOKEN_FILE"] == token_path(docs)
    env["DSAGENT_PEER_TOKEN_FILE"] = str(token_file)
    ClusterSettings.from_env(env)
    return agent_settings.Settings.from_env(env)


def agent_rule(policy: dict[str, Any], agent_labels: dict[str, str]) -> list[dict[str, Any]]:
    return [r for r in policy["spec"]["ingress"] if {"podSelector": {"matchLabels": agent_labels}} in r["from"]]


# -- off by default


def test_off_by_default_no_token_no_peer_settings_no_node_port(rendered: dict[str, Docs]) -> None:
    docs = rendered["default"]
    assert not [n for n in secrets(docs) if n.endswith("-peer")]
    assert peer_env(docs) == {}
    assert not [v for v in agent_pod(docs)["volumes"] if v["name"] == "peer-token"]
    assert not [m for m in agent_container(docs)["volumeMounts"] if m["name"] == "peer-token"]
    assert all("hostPort" not in p for p in agent_container(docs)["ports"])
    labels = find(docs, "DaemonSet", "-agent")["spec"]["selector"]["matchLabels"]
    assert agent_rule(find(docs, "NetworkPolicy"), labels) == []
    assert ("", "nodes", "list") not in rules_of(docs, "-agent")


# -- the token


def test_on_the_chart_generates_a_long_random_token(rendered: dict[str, Docs]) -> None:
    secret = secrets(rendered["on"])["dsp-dsplatform-agent-peer"]
    assert secret["type"] == "Opaque" and set(secret["data"]) == {"token"}
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{40}", token)
    assert token != base64.b64decode(secrets(rendered["on"])["dsp-dsplatform-agent-admin"]["data"]["token"]).decode()


def test_the_generated_token_is_kept_across_upgrades(tmp_path: Path) -> None:
    """Offline rendering has no cluster for ``lookup``: a copy of the chart whose lookup of the
    peer Secret answers with a stored one shows that the stored token is what gets rendered."""
    chart = tmp_path / "dsplatform"
    shutil.copytree(CHART, chart)
    template = chart / "templates" / "agent-daemonset.yaml"
    text = template.read_text()
    stored = base64.b64encode(b"kept-across-upgrades-0123456789").decode()
    call = 'lookup "v1" "Secret" .Release.Namespace $peerSecret'
    assert text.count(call) == 1
    template.write_text(text.replace(call, f'dict "data" (dict "token" "{stored}")'))
    rendered = helm.Chart.load(str(chart)).render(
        {"agent": {"peers": {"enabled": True}}}, name="dsp", namespace=NAMESPACE, is_upgrade=True
    )
    docs = [d for path, text in rendered.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    assert secrets(docs)["dsp-dsplatform-agent-peer"]["data"]["token"] == stored


def test_the_agent_reads_the_token_from_the_mounted_secret(rendered: dict[str, Docs], tmp_path: Path) -> None:
    docs = rendered["on"]
    volume = peer_volume(docs)
    assert volume["secret"]["secretName"] == "dsp-dsplatform-agent-peer"
    assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert volume["secret"]["defaultMode"] == 0o400  # the CSI agent runs as root
    [mount] = [m for m in agent_container(docs)["volumeMounts"] if m["name"] == "peer-token"]
    assert mount["readOnly"] is True
    assert mount["mountPath"] not in {m["mountPath"] for m in agent_container(docs)["volumeMounts"] if m is not mount}
    token = base64.b64decode(secrets(docs)["dsp-dsplatform-agent-peer"]["data"]["token"]).decode()
    token_file = tmp_path / "token"
    token_file.write_text(token)
    assert agent_settings_from(docs, token_file).peer_token == token


def test_the_secret_key_value_applies_only_to_an_existing_secret() -> None:
    docs = render({"agent": {"peers": {"enabled": True, "existingSecretKey": "p2p"}}})
    assert peer_volume(docs)["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert set(secrets(docs)["dsp-dsplatform-agent-peer"]["data"]) == {"token"}


def test_the_token_is_never_an_env_value(rendered: dict[str, Docs]) -> None:
    for label, secret in (("on", "dsp-dsplatform-agent-peer"), ("existing", "platform-peer-token")):
        env = env_of(rendered[label])
        assert "DSAGENT_PEER_TOKEN" not in env, label  # neither a value nor a secretKeyRef
        assert env["DSAGENT_PEER_TOKEN_FILE"]["value"] == token_path(rendered[label]), label
        assert not [e for e in env.values() if secret in json.dumps(e.get("valueFrom", {}))], label
    token = base64.b64decode(secrets(rendered["on"])["dsp-dsplatform-agent-peer"]["data"]["token"]).decode()
    assert token not in json.dumps(agent_pod(rendered["on"]))


def test_pods_and_the_other_containers_never_get_the_peer_token(rendered: dict[str, Docs]) -> None:
    docs = rendered["on"]
    secret = "dsp-dsplatform-agent-peer"
    token = base64.b64decode(secrets(docs)[secret]["data"]["token"]).decode()
    pod = agent_pod(docs)
    for container in pod["containers"] + pod["initContainers"]:
        mounted = {m["name"] for m in container.get("volumeMounts", [])}
        assert ("peer-token" in mounted) == (container["name"] == "agent"), container["name"]
    # what the webhook injects into user pods names neither the Secret nor the token
    injection = find(docs, "ConfigMap", "-webhook")["data"]["injection.json"]
    assert secret not in injection and "peer" not in injection.lower()
    # and no object but the Secret itself and the agent's volume mentions them
    for doc in docs:
        if doc["kind"] == "Secret":
            continue
        text = json.dumps(doc)
        assert token not in text, doc["metadata"]["name"]
        if doc["kind"] != "DaemonSet":
            assert secret not in text, doc["metadata"]["name"]


def test_a_platform_secret_is_used_and_none_is_made(rendered: dict[str, Docs], tmp_path: Path) -> None:
    docs = rendered["existing"]
    assert set(secrets(docs)) == {"dsp-dsplatform-agent-admin", "dsp-dsplatform-webhook-tls"}
    volume = peer_volume(docs)
    assert volume["secret"]["secretName"] == "platform-peer-token"
    assert volume["secret"]["items"] == [{"key": "p2p", "path": "token"}]
    # no CSI: the agent runs as a non-root user and a Secret's files are root's
    assert agent_container(docs)["securityContext"]["runAsUser"] != 0
    assert volume["secret"]["defaultMode"] & 0o004
    token_file = tmp_path / "token"
    token_file.write_text("platform-made-token-0123456789\n")
    assert agent_settings_from(docs, token_file).peer_token == "platform-made-token-0123456789"


# -- reachability and tunables


def test_other_agents_can_dial_the_agent_on_its_node(rendered: dict[str, Docs], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("x" * 16)
    for label, node_port in (("on", 7420), ("tuned", 17420), ("existing", 7420)):
        docs = rendered[label]
        [http] = agent_container(docs)["ports"]
        assert http["containerPort"] == 7420 and http["hostPort"] == node_port, label
        settings = agent_settings_from(docs, token_file)
        assert settings.listen == ("0.0.0.0", 7420)  # every address: the hostPort's DNAT target
        assert settings.peer_port == node_port  # what cluster.nodeagent dials on the other nodes
    assert agent_pod(rendered["existing"])["hostNetwork"] is True


def test_with_host_networking_the_node_port_must_be_the_agents_own() -> None:
    values = {"agent": {"peers": {"enabled": True, "hostPort": 17420}}, "topologyDiscovery": {"hostNetwork": True}}
    with pytest.raises(helm.HelmRenderError, match="agent.peers.hostPort"):
        render(values)
    render({**values, "agent": {"peers": {"enabled": True, "hostPort": 7420}}})


def test_tunables_are_passed_only_when_set_and_the_agent_accepts_them(
    rendered: dict[str, Docs], tmp_path: Path
) -> None:
    assert peer_env(rendered["on"]) == {
        "DSAGENT_PEER_TOKEN_FILE": "/etc/dsagent-peer/token",
        "DSAGENT_PEER_PORT": "7420",
    }
    token_file = tmp_path / "token"
    token_file.write_text("y" * 20)
    defaults = agent_settings_from(rendered["on"], token_file)
    tuned = agent_settings_from(rendered["tuned"], token_file)
    assert (defaults.peer_max_uploads, defaults.peer_max_uploads_per_peer, defaults.peer_upload_rate) == (8, 4, 0)
    assert (
        tuned.peer_max_uploads,
        tuned.peer_max_uploads_per_peer,
        tuned.peer_upload_rate,
        tuned.peer_min_rate,
        tuned.peer_timeout,
        tuned.peer_wait,
    ) == (16, 2, 200 << 20, 2_000_000, 30.0, 45.0)


def test_large_numbers_reach_the_agent_as_whole_numbers() -> None:
    """Helm holds numbers as floats: 104857600 must not become "1.048576e+08"."""
    env = peer_env(render({"agent": {"peers": {"enabled": True, "uploadRate": 104857600, "maxUploads": 10_000_000}}}))
    assert env["DSAGENT_PEER_UPLOAD_RATE"] == "104857600" and env["DSAGENT_PEER_MAX_UPLOADS"] == "10000000"


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"uploadRate": "fast"}, "uploadRate"),
        ({"minRate": -1}, "minRate"),
        ({"timeout": "ten seconds"}, "timeout"),
        ({"wait": "a while"}, "wait"),
        ({"maxUploads": -1}, "maxUploads"),
        ({"hostPort": 70000}, "hostPort"),
        ({"existingSecret": "Not_A_Name"}, "existingSecret"),
        ({"enabeld": True}, "enabeld"),
    ],
)
def test_values_schema_rejects_bad_peer_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError) as info:
        helm.Chart.load(str(CHART)).validate_schema({"agent": {"peers": values}})
    assert complaint in str(info.value)


# -- RBAC and the NetworkPolicy


def test_on_the_agent_may_also_list_nodes_and_their_nodecaches_and_nothing_more(rendered: dict[str, Docs]) -> None:
    assert rules_of(rendered["on"], "-agent") - rules_of(rendered["default"], "-agent") == {
        ("", "nodes", "list"),
        ("dsagent.io", "nodecaches", "list"),  # the inventories (docs/design.md#node-state)
    }
    assert rules_of(rendered["default"], "-agent") <= rules_of(rendered["on"], "-agent")


def test_the_network_policy_lets_the_other_agents_in_and_keeps_the_rest(rendered: dict[str, Docs]) -> None:
    default = find(rendered["default"], "NetworkPolicy")
    for label in ("on", "tuned"):
        docs = rendered[label]
        labels = find(docs, "DaemonSet", "-agent")["spec"]["selector"]["matchLabels"]
        assert labels.items() <= find(docs, "DaemonSet", "-agent")["spec"]["template"]["metadata"]["labels"].items()
        policy = find(docs, "NetworkPolicy")
        assert policy["spec"]["podSelector"] == default["spec"]["podSelector"]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        [rule] = agent_rule(policy, labels)
        # the port the policy sees is the pod's own, after the hostPort's DNAT
        assert rule["ports"] == [{"port": agent_container(docs)["ports"][0]["containerPort"], "protocol": "TCP"}]
        others = [r for r in policy["spec"]["ingress"] if r is not rule]
        assert others == default["spec"]["ingress"], label  # the controller's rule, unchanged
    [rule] = agent_rule(find(rendered["tuned"], "NetworkPolicy"), labels)
    assert {"ipBlock": {"cidr": "10.20.0.0/16"}} in rule["from"]  # agent.peers.networkPolicyFrom
    [rule] = agent_rule(find(rendered["on"], "NetworkPolicy"), labels)
    assert len(rule["from"]) == 1


def test_without_controller_or_scrapers_only_the_agents_get_in(rendered: dict[str, Docs]) -> None:
    docs = rendered["on-without-controller"]
    labels = find(docs, "DaemonSet", "-agent")["spec"]["selector"]["matchLabels"]
    policy = find(docs, "NetworkPolicy")
    assert ingress(policy) == agent_rule(policy, labels)  # and the `helm test` pod's rule
    assert len(ingress(policy)) == 1


def test_the_admin_token_is_readable_by_the_agent_whatever_user_it_runs_as(rendered: dict[str, Docs]) -> None:
    """The admin token's Secret volume follows the agent's user like the peer token's: a
    non-root agent (no CSI, no device plugin) cannot read a root-owned 0400 file and so
    could not start."""
    for name, docs in rendered.items():
        daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
        volume = next(v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "admin-token")
        root = agent_container(docs)["securityContext"].get("runAsUser", 0) == 0
        assert volume["secret"]["defaultMode"] == (0o400 if root else 0o444), name


def test_fetch_links_are_auto_by_default_in_the_nodes_network_namespace() -> None:
    """agent.fetchLinks (docs/design.md#links): the agent binds to the NICs' addresses, which
    only the node's network namespace has. By default (privileged for the CSI driver, with the
    host's pids) the agent makes its link sockets there and stays on the pod network; with
    the host's network it is there already; without either, addresses are refused."""
    from kubernetes_validate import utils as kv

    default = render()
    env = env_of(default)
    assert env["DSAGENT_FETCH_LINKS"]["value"] == "auto" and env["DSAGENT_NODE_NETNS"]["value"] == "/proc/1/ns/net"
    pod = agent_pod(default)
    assert "hostNetwork" not in pod and pod["hostPID"] is True, "/proc/1 is the node's first process"
    assert agent_container(default)["securityContext"]["privileged"] is True  # setns(2) needs CAP_SYS_ADMIN
    settings = agent_settings.Settings.from_env(
        {k: env[k]["value"] for k in ("DSAGENT_FETCH_LINKS", "DSAGENT_NODE_NETNS")}
    )
    assert settings.fetch_links == ("auto",) and settings.node_netns == "/proc/1/ns/net"
    unlinked = env_of(render({"agent": {"fetchLinks": ""}}))
    assert "DSAGENT_FETCH_LINKS" not in unlinked
    assert unlinked["DSAGENT_NODE_NETNS"]["value"] == "/proc/1/ns/net", "discovery reads the NICs' addresses there"
    docs = render({"agent": {"fetchLinks": "auto"}, "topologyDiscovery": {"hostNetwork": True}})
    assert env_of(docs)["DSAGENT_FETCH_LINKS"]["value"] == "auto" and "DSAGENT_NODE_NETNS" not in env_of(docs)
    assert agent_pod(docs)["hostNetwork"] is True
    kv.validate(find(docs, "DaemonSet", "-agent"), "1.29.0", strict=True)
    listed = render({"agent": {"fetchLinks": "10.0.0.5,10.0.1.5"}})
    value = env_of(listed)["DSAGENT_FETCH_LINKS"]["value"]
    assert agent_settings.Settings.from_env({"DSAGENT_FETCH_LINKS": value}).fetch_links == ("10.0.0.5", "10.0.1.5")
    assert (
        env_of(render({"agent": {"fetchLinks": "auto"}, "csi": {"enabled": False}})).get("DSAGENT_NODE_NETNS") is None
    )
    with pytest.raises(Exception, match="hostNetwork or csi.enabled"):
        render({"agent": {"fetchLinks": "10.0.0.5,10.0.1.5"}, "csi": {"enabled": False}})
    with pytest.raises(Exception, match="fetchLinks"):
        render({"agent": {"fetchLinks": "eth0"}, "topologyDiscovery": {"hostNetwork": True}})
