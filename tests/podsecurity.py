"""The Pod Security Standards, ``baseline`` and ``restricted`` profiles (latest), as a check.

A test helper: :func:`violations` returns what the Pod Security admission controller
would refuse in a pod spec at the given level, one line per broken rule, so tests can
check a mutated pod (and the chart's workloads) against the policy without an API
server. The rules are those of the published standard (Kubernetes docs, "Pod Security
Standards"); Windows-only and AppArmor-annotation subtleties are reduced to what a Linux
pod can carry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
VOLUME_SOURCES = RESTRICTED_VOLUMES | {
    "hostPath",
    "nfs",
    "iscsi",
    "rbd",
    "cephfs",
    "glusterfs",
    "flexVolume",
    "gitRepo",
    "awsElasticBlockStore",
    "gcePersistentDisk",
    "azureDisk",
    "azureFile",
    "cinder",
    "fc",
    "flocker",
    "portworxVolume",
    "quobyte",
    "scaleIO",
    "storageos",
    "vsphereVolume",
    "photonPersistentDisk",
    "image",
}


def containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(kind) or []:
            yield f"{kind}[{container.get('name')}]", container


def violations(pod: Mapping[str, Any], level: str = "restricted") -> list[str]:
    """What breaks ``level`` (``baseline`` or ``restricted``) in ``pod`` (a Pod or a pod template)."""
    assert level in ("baseline", "restricted")
    spec: Mapping[str, Any] = pod.get("spec") or {}
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    pod_sc: Mapping[str, Any] = spec.get("securityContext") or {}
    found: list[str] = []

    # -- baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"host namespaces: {key}")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        found.append("hostProcess")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            found.append(f"hostPath volume {volume.get('name')}")
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            found.append(f"AppArmor annotation {key}={value}")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"unsafe sysctl {sysctl.get('name')}")
    contexts: list[tuple[str, Mapping[str, Any]]] = [("pod", pod_sc)]
    for where, container in containers(spec):
        sc: Mapping[str, Any] = container.get("securityContext") or {}
        contexts.append((where, sc))
        if sc.get("privileged"):
            found.append(f"{where}: privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"{where}: hostProcess")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            found.append(f"{where}: adds capabilities {sorted(added - BASELINE_CAPABILITIES)}")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"{where}: hostPort {port['hostPort']}")
        if sc.get("procMount") not in (None, "Default"):
            found.append(f"{where}: procMount {sc['procMount']}")
    for where, sc in contexts:
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            found.append(f"{where}: seLinuxOptions {dict(se)}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"{where}: seccomp Unconfined")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            found.append(f"{where}: AppArmor Unconfined")
    if level == "baseline":
        return found

    # -- restricted
    for volume in spec.get("volumes") or []:
        kinds = set(volume) & VOLUME_SOURCES
        if not kinds <= RESTRICTED_VOLUMES or not kinds:
            found.append(f"volume {volume.get('name')} of type {sorted(set(volume) - {'name'})}")
    pod_nonroot = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    if pod_sc.get("runAsUser") == 0:
        found.append("pod: runAsUser 0")
    if pod_sc.get("runAsNonRoot") is False:
        found.append("pod: runAsNonRoot false")
    for where, container in containers(spec):
        sc = container.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation must be false")
        nonroot = sc.get("runAsNonRoot")
        if nonroot is False or (nonroot is None and not pod_nonroot):
            found.append(f"{where}: runAsNonRoot must be true")
        if sc.get("runAsUser") == 0:
            found.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if not (seccomp in ("RuntimeDefault", "Localhost") or (seccomp is None and pod_seccomp)):
            found.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"{where}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{where}: may add only NET_BIND_SERVICE")
    return found


__all__ = ["violations"]
