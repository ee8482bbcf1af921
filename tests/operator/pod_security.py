"""The Pod Security Standards' checks that datacache's pod specs meet (or not), to tell which Pod
Security Admission level a namespace needs for them. A subset of the checks, written from
https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline: no privileged
container, no hostPath volume, no host namespaces or ports, added capabilities only from the
baseline list; restricted: also only the listed volume types, no privilege escalation, non-root,
a RuntimeDefault/Localhost seccomp profile, every capability dropped but NET_BIND_SERVICE)."""

from __future__ import annotations

from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def baseline_violations(spec: dict[str, Any]) -> list[str]:
    """What in pod spec ``spec`` the baseline level forbids (one line each)."""
    out = [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    out += [f"volume {v['name']}: hostPath" for v in spec.get("volumes") or [] if "hostPath" in v]
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"container {c['name']}: privileged")
        extra = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if extra:
            out.append(f"container {c['name']}: capabilities {sorted(extra)}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"container {c['name']}: hostPort")
    return out


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What in pod spec ``spec`` the restricted level forbids beyond baseline (one line each)."""
    out = []
    for v in spec.get("volumes") or []:
        kind = next(k for k in v if k != "name")
        if kind not in RESTRICTED_VOLUMES and kind != "hostPath":
            out.append(f"volume {v['name']}: {kind}")
    pod = spec.get("securityContext") or {}
    for c in _containers(spec):
        sc = {**pod, **(c.get("securityContext") or {})}
        caps = sc.get("capabilities") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"container {c['name']}: allowPrivilegeEscalation not false")
        if sc.get("runAsNonRoot") is not True or sc.get("runAsUser") == 0:
            out.append(f"container {c['name']}: may run as root")
        if (sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"container {c['name']}: no RuntimeDefault seccomp profile")
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"container {c['name']}: capabilities not dropped")
    return out


def level(spec: dict[str, Any]) -> str:
    """The strictest Pod Security level that admits pod spec ``spec``."""
    if baseline_violations(spec):
        return "privileged"
    return "baseline" if restricted_violations(spec) else "restricted"
