"""The Kubernetes name rules, written once in dsplatform.names (DNS-1123 label and
subdomain, qualified and resource names), as the API server applies them."""

from __future__ import annotations

import pytest

from dsplatform.names import is_dns_label, is_dns_subdomain, is_qualified_name, is_resource_name

# What every loose copy let through: empty labels, a label ending or starting in '-'.
DOUBLE_DOTS = ["a..b", "a.-b", "a-.b", ".a", "a.", "dsagent..io"]


@pytest.mark.parametrize("value", ["a", "default", "kube-system", "a" * 63, "0abc", "x-1"])
def test_dns_labels(value: str) -> None:
    assert is_dns_label(value)


@pytest.mark.parametrize(
    "value", ["", "a" * 64, "A", "-a", "a-", "a.b", "a_b", "a\n", "\na", "a b", None, 3, *DOUBLE_DOTS]
)
def test_not_dns_labels(value: object) -> None:
    assert not is_dns_label(value)


@pytest.mark.parametrize(
    "value",
    ["a", "dsagent.io", "example.com", "pod-1.web", "a" * 253, ".".join(["a" * 100, "b" * 100]), "0.1.2"],
)
def test_dns_subdomains(value: str) -> None:
    assert is_dns_subdomain(value)


@pytest.mark.parametrize("value", ["", "a" * 254, "Dsagent.io", "a_b.io", "a.b\n", "a/b", None, *DOUBLE_DOTS])
def test_not_dns_subdomains(value: object) -> None:
    assert not is_dns_subdomain(value)


@pytest.mark.parametrize(
    "value", ["gpu", "nvidia.com/gpu", "dsagent.io/gpu-roce1", "a/B_c.d", "example.com/" + "n" * 63, "Gpu"]
)
def test_qualified_names(value: str) -> None:
    assert is_qualified_name(value)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "/gpu",
        "a/b/c",
        "nvidia.com/",
        "nvidia.com/-gpu",
        "nvidia.com/gpu_",
        "Nvidia.com/gpu",
        "example.com/" + "n" * 64,
        "nvidia..com/gpu",
        "a..b/gpu",
        "nvidia.com/gpu\n",
        None,
    ],
)
def test_not_qualified_names(value: object) -> None:
    assert not is_qualified_name(value)


def test_resource_names_have_a_prefix() -> None:
    assert is_resource_name("nvidia.com/gpu")
    assert not is_resource_name("gpu")
    assert not is_resource_name("a..b/gpu")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9", True),
        ("0F1E2D3C-4B5A-6978-8695-A4B3C2D1E0F9", False),  # the API server writes lower case
        ("0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9\n", False),  # '$' let a trailing newline through
        ("0f1e2d3c_4b5a_6978_8695_a4b3c2d1e0f9", False),  # systemd's form is only for cgroup paths
        ("job-1", False),
        (None, False),
    ],
)
def test_pod_uids(value: object, expected: bool) -> None:
    from dsplatform.names import is_pod_uid

    assert is_pod_uid(value) is expected
