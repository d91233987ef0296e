"""Dataset names and digests: the one rule, for pack, the agent, the kube code, the CLI and the extender.

A dataset name becomes a directory in bundle stores and in every node's cache, a key in
the node inventory annotation and part of the Dataset resource's spec, so it is held to the
strictest of those places: 1-128 characters from ``A-Z a-z 0-9 . _ -``, starting with a
letter or digit (so never ``.``, ``..`` or a hidden name). A digest is xxh3-128 as 32
lowercase hex characters (``docs/design.md#manifests-and-digests``).

A task id names what holds datasets on a node (a pod's UID, a job id). Its one form is
lower case: ids that differ only in case name the same task, because the permission check
(a pod acts on its own UID only) and the records must agree on which task an id is; without
one form a pod could hold several tasks under case variants of its UID.

Kubernetes object and resource names (``docs/design.md#code-map``), each rule as the API
server applies it (``k8s.io/apimachinery/pkg/util/validation``), so that nothing the agent,
the webhook or the CSI driver accepts is refused by the API server, and nothing it
refuses would be accepted there:

- a **DNS-1123 label** (:func:`is_dns_label`: a namespace, a Multus network name): 1-63
  of ``a-z 0-9 -``, starting and ending with a letter or digit;
- a **DNS-1123 subdomain** (:func:`is_dns_subdomain`: a pod, a ConfigMap, a resource
  prefix such as ``dsagent.io``): at most 253 characters, labels joined by single dots
  (so never ``a..b``, ``a.-b`` or ``.a``); as in Kubernetes, a label inside a subdomain
  is not held to 63 characters;
- a **qualified name** (:func:`is_qualified_name`: ``[<DNS subdomain>/]<name>``, the name
  1-63 of ``A-Z a-z 0-9 - _ .`` starting and ending with a letter or digit) and a
  **resource name** (:func:`is_resource_name`: a qualified name with its prefix, such as
  ``nvidia.com/gpu``; Kubernetes' extended resources are always prefixed).
"""

from __future__ import annotations

import re

NAME_MAX_LENGTH = 128
DIGEST_LENGTH = 32
NAME_HINT = f"use 1-{NAME_MAX_LENGTH} letters, digits, '.', '_' or '-', starting with a letter or digit"
DIGEST_HINT = f"a digest is {DIGEST_LENGTH} lowercase hex characters"

#: compiled here, as every command checks names and digests; the patterns below are
#: compiled on first use (``re``'s cache), so that ``dsctl`` does not compile them at start-up
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX_LENGTH - 1}}}")
_DIGEST = re.compile(rf"[0-9a-f]{{{DIGEST_LENGTH}}}")
TASK_ID_MAX_LENGTH = 253
TASK_ID_HINT = (
    f"use 1-{TASK_ID_MAX_LENGTH} letters, digits, '.', '_', ':' or '-', e.g. a pod UID (case does not matter)"
)
_TASK_ID = rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{TASK_ID_MAX_LENGTH - 1}}}"

DNS_LABEL_MAX_LENGTH = 63
DNS_SUBDOMAIN_MAX_LENGTH = 253
QUALIFIED_NAME_MAX_LENGTH = 63
_LABEL = "[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
_QUALIFIED_PART = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"


def is_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def is_digest(digest: object) -> bool:
    return isinstance(digest, str) and _DIGEST.fullmatch(digest) is not None


def is_dns_label(value: object) -> bool:
    """A DNS-1123 label: 1-63 of ``a-z 0-9 -``, a letter or digit at both ends."""
    return isinstance(value, str) and len(value) <= DNS_LABEL_MAX_LENGTH and re.fullmatch(_LABEL, value) is not None


def is_dns_subdomain(value: object) -> bool:
    """A DNS-1123 subdomain: at most 253 characters, DNS-1123 labels joined by single dots."""
    return (
        isinstance(value, str)
        and len(value) <= DNS_SUBDOMAIN_MAX_LENGTH
        and re.fullmatch(_DNS_SUBDOMAIN, value) is not None
    )


def is_qualified_name(value: object) -> bool:
    """``[<DNS-1123 subdomain>/]<name>``, the name 1-63 of ``A-Z a-z 0-9 - _ .`` with a
    letter or digit at both ends (Kubernetes' label keys and resource names)."""
    if not isinstance(value, str):
        return False
    prefix, slash, name = value.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    return len(name) <= QUALIFIED_NAME_MAX_LENGTH and re.fullmatch(_QUALIFIED_PART, name) is not None


def resource_prefix_problem(prefix: object) -> str | None:
    """Why ``prefix`` cannot prefix the platform's extended resources (``<prefix>/gpu-roce1``),
    or None when it can: it must be a DNS subdomain. One wording for every reader."""
    if is_dns_subdomain(prefix):
        return None
    return f"resource prefix {prefix!r} is not a DNS subdomain (e.g. dsagent.io, example.com)"


def is_resource_name(value: object) -> bool:
    """A qualified name with its DNS prefix (``nvidia.com/gpu``, ``dsagent.io/gpu-roce1``)."""
    return isinstance(value, str) and "/" in value and is_qualified_name(value)


def pod_uid_pattern(separator: str = "-") -> str:
    """The regular expression of a pod UID (RFC 4122 text form, lower case, as the API server
    writes it); ``separator`` is a pattern for the dashes (cgroup paths use ``_`` too)."""
    return separator.join(f"[0-9a-f]{{{n}}}" for n in (8, 4, 4, 4, 12))


POD_UID_PATTERN = pod_uid_pattern()


def is_pod_uid(value: object) -> bool:
    """Whether ``value`` is a pod's UID (``metadata.uid``), exactly."""
    return isinstance(value, str) and re.fullmatch(POD_UID_PATTERN, value) is not None


def canonical_task_id(task_id: object) -> str | None:
    """``task_id`` in its one form (lower case), or None when it is not a task id."""
    if not isinstance(task_id, str) or re.fullmatch(_TASK_ID, task_id) is None:
        return None
    return task_id.lower()


__all__ = [
    "POD_UID_PATTERN",
    "DIGEST_HINT",
    "DNS_LABEL_MAX_LENGTH",
    "DNS_SUBDOMAIN_MAX_LENGTH",
    "DIGEST_LENGTH",
    "NAME_HINT",
    "NAME_MAX_LENGTH",
    "QUALIFIED_NAME_MAX_LENGTH",
    "TASK_ID_HINT",
    "TASK_ID_MAX_LENGTH",
    "canonical_task_id",
    "is_digest",
    "is_dns_label",
    "is_dns_subdomain",
    "is_pod_uid",
    "pod_uid_pattern",
    "resource_prefix_problem",
    "is_name",
    "is_qualified_name",
    "is_resource_name",
]
