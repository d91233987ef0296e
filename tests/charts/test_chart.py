"""The Helm chart, rendered and linted by Helm's own SDK, validated object by object.

Every rendered object is checked with ``kubernetes-validate`` in strict mode for every
Kubernetes version from 1.29 to the newest it ships. What those schemas cannot cover is
checked here by hand: the KubeSchedulerConfiguration inside its ConfigMap (a component
config, not an API object), cert-manager objects, and Datasets against the CRD's own
openAPIV3Schema.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv
from packaging.version import Version

from dsagent.cache import settings
from dsagent.nodeagent.clustersettings import ClusterSettings
from tools.support.fake_apiserver import make_dataset

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "charts" / "dsplatform"
NAMESPACE = "dsplatform"
RELEASE = "dsp"
KUBE_VERSIONS = sorted({v for v in kv.all_versions() if Version(v) >= Version("1.29")}, key=Version)

NON_DEFAULT: dict[str, Any] = {
    "image": {"repository": "registry.example.com/ml/dsplatform", "tag": "0.1.0-rc1"},
    "imagePullSecrets": [{"name": "regcred"}],
    "agent": {
        "cacheDir": "/nvme/dsagent",
        "socketDir": "/var/run/dsagent",
        "capacity": "800Gi",
        "localSources": ["/mnt/nfs/datasets"],
        "maxFetches": 2,
        "runAsUser": 1001,
        "runAsGroup": 1001,
        "devicePlugin": {"enabled": False},  # non-root: the kubelet's sockets are root's
        "nodeSelector": {"node-role.kubernetes.io/gpu": ""},
        "tolerations": [{"operator": "Exists"}],
        "networkPolicy": {
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        },
    },
    "extender": {"replicas": 3, "weights": "dataset=1,roce=0,numa=0", "partialDatasets": True},
    "scheduler": {
        "name": "data-aware",
        "replicas": 2,
        "extender": {"weight": 5, "httpTimeout": "2s"},
        "resourceScoring": {"type": "LeastAllocated", "gpuWeight": 1},
    },
    "webhook": {
        "certManager": {"enabled": True},
        "excludeNamespaces": ["kube-system", "monitoring"],
        "datasetsMountPath": "/data",
    },
    "crds": {"keep": False},
    "csi": {
        "driverName": "data.example.com",
        "kubeletDir": "/data/kubelet",
        "registrar": {"image": {"repository": "mirror.example.com/csi-node-driver-registrar", "tag": "v2.12.0"}},
    },
}
MINIMAL: dict[str, Any] = {
    "webhook": {"enabled": False},
    "scheduler": {"enabled": False},
    "extender": {"enabled": False},
    "crds": {"install": False},
    "controller": {"enabled": False},
}
DIGEST = "sha256:" + "ab" * 32
MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
PRODUCTION: dict[str, Any] = {
    "image": {"repository": "registry.example.com/ml/dsplatform", "tag": "ignored", "digest": DIGEST},
    "agent": {"reserve": "20%", "networkPolicy": {"metricsFrom": MONITORING}},
    "availability": {
        "podDisruptionBudget": {"maxUnavailable": "50%"},
        "podAntiAffinity": "hard",
        "topologySpread": {"whenUnsatisfiable": "DoNotSchedule"},
    },
    "topologyDiscovery": {"hostNetwork": True},
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
    },
    "controller": {"replicas": 3, "packServiceAccount": "bucket-writer"},
}
DEVICE_PLUGIN: dict[str, Any] = {
    "agent": {
        "cacheDir": "/nvme/dsagent",
        "devicePlugin": {"enabled": True, "nodeLabel": "example.com/gpu-plugin"},
    },
    "gpuClasses": {"resourcePrefix": "example.com"},
}
GPU_CLASSES: dict[str, Any] = {
    "gpuClasses": {
        "enabled": True,
        "resourcePrefix": "example.com",
        "jobLabels": ["team.example.com/job", "job-name"],
        "jobTTL": "2h",
    },
    "agent": {"roceClasses": "subnet"},
}
# Peer-to-peer bundles (tests/charts/test_chart_peers.py): a chart-made token, every tunable,
# a node port apart from the agent's own; and a platform's Secret with host networking and
# the agent running as non-root (no CSI).
PEERS: dict[str, Any] = {
    "agent": {
        "peers": {
            "enabled": True,
            "hostPort": 17420,
            "maxUploads": 16,
            "maxUploadsPerPeer": 2,
            "uploadRate": "200Mi",
            "minRate": 2000000,
            "timeout": "30s",
            "wait": "45s",
            "networkPolicyFrom": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
        }
    }
}
PEERS_EXISTING_SECRET: dict[str, Any] = {
    "agent": {
        "peers": {"enabled": True, "existingSecret": "platform-peer-token", "existingSecretKey": "p2p"},
        "devicePlugin": {"enabled": False},  # non-root: no kubelet sockets
    },
    "topologyDiscovery": {"hostNetwork": True},
    "csi": {"enabled": False},
}
VALUE_SETS = {
    "default": {},
    "non-default": NON_DEFAULT,
    "agent-only": MINIMAL,
    "production": PRODUCTION,
    "device-plugin": DEVICE_PLUGIN,
    "no-csi": {"csi": {"enabled": False}, "agent": {"devicePlugin": {"enabled": False}}},
    "gpu-classes": GPU_CLASSES,
    "peers": PEERS,
    "peers-existing-secret": PEERS_EXISTING_SECRET,
    # every Secret and certificate brought by the user (tests/charts/test_chart_gitops.py)
    "gitops": {
        "agent": {"adminToken": {"existingSecret": "ops-admin"}},
        "webhook": {"tls": {"existingSecret": "ops-webhook-tls", "caBundle": "QUJD"}},
    },
    "cert-manager-with-issuer": {
        "webhook": {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}
    },
}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's objects for ``values``, a fresh copy each call: the chart is rendered once
    per value set and worker (many tests render the defaults), and parsed with libyaml."""
    try:
        key = json.dumps(values or {}, sort_keys=True)
    except TypeError:  # not JSON: rendered uncached
        return _render(values or {})
    return copy.deepcopy(_rendered_once(key))


@functools.cache
def _rendered_once(values_json: str) -> list[dict[str, Any]]:
    return _render(json.loads(values_json))


def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for path, text in sorted(out.items()) if path.endswith(".yaml") for doc in load_all(text) if doc]


def load_all(text: str) -> list[Any]:
    """``yaml.safe_load_all`` with libyaml's parser where PyYAML has it (ten times faster)."""
    return list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def find(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, found {[d['metadata']['name'] for d in matches]}"
    return matches[0]


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {label: render(values) for label, values in VALUE_SETS.items()}


# -- Helm's own checks


@pytest.mark.parametrize("label", sorted(VALUE_SETS))
def test_helm_lint_strict_finds_no_warnings_or_errors(label: str) -> None:
    report = helm.lint(str(CHART), VALUE_SETS[label], strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


@pytest.mark.parametrize("kube_version", ["v1.29.0", "v1.37.0"])
def test_the_chart_lints_for_the_oldest_and_newest_supported_kubernetes(kube_version: str) -> None:
    report = helm.lint(str(CHART), strict=True, kube_version=kube_version)
    assert report["errors"] == []


def test_the_chart_declares_the_kubernetes_versions_it_is_validated_for() -> None:
    assert helm.Chart.load(str(CHART)).metadata["kubeVersion"] == ">=1.29.0-0"


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"agent": {"evictRatio": 0.9}}, "evictRatio"),
        ({"agent": {"runAsUser": 0}}, "runAsUser"),
        ({"agent": {"cacheDir": "relative/path"}}, "cacheDir"),
        ({"agent": {"capacity": "lots"}}, "capacity"),
        ({"agent": {"idleTTL": "a week"}}, "idleTTL"),
        ({"agent": {"cahceDir": "/typo"}}, "cahceDir"),
        ({"webhook": {"failurePolicy": "Sometimes"}}, "failurePolicy"),
        ({"webhook": {"timeoutSeconds": 60}}, "timeoutSeconds"),
        ({"scheduler": {"name": "Not_A_DNS_Name"}}, "name"),
        ({"scheduler": {"extender": {"httpTimeout": "5"}}}, "httpTimeout"),
        ({"extender": {"weights": "dataset=lots"}}, "weights"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"gpuClasses": {"resourcePrefix": "Example.COM"}}, "resourcePrefix"),
        ({"gpuClasses": {"gpuResource": "gpu"}}, "gpuResource"),
        ({"gpuClasses": {"jobTTL": "forever"}}, "jobTTL"),
        ({"agent": {"roceClasses": "per-nic"}}, "roceClasses"),
        ({"agent": {"stripeHandoffSeconds": -1}}, "stripeHandoffSeconds"),
        ({"agent": {"stripeOnDemandRetry": "soon"}}, "stripeOnDemandRetry"),
        ({"scheduler": {"resourceScoring": {"type": "RequestedToCapacityRatio", "gpuWeight": 1}}}, "resourceScoring"),
        ({"scheduler": {"resourceScoring": {"type": "MostAllocated", "gpuWeight": 0}}}, "gpuWeight"),
    ],
)
def test_values_schema_rejects_bad_values_naming_the_key(values: dict[str, Any], complaint: str) -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmValuesError) as info:
        chart.validate_schema(values)
    assert complaint in str(info.value)


def test_the_default_values_satisfy_the_schema() -> None:
    helm.Chart.load(str(CHART)).validate_schema({})
    helm.Chart.load(str(CHART)).validate_schema(NON_DEFAULT)


# -- every object, every Kubernetes version

# kubernetes-validate knows only built-in kinds: cert-manager objects and the Prometheus
# Operator's ServiceMonitor (CRDs) are checked by the tests below instead.
CHECKED_BY_HAND = {"cert-manager.io/v1", "monitoring.coreos.com/v1"}
# admissionregistration.k8s.io/v1 from Kubernetes 1.30; the SDK renders for a newer cluster.
RENDERED_FROM_1_30 = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def all_objects(rendered: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for label, docs in rendered.items():
        for doc in docs:
            yield label, doc


@pytest.fixture
def cached_schemas(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubernetes-validate re-reads its multi-megabyte definitions per object; read once."""
    monkeypatch.setattr(kv, "schema_contents", _schema_contents)


_schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.usefixtures("cached_schemas")
def test_every_rendered_object_validates_strictly(kube_version: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    checked = 0
    for label, doc in all_objects(rendered):
        if doc["apiVersion"] in CHECKED_BY_HAND:
            continue
        if doc["kind"] in RENDERED_FROM_1_30 and Version(kube_version) < Version("1.30"):
            continue  # the chart renders them only for clusters >= 1.30 (test_chart_security.py)
        try:
            kv.validate(doc, kube_version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(
                f"{label}: {doc['kind']}/{doc['metadata']['name']} invalid for {kube_version}: "
                f"{exc.message} at {list(exc.path)}"
            )
        checked += 1
    assert checked > 40


def test_kubernetes_validate_ships_at_least_the_versions_we_claim() -> None:
    assert KUBE_VERSIONS[0] == "1.29.0" and Version(KUBE_VERSIONS[-1]) >= Version("1.31")


def test_cert_manager_objects_are_well_formed(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["non-default"]
    cert = find(docs, "Certificate")
    issuer = find(docs, "Issuer")
    webhook = find(docs, "MutatingWebhookConfiguration")
    service = find(docs, "Service", "-webhook")
    assert cert["spec"]["issuerRef"] == {"name": issuer["metadata"]["name"], "kind": "Issuer"}
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert issuer["spec"] == {"selfSigned": {}}
    assert (
        webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == f"{NAMESPACE}/{cert['metadata']['name']}"
    )
    assert "caBundle" not in webhook["webhooks"][0]["clientConfig"]
    assert not [d for d in docs if d["kind"] == "Secret" and d["type"] == "kubernetes.io/tls"]
    own = rendered["cert-manager-with-issuer"]
    assert find(own, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}
    assert "Issuer" not in kinds(own)


# -- the second scheduler's KubeSchedulerConfiguration

EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
CONFIG_FIELDS = {
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "healthzBindAddress",
    "metricsBindAddress",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
    "delayCacheUntilActive",
}


def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(find(docs, "ConfigMap", "-scheduler")["data"]["config.yaml"])
    return config


@pytest.mark.parametrize("label", ["default", "non-default"])
def test_scheduler_configuration_has_one_profile_and_an_ignorable_extender(
    label: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[label]
    config = scheduler_config(docs)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= CONFIG_FIELDS
    expected_name = "data-aware" if label == "non-default" else "dsplatform-scheduler"
    assert [p["schedulerName"] for p in config["profiles"]] == [expected_name]
    assert config["leaderElection"]["resourceName"] == expected_name
    [extender] = config["extenders"]
    assert set(extender) <= EXTENDER_FIELDS
    assert extender["ignorable"] is True
    assert extender["filterVerb"] == "filter" and extender["prioritizeVerb"] == "prioritize"
    assert isinstance(extender["weight"], int) and extender["weight"] >= 1
    assert extender["httpTimeout"].endswith("s")
    service = find(docs, "Service", "-extender")
    assert service["spec"]["sessionAffinity"] == "ClientIP"  # job memory lives in one replica
    port = service["spec"]["ports"][0]["port"]
    assert extender["urlPrefix"] == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{port}"
    deployment = find(docs, "Deployment", "-extender")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DSEXT_PORT"] == str(port)
    assert env["DSEXT_WATCH"] == str(extender["nodeCacheCapable"]).lower()


@pytest.mark.parametrize(
    ("label", "strategy", "gpu_weight"), [("default", "MostAllocated", 3), ("non-default", "LeastAllocated", 1)]
)
def test_the_scheduler_scores_resources_as_configured_gpus_first(
    label: str, strategy: str, gpu_weight: int, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    # packing (MostAllocated) keeps whole nodes free for multi-GPU workers; the simulator
    # models our scheduler with the default (tools/sim/baselines.py most_allocated)
    [profile] = scheduler_config(rendered[label])["profiles"]
    [plugin] = profile["pluginConfig"]
    assert plugin["name"] == "NodeResourcesFit"
    scoring = plugin["args"]["scoringStrategy"]
    assert scoring["type"] == strategy
    weights = {r["name"]: r["weight"] for r in scoring["resources"]}
    assert weights == {"nvidia.com/gpu": gpu_weight, "cpu": 1, "memory": 1}


def test_the_leader_election_lease_role_names_the_configured_lease(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["non-default"]
    role = find(docs, "Role", "-leader-election")
    assert any(r.get("resourceNames") == ["data-aware"] for r in role["rules"])


# -- least-privilege RBAC


def rules_of(docs: list[dict[str, Any]], suffix: str) -> set[tuple[str, str, str]]:
    role = find(docs, "ClusterRole", suffix)
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_agent_may_only_read_and_patch_nodes_watch_pods_read_datasets_and_write_events(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    # no pods/get: the agent only lists and watches, with spec.nodeName; Events on its pods;
    # its Node's DsplatformRoceClasses and DsplatformFetchLinks conditions (device plugin auto,
    # fetch links; the admission policy: those only)
    assert rules_of(rendered["default"], "-agent") == {
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("dsagent.io", "datasets", "get"),
        ("dsagent.io", "datasets", "list"),
        ("dsagent.io", "datasets", "watch"),
        ("dsagent.io", "nodecaches", "get"),
        ("dsagent.io", "nodecaches", "create"),
        ("dsagent.io", "nodecaches", "patch"),
    }


def test_the_extender_only_lists_and_watches(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert rules_of(rendered["default"], "-extender") == {
        (group, resource, verb)
        for group, resource in (("", "nodes"), ("", "pods"), ("dsagent.io", "datasets"), ("dsagent.io", "nodecaches"))
        for verb in ("list", "watch")
    }


def test_without_gpu_classes_or_plans_the_webhook_only_reads_datasets(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    without = {"gpuClasses": {"enabled": False}, "webhook": {"deadlinePlans": {"enabled": False}}}
    assert rules_of(render(without), "-webhook") == {("dsagent.io", "datasets", "get")}
    # the default (auto) lists nodes and keeps job Leases, as with the class rewrite on
    assert rules_of(rendered["default"], "-webhook") == rules_of(rendered["gpu-classes"], "-webhook")


def test_with_gpu_classes_the_webhook_lists_nodes_and_keeps_job_leases(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    assert rules_of(rendered["gpu-classes"], "-webhook") == {
        ("dsagent.io", "datasets", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),  # kept by list+watch (webhook.watchNodes)
        ("dsagent.io", "nodecaches", "list"),
        ("dsagent.io", "nodecaches", "watch"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }
    listing = render({"gpuClasses": {"enabled": True}, "webhook": {"watchNodes": False}})
    assert {r for r in rules_of(listing, "-webhook") if r[2] == "watch"} == set()
    container = find(listing, "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in container["env"]}["DSAGENT_WEBHOOK_WATCH_NODES"] == "false"


def test_no_role_uses_wildcards_or_touches_secrets(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for _, doc in all_objects(rendered):
        for rule in doc.get("rules", []) if doc["kind"] in ("ClusterRole", "Role") else []:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], doc["metadata"]["name"]
            assert "secrets" not in rule["resources"], doc["metadata"]["name"]


# -- the agent DaemonSet


def agent_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    return spec


def agent_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = [c for c in agent_pod(docs)["containers"] if c["name"] == "agent"]
    return container


def test_the_agent_learns_its_node_name_from_the_downward_api(rendered: dict[str, list[dict[str, Any]]]) -> None:
    container = agent_container(rendered["default"])
    env = {e["name"]: e for e in container["env"]}
    assert env["DSAGENT_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["command"] == ["dsagent", "serve", "--kubernetes"]


def test_the_agent_is_node_critical_probed_and_non_root(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = agent_pod(rendered["no-csi"])  # with the CSI plugin it runs privileged (test below)
    [container] = pod["containers"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["runAsUser"] == 65532
    assert container["resources"]["requests"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_host_directories_follow_the_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = agent_pod(rendered["non-default"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cache"]["hostPath"]["path"] == "/nvme/dsagent"
    assert volumes["socket"]["hostPath"]["path"] == "/var/run/dsagent"
    container = agent_container(rendered["non-default"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DSAGENT_CAPACITY"] == "800Gi"
    assert env["DSAGENT_LOCAL_SOURCES"] == "/mnt/nfs/datasets"
    # the agent reads a local source at the path it was told: the host directory is mounted there
    # (it was not, and the agent refused every dataset under it; it now refuses to start without it)
    assert volumes["local-source-0"]["hostPath"] == {"path": "/mnt/nfs/datasets", "type": "Directory"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["local-source-0"]["mountPath"] == "/mnt/nfs/datasets" and mounts["local-source-0"]["readOnly"]
    assert env["DSAGENT_MAX_FETCHES"] == "2"
    assert "chown 1001:1001" in pod["initContainers"][0]["args"][0]
    assert container["image"] == "registry.example.com/ml/dsplatform:0.1.0-rc1"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_agent_settings_in_the_daemonset_are_ones_the_agent_accepts(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for label in ("default", "non-default"):
        container = agent_container(rendered[label])
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        env.pop("DSAGENT_ADMIN_TOKEN_FILE")  # a mounted Secret in the cluster
        settings.Settings.from_env(env)
        ClusterSettings.from_env(env)


def test_the_admin_token_is_generated_and_long(rendered: dict[str, list[dict[str, Any]]]) -> None:
    secret = find(rendered["default"], "Secret", "-agent-admin")
    assert len(base64.b64decode(secret["data"]["token"])) >= 32


# -- the webhook


def test_the_webhook_never_blocks_pods_and_only_sees_annotated_or_gpu_ones(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    [hook] = find(rendered["default"], "MutatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    # the class rewrite (auto by default) creates a job's Lease, never on a dry run
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert "k == 'nvidia.com/gpu' || k.startsWith('dsagent.io/')" in hook["matchConditions"][0]["expression"]
    [off] = find(render({"gpuClasses": {"enabled": False}}), "MutatingWebhookConfiguration")["webhooks"]
    assert off["sideEffects"] == "None" and "nvidia.com/gpu" not in off["matchConditions"][0]["expression"]
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
    assert "'dsagent.io/datasets' in object.metadata.annotations" in hook["matchConditions"][0]["expression"]
    [expr] = hook["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "NotIn" and {"kube-system", NAMESPACE} <= set(expr["values"])
    assert hook["clientConfig"]["service"]["path"] == "/mutate"


def test_with_gpu_classes_the_webhook_also_sees_gpu_pods_and_declares_its_lease_writes(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    from dsagent.webhook.gpurequest import GpuClassSettings

    [hook] = find(rendered["gpu-classes"], "MutatingWebhookConfiguration")["webhooks"]
    assert hook["sideEffects"] == "NoneOnDryRun"
    [condition] = hook["matchConditions"]
    expression = condition["expression"]
    assert "'dsagent.io/datasets' in object.metadata.annotations" in expression
    assert "k == 'nvidia.com/gpu' || k.startsWith('example.com/')" in expression
    assert "object.spec.initContainers.exists(c," in expression and expression.count("(") == expression.count(")")
    container = find(rendered["gpu-classes"], "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = GpuClassSettings.from_env(env)
    assert (settings.enabled, settings.resource("gpu-roce1"), settings.job_labels, settings.lease_ttl_s) == (
        True,
        "example.com/gpu-roce1",
        ("team.example.com/job", "job-name"),
        7200,
    )
    default = find(rendered["default"], "Deployment", "-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert GpuClassSettings.from_env({e["name"]: e["value"] for e in default["env"] if "value" in e}).mode == "auto"
    off = find(render({"gpuClasses": {"enabled": False}}), "Deployment", "-webhook")["spec"]["template"]["spec"]
    assert (
        GpuClassSettings.from_env({e["name"]: e["value"] for e in off["containers"][0]["env"] if "value" in e}).enabled
        is False
    )


def test_the_extender_reads_the_class_resources_the_webhook_writes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from scheduler_plugin.settings import Settings

    for label, prefix in (("default", "dsagent.io/gpu-roce"), ("gpu-classes", "example.com/gpu-roce")):
        container = find(rendered[label], "Deployment", "-extender")["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        settings = Settings.from_env(env)
        assert (settings.roce_resource_prefix, settings.gpu_resource) == (prefix, "nvidia.com/gpu")
    agent = agent_pod(rendered["gpu-classes"])["containers"][0]
    assert {e["name"]: e.get("value") for e in agent["env"]}["DSAGENT_ROCE_CLASSES"] == "subnet"


def test_the_agents_grace_period_covers_its_stripe_hand_off(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from dsagent.cache.settings import Settings
    from dsagent.nodeagent.serve import STOP_DEADLINE

    for values, grace in (({}, 570), ({"agent": {"stripeHandoffSeconds": 120}}, 120)):
        pod = agent_pod(render(values) if values else rendered["default"])
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
        settings = Settings.model_validate(
            {
                "stripe_handoff_grace": env["DSAGENT_STRIPE_HANDOFF_GRACE"],
                "stripe_handoff_idle": env["DSAGENT_STRIPE_HANDOFF_IDLE"],
            }
        )
        assert (settings.stripe_handoff_grace, settings.stripe_handoff_idle) == (
            grace,
            30,
        )  # idle: the controller's resync
        assert pod["terminationGracePeriodSeconds"] == grace + 30 > grace + STOP_DEADLINE
    assert agent_pod(render({"agent": {"stripeHandoffSeconds": 0}}))["terminationGracePeriodSeconds"] == 30


def test_the_agents_on_demand_retry_is_the_charts_value(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from dsagent.cache.settings import Settings

    for values, seconds in (({}, 30.0), ({"agent": {"stripeOnDemandRetry": "2m"}}, 120.0)):
        pod = agent_pod(render(values) if values else rendered["default"])
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
        retry = Settings.model_validate({"stripe_on_demand_retry": env["DSAGENT_STRIPE_ON_DEMAND_RETRY"]})
        assert retry.stripe_on_demand_retry == seconds


def test_the_webhook_ca_bundle_is_the_ca_of_its_serving_secret(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    secret = find(docs, "Secret", "-webhook-tls")
    [hook] = find(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    for key in ("ca.crt", "tls.crt"):
        assert base64.b64decode(secret["data"][key]).startswith(b"-----BEGIN CERTIFICATE-----")
    assert b"PRIVATE KEY" in base64.b64decode(secret["data"]["tls.key"])


def test_the_webhook_injection_config_follows_the_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    default = json.loads(find(rendered["default"], "ConfigMap", "-webhook")["data"]["injection.json"])
    custom = json.loads(find(rendered["non-default"], "ConfigMap", "-webhook")["data"]["injection.json"])
    assert default["schedulerName"] == "dsplatform-scheduler"
    assert default["socketDir"] == "/run/dsagent" and default["cacheDir"] == "/var/lib/dsagent"
    assert custom["schedulerName"] == "data-aware"
    assert custom["datasetsMountPath"] == "/data"
    assert custom["cacheDir"] == "/nvme/dsagent" and custom["runAsGroup"] == 1001
    assert custom["image"] == "registry.example.com/ml/dsplatform:0.1.0-rc1"


def test_without_the_scheduler_the_webhook_leaves_scheduler_names_alone() -> None:
    docs = render({"scheduler": {"enabled": False}})
    assert json.loads(find(docs, "ConfigMap", "-webhook")["data"]["injection.json"])["schedulerName"] == ""


def test_components_can_be_switched_off(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["agent-only"]
    assert kinds(docs) == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Secret",
        "NetworkPolicy",
        "CSIDriver",
        "ValidatingAdmissionPolicy",  # the agent's node restriction (test_chart_security.py)
        "ValidatingAdmissionPolicyBinding",
        "Pod",  # `helm test` hooks (test_chart_helm_test.py): the check pod, the agents' Service
        "Service",
        "Job",  # the pre-delete hook handing the nodes back to NVIDIA's device plugin
    }


def ingress(policy: dict[str, Any]) -> list[dict[str, Any]]:
    """A NetworkPolicy's ingress rules but the `helm test` pod's (test_chart_helm_test.py)."""
    return [
        rule
        for rule in policy["spec"]["ingress"]
        if not any(
            p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "test"
            for p in rule["from"]
        )
    ]


def test_only_the_probes_and_named_scrapers_reach_the_agents_tcp_port(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    default = find(rendered["default"], "NetworkPolicy")
    [controller] = ingress(default)  # only the Dataset controller (warm-up, cleanup)
    assert controller["from"] == [
        {
            "podSelector": {
                "matchLabels": find(rendered["default"], "Deployment", "-controller")["spec"]["selector"]["matchLabels"]
            }
        }
    ]
    assert ingress(find(rendered["agent-only"], "NetworkPolicy")) == []
    rule, _ = ingress(find(rendered["non-default"], "NetworkPolicy"))
    assert rule["ports"] == [{"port": 7420, "protocol": "TCP"}]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring"


# -- the Dataset CRD


def dataset_schema(docs: list[dict[str, Any]]) -> dict[str, Any]:
    crd = find(docs, "CustomResourceDefinition", "datasets.dsagent.io")
    [version] = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_the_dataset_crd_has_a_status_subresource_and_is_kept_on_uninstall(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    crd = find(rendered["default"], "CustomResourceDefinition", "datasets.dsagent.io")
    assert crd["metadata"]["name"] == "datasets.dsagent.io"
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    other = find(rendered["non-default"], "CustomResourceDefinition", "datasets.dsagent.io")
    assert "annotations" not in other["metadata"]


def test_datasets_validate_against_the_crd_schema(rendered: dict[str, list[dict[str, Any]]]) -> None:
    schema = dataset_schema(rendered["default"])
    good = make_dataset(
        "imagenet",
        bundles="s3://b/bundles",
        status={
            "digest": "0" * 32,
            "files": 1281167,
            "bytes": 150 << 30,
            "bundles": 26,
            "packedTime": "2026-11-21T10:00:00Z",
            "readyNodes": ["gpu-1"],
        },
    )
    good["spec"]["storageSecretRef"] = {"name": "s3-creds"}
    jsonschema.validate(good, schema)
    for bad in (
        {"spec": {}},
        {"spec": {"source": ""}},
        {"spec": {"source": "s3://x"}, "status": {"digest": "not-hex"}},
        {"spec": {"source": "s3://x", "pack": {"level": 99}}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**make_dataset("x"), **bad}, schema)


def test_nodecaches_are_cluster_scoped_bounded_and_validate_against_the_crd_schema(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """What the agent writes fits the NodeCache CRD; a field over its budget does not
    (dsplatform/wire/nodecache.py)."""
    from dsplatform.wire import nodecache
    from tools.support.fake_apiserver import make_nodecache

    crd = find(rendered["default"], "CustomResourceDefinition", "nodecaches.dsagent.io")
    assert crd["spec"]["scope"] == "Cluster" and crd["spec"]["group"] == nodecache.GROUP
    assert crd["spec"]["names"]["kind"] == nodecache.KIND and crd["spec"]["names"]["plural"] == nodecache.PLURAL
    [version] = crd["spec"]["versions"]
    assert version["name"] == nodecache.API_VERSION and "subresources" not in version
    schema = version["schema"]["openAPIV3Schema"]
    status = schema["properties"]["status"]["properties"]
    assert status["inventory"]["maxLength"] == nodecache.INVENTORY_MAX_BYTES
    assert status["topology"]["maxLength"] == nodecache.TOPOLOGY_MAX_BYTES
    good = make_nodecache("gpu-1", inventory='{"datasets":{}}', topology='{"version":1}', node_uid="u-1")
    jsonschema.validate(good, schema)
    too_big = make_nodecache("gpu-1")
    too_big["status"]["inventory"] = "x" * (nodecache.INVENTORY_MAX_BYTES + 1)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(too_big, schema)
    assert "CustomResourceDefinition" not in kinds(render({"crds": {"install": False}}))


@pytest.mark.usefixtures("cached_schemas")
def test_strict_validation_catches_an_unknown_field(rendered: dict[str, list[dict[str, Any]]]) -> None:
    daemonset = json.loads(json.dumps(find(rendered["default"], "DaemonSet", "-agent")))
    daemonset["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(daemonset, KUBE_VERSIONS[-1], strict=True)


# -- the CSI node plugin (docs/design.md#csi)


def test_the_csidriver_serves_ephemeral_inline_volumes_with_pod_info(rendered: dict[str, list[dict[str, Any]]]) -> None:
    driver = find(rendered["default"], "CSIDriver")
    assert driver["metadata"]["name"] == "datasets.dsagent.io"
    assert driver["spec"]["volumeLifecycleModes"] == ["Ephemeral"]
    assert driver["spec"]["podInfoOnMount"] is True and driver["spec"]["attachRequired"] is False
    assert find(rendered["non-default"], "CSIDriver")["metadata"]["name"] == "data.example.com"
    assert "CSIDriver" not in kinds(rendered["no-csi"])


def test_the_registrar_sidecar_registers_the_agents_socket_in_the_kubelet_plugin_dirs(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for label, kubelet, driver, image in (
        (
            "default",
            "/var/lib/kubelet",
            "datasets.dsagent.io",
            "registry.k8s.io/sig-storage/csi-node-driver-registrar:",
        ),
        ("non-default", "/data/kubelet", "data.example.com", "mirror.example.com/csi-node-driver-registrar:v2.12.0"),
    ):
        pod = agent_pod(rendered[label])
        [registrar] = [c for c in pod["containers"] if c["name"] == "csi-node-driver-registrar"]
        assert registrar["image"].startswith(image)
        assert f"--kubelet-registration-path={kubelet}/plugins/{driver}/csi.sock" in registrar["args"]
        assert "--csi-address=/csi/csi.sock" in registrar["args"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["csi-plugin-dir"]["hostPath"]["path"] == f"{kubelet}/plugins/{driver}"
        assert volumes["csi-registration-dir"]["hostPath"]["path"] == f"{kubelet}/plugins_registry"
        agent = agent_container(rendered[label])
        mounts = {m["name"]: m for m in agent["volumeMounts"]}
        assert mounts["kubelet-pods"] == {
            "name": "kubelet-pods",
            "mountPath": f"{kubelet}/pods",
            "mountPropagation": "Bidirectional",
        }
        assert agent["securityContext"]["privileged"] is True  # Bidirectional needs it
        env = {e["name"]: e.get("value") for e in agent["env"]}
        assert env["DSAGENT_CSI_SOCKET"] == "/csi/csi.sock" and env["DSAGENT_CSI_KUBELET_PODS_DIR"] == f"{kubelet}/pods"
        assert env["DSAGENT_CSI_DRIVER_NAME"] == driver
        settings.Settings.from_env({k: v for k, v in env.items() if v is not None and k != "DSAGENT_ADMIN_TOKEN_FILE"})
        injection = json.loads(find(rendered[label], "ConfigMap", "-webhook")["data"]["injection.json"])
        assert injection["volumeMode"] == "csi" and injection["csiDriver"] == driver
    assert (
        json.loads(find(rendered["no-csi"], "ConfigMap", "-webhook")["data"]["injection.json"])["volumeMode"]
        == "hostPath"
    )


def test_the_charts_own_workloads_but_the_node_agent_pass_pod_security_restricted(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    from tests.podsecurity import violations

    checked = 0
    for label, doc in all_objects(rendered):
        if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet") and not doc["metadata"]["name"].endswith("-agent"):
            assert violations(doc["spec"]["template"]) == [], (label, doc["metadata"]["name"])
            checked += 1
    assert checked >= 3
    # the agent is the one privileged part (its namespace needs the privileged level) ...
    assert violations(find(rendered["default"], "DaemonSet", "-agent")["spec"]["template"])
    # ... and what the webhook injects into user pods keeps them restricted
    # (tests/dsagent/webhook/test_mutation_csi.py)


# -- production: disruption budgets, spreading, probes, digest, discovery, monitoring

DEPLOYMENTS = ("extender", "webhook", "scheduler", "controller")


def test_every_deployment_with_more_than_one_replica_has_a_pdb_selecting_its_pods(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for label, expected in (("default", 1), ("production", "50%")):
        docs = rendered[label]
        for component in DEPLOYMENTS:
            deployment = find(docs, "Deployment", f"-{component}")
            pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"].endswith(component)]
            if deployment["spec"]["replicas"] == 1:  # a one-replica PDB protects nothing
                assert pdbs == [], (label, component)
                continue
            [pdb] = pdbs
            pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert pdb["spec"]["maxUnavailable"] == expected
            assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "PodDisruptionBudget" not in kinds(rendered["agent-only"])
    pdbs = [d["metadata"]["name"] for d in rendered["default"] if d["kind"] == "PodDisruptionBudget"]
    assert not [name for name in pdbs if "scheduler" in name], pdbs


def test_every_container_has_resources(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for label, docs in rendered.items():
        for doc in docs:
            spec = doc.get("spec", {}).get("template", {}).get("spec")
            if spec is None:
                continue
            for c in spec.get("initContainers", []) + spec["containers"]:
                assert c.get("resources", {}).get("requests"), (label, doc["metadata"]["name"], c["name"])


def test_a_service_monitor_without_a_way_through_the_network_policy_fails_the_render() -> None:
    with pytest.raises(Exception, match="agent.networkPolicy.metricsFrom"):
        render({"metrics": {"serviceMonitor": {"enabled": True}}})
    render({"metrics": {"serviceMonitor": {"enabled": True}}, "agent": {"networkPolicy": {"enabled": False}}})


def test_the_notes_say_which_pod_security_level_each_mode_needs() -> None:
    def notes(values: dict[str, Any]) -> str:
        out = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        return " ".join(text for path, text in out.items() if path.endswith("NOTES.txt")).replace("\n", " ")

    default = notes({})
    assert '"privileged"' in default and "hostPID" in default
    assert "pod-security.kubernetes.io/enforce=privileged" in default
    no_csi = notes({"csi": {"enabled": False}})
    assert '"privileged"' in no_csi and "hostPID" not in no_csi
    assert '"restricted"' in notes({"agent": {"enabled": False}, "csi": {"enabled": False}})
    # the device plugin's default: which nodes, the hand-over, how to see which node and why
    assert "two or more NUMA groups" in default and "nvidia.com/gpu.deploy.device-plugin=false" in default
    assert "DSAGENT_PLUGIN:.metadata.labels.dsagent\\.io/device-plugin" in default and "pre-delete hook" in default
    assert "device plugin" not in notes({"agent": {"devicePlugin": {"enabled": False}}})
    # the fetch links: which NICs each node took, or why none
    assert 'LINKS:.status.conditions[?(@.type=="DsplatformFetchLinks")].message' in default
    assert "DsplatformFetchLinks" not in notes({"agent": {"fetchLinks": ""}})


def test_replicas_spread_over_nodes_and_zones_and_repel_each_other(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for component in DEPLOYMENTS:
        pod = find(rendered["default"], "Deployment", f"-{component}")["spec"]["template"]
        keys = [c["topologyKey"] for c in pod["spec"]["topologySpreadConstraints"]]
        assert keys == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
        for constraint in pod["spec"]["topologySpreadConstraints"]:
            assert constraint["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        [term] = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        hard = find(rendered["production"], "Deployment", f"-{component}")["spec"]["template"]["spec"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" in hard["affinity"]["podAntiAffinity"]
    own = render(
        {
            "extender": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
                            ]
                        }
                    }
                }
            }
        }
    )
    assert set(find(own, "Deployment", "-extender")["spec"]["template"]["spec"]["affinity"]) == {"nodeAffinity"}


def test_every_long_running_container_has_a_startup_probe(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    pods = [find(docs, "Deployment", f"-{c}")["spec"]["template"]["spec"] for c in DEPLOYMENTS] + [agent_pod(docs)]
    for pod in pods:
        for container in pod["containers"]:
            probe = container["startupProbe"]
            assert probe["httpGet"]["path"] == "/healthz" and probe["failureThreshold"] * probe["periodSeconds"] >= 60
            assert "initialDelaySeconds" not in container["livenessProbe"]


def test_an_image_digest_overrides_the_tag_everywhere(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["production"]
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"] + d["spec"]["template"]["spec"].get("initContainers", [])
    }
    ours = {i for i in images if "kube-scheduler" not in i and "csi-node-driver-registrar" not in i}  # upstream images
    assert ours == {f"registry.example.com/ml/dsplatform@{DIGEST}"}
    assert json.loads(find(docs, "ConfigMap", "-webhook")["data"]["injection.json"])["image"].endswith(DIGEST)
    env = {
        e["name"]: e.get("value")
        for e in find(docs, "Deployment", "-controller")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["DSAGENT_CONTROLLER_PACK_IMAGE"].endswith(DIGEST)
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(str(CHART)).validate_schema({"image": {"digest": "latest"}})


def test_topology_discovery_gets_the_hosts_sys_and_optionally_its_network(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    default, production = agent_pod(rendered["default"]), agent_pod(rendered["production"])
    assert "hostNetwork" not in default
    assert production["hostNetwork"] is True and production["dnsPolicy"] == "ClusterFirstWithHostNet"
    volumes = {v["name"]: v for v in default["volumes"]}
    assert volumes["host-sys"]["hostPath"] == {"path": "/sys", "type": "Directory"}
    container = agent_container(rendered["default"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "host-sys")
    # writable: VF creation (agent.devicePlugin.vfSetup: auto) writes sriov_numvfs
    assert mount == {"name": "host-sys", "mountPath": "/host/sys", "readOnly": False}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DSAGENT_SYSFS_ROOT"] == "/host"
    assert settings.Settings.from_env(
        {k: v for k, v in env.items() if v is not None and k != "DSAGENT_ADMIN_TOKEN_FILE"}
    ).sysfs_root == Path("/host")
    env = {e["name"]: e.get("value") for e in agent_container(rendered["production"])["env"]}
    assert env["DSAGENT_RESERVE"] == "20%"


def test_the_service_monitor_scrapes_every_component_by_a_port_it_has(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["production"]
    monitor = find(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert set(monitor["spec"]) == {"namespaceSelector", "selector", "endpoints"}
    http, https = monitor["spec"]["endpoints"]
    assert http == {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    # the webhook (its admissions by outcome) over HTTPS, verified against its own CA
    webhook = find(docs, "Service", "-webhook")
    secret = find(docs, "Secret", "-webhook-tls")
    assert https["port"] == "https" and https["scheme"] == "https" and https["path"] == "/metrics"
    assert https["tlsConfig"]["ca"]["secret"] == {"name": secret["metadata"]["name"], "key": "ca.crt"}
    assert https["tlsConfig"]["serverName"] == f"{webhook['metadata']['name']}.{NAMESPACE}.svc"
    assert "insecureSkipVerify" not in https["tlsConfig"]
    selected = []
    for service in (d for d in docs if d["kind"] == "Service"):
        labels = service["metadata"]["labels"]
        if all(labels.get(e["key"]) in e["values"] for e in monitor["spec"]["selector"]["matchExpressions"]):
            selected.append(labels["app.kubernetes.io/component"])
            assert {p["name"] for p in service["spec"]["ports"]} & {"http", "https"}
    assert sorted(selected) == ["agent", "controller", "extender", "webhook"]
    assert "ServiceMonitor" not in kinds(rendered["default"])


def test_the_grafana_dashboard_configmap_carries_the_sidecar_label_and_valid_json(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    config = find(rendered["production"], "ConfigMap", "-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1" and config["metadata"]["namespace"] == "monitoring"
    dashboard = json.loads(config["data"]["dsplatform.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for metric in (
        "dsplatform_agent_dataset_requests_total",
        "dsplatform_agent_cache_hits_total",
        "dsplatform_agent_fetch_duration_seconds_bucket",
        "dsplatform_agent_evictions_total",
        "dsplatform_extender_request_duration_seconds_bucket",
        "dsplatform_agent_http_request_duration_seconds_bucket",
        "dsplatform_agent_store_request_duration_seconds_bucket",
        "dsplatform_agent_store_errors_total",
        "dsplatform_webhook_admissions_total",
        "dsplatform_agent_stripe_reader_bytes_total",
    ):
        assert metric in exprs, metric
    reference = (CHART.parents[1] / "docs" / "reference" / "metrics.md").read_text()
    named = set(re.findall(r"\b(dsplatform_[a-z_]+?)(?:_bucket)?\b[{\[]", exprs))
    assert named and all(f"`{metric}`" in reference for metric in named), named  # each a metric the code exports
    assert not [
        d for d in rendered["default"] if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]


def test_the_controller_is_least_privilege_and_leads_by_its_own_lease(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["default"]
    assert rules_of(docs, "-controller") == {
        ("", "nodes", "list"),
        ("", "nodes", "watch"),  # kept by list+watch, not listed every pass (controller.watchNodes)
        ("dsagent.io", "nodecaches", "list"),  # the nodes' inventories (docs/design.md#node-state)
        ("dsagent.io", "nodecaches", "watch"),
        ("", "pods", "list"),  # replication's demand, next-job preparation
        ("", "pods", "watch"),  # kept by list+watch once a pass reads them all (controller.watchPods)
        ("", "pods", "patch"),  # the plan loop pins a gated worker and lifts its gate (docs/design.md#deadline-plans)
        ("", "pods/eviction", "create"),  # the plan loop: a worker pinned to a node that is gone
        ("dsagent.io", "datasets", "list"),
        ("dsagent.io", "datasets/status", "patch"),
        ("events.k8s.io", "events", "create"),  # a refusal told the Dataset's owner (docs/operator-guide/tenancy.md)
        ("events.k8s.io", "events", "patch"),  # the same refusal again: its Event's count
    }
    role = find(docs, "Role", "-controller")
    deployment = find(docs, "Deployment", "-controller")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert any(r.get("resourceNames") == [env["DSAGENT_CONTROLLER_LEASE"]] for r in role["rules"])
    assert rules_of(docs, "-pack") == {
        ("dsagent.io", "datasets", "get"),
        ("dsagent.io", "datasets", "create"),
        ("dsagent.io", "datasets/status", "patch"),
    }
    assert env["DSAGENT_CONTROLLER_PACK_SERVICE_ACCOUNT"] == find(docs, "ServiceAccount", "-pack")["metadata"]["name"]
    agent_labels = agent_pod(docs)  # the selector finds the agent pods
    selector = dict(kv_.split("=") for kv_ in env["DSAGENT_CONTROLLER_AGENT_SELECTOR"].split(","))
    assert selector.items() <= find(docs, "DaemonSet", "-agent")["spec"]["template"]["metadata"]["labels"].items()
    assert agent_labels
    from dsagent.controller.controllersettings import ControllerSettings

    # the admin token file is the pod's mounted Secret, not on this machine
    settings = ControllerSettings.from_env({k: v for k, v in env.items() if v is not None and "TOKEN" not in k})
    assert settings.resync_s == 30 and settings.metrics_port == 8080 and settings.watch_nodes and settings.watch_pods
    listing = render({"controller": {"watchNodes": False, "watchPods": False}})  # listed every pass: no watch granted
    assert {r for r in rules_of(listing, "-controller") if r[2] == "watch"} == set()
    env_off = {
        e["name"]: e.get("value")
        for e in find(listing, "Deployment", "-controller")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    off = ControllerSettings.from_env({k: v for k, v in env_off.items() if v is not None and "TOKEN" not in k})
    assert not off.watch_nodes and not off.watch_pods
    production = rendered["production"]
    assert "-pack" not in {d["metadata"]["name"][-5:] for d in production if d["kind"] == "ServiceAccount"}


def test_kubectl_get_datasets_shows_ready_nodes_and_the_packed_digest(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    crd = find(rendered["default"], "CustomResourceDefinition", "datasets.dsagent.io")
    columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Ready"] == ".status.readyNodeCount" and columns["Digest"] == ".status.digest"
    schema = dataset_schema(rendered["default"])
    ds = make_dataset(
        "imagenet",
        bundles="s3://b/x",
        status={
            "digest": "0" * 32,
            "readyNodes": ["a"],
            "readyNodeCount": 1,
            "pack": {"state": "Running"},
            "warm": {"state": "Ready"},
        },
    )
    ds["spec"]["pack"] = {"auto": True}
    ds["spec"]["warm"] = {"nodes": 3, "nodeSelector": {"pool": "a100"}, "startTime": "2026-12-01T00:00:00Z"}
    jsonschema.validate(ds, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**ds, "spec": {**ds["spec"], "warm": {"nodes": -1}}}, schema)


def test_the_scheduler_image_follows_the_cluster_version_and_every_image_takes_a_digest() -> None:
    """The SDK renders for its own default cluster version (it takes no --kube-version):
    the scheduler's tag is that version, not a fixed one (v1.31.4 on any cluster)."""

    def images(values: dict[str, Any]) -> list[str]:
        out = []
        for doc in render(values):
            # the `helm test` Pod too (every image takes a digest)
            pod = doc["spec"] if doc["kind"] == "Pod" else doc.get("spec", {}).get("template", {}).get("spec", {})
            out += [c["image"] for c in pod.get("containers", []) + pod.get("initContainers", [])]
        return out

    [scheduler] = [i for i in images({}) if "kube-scheduler" in i]
    version = scheduler.rpartition(":")[2]
    assert re.fullmatch(r"v1\.(\d+)\.\d+", version) and int(version.split(".")[1]) >= 29, scheduler
    [fixed] = [i for i in images({"scheduler": {"image": {"tag": "v1.29.3"}}}) if "kube-scheduler" in i]
    assert fixed == "registry.k8s.io/kube-scheduler:v1.29.3"
    pinned = {
        "image": {"digest": DIGEST},
        "scheduler": {"image": {"digest": DIGEST}},
        "csi": {"registrar": {"image": {"digest": DIGEST}}},
    }
    got = images(pinned)
    assert len(got) > 5 and all(i.endswith("@" + DIGEST) for i in got), got
