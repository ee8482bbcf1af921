"""Operator settings from the environment (set by the Helm chart's Deployment).

``DATACACHE_IMAGE``: the one image for workers, FUSE sidecars and DataLoad Jobs.
``DATACACHE_WORKER_KIND``: ``StatefulSet`` (default) or ``DaemonSet`` (one worker per node).
``DATACACHE_FUSE_DEVICE_RESOURCE``: an extended resource that grants /dev/fuse (a device plugin,
e.g. ``smarter-devices/fuse``); empty: /dev/fuse is mounted as a hostPath char device.
``DATACACHE_WEBHOOK_CERT_DIR``: directory with ``tls.crt``/``tls.key`` for the admission webhook
server (port ``DATACACHE_WEBHOOK_PORT``, default 9443); empty: no webhook server.
``DATACACHE_OPERATOR_RETRY_S``: seconds between looks at a resource that is not ready yet (10).
``DATACACHE_STATUS_INTERVAL_S``: seconds between status refreshes and autoscale evaluations (30).
``DATACACHE_CLUSTER_DOMAIN``: the cluster's DNS domain (``cluster.local``), passed on to every
datacache pod, whose DNS membership asks for ``_http._tcp.<runtime>-worker.<ns>.svc.<domain>``.
``DATACACHE_SYNC_CLUSTER_ROLE``: the ClusterRole (from the chart) that each Dataset's metadata-sync
ServiceAccount is bound to, in its own namespace only (``datacache-sync``).
``DATACACHE_SYNC_VOLUME_SIZE`` / ``DATACACHE_SYNC_STORAGE_CLASS``: size (``1Gi``; a manifest takes
about 100 bytes per file) and StorageClass (empty: the cluster's default) of the PersistentVolumeClaim
keeping each Dataset's previous manifest between syncs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

DEFAULT_IMAGE = "ghcr.io/datacache/datacache:0.1.0"
HOME = "/var/lib/datacache"
"""``$DATACACHE_HOME`` inside every datacache container (an emptyDir)."""
CONFIG_DIR = "/etc/datacache"
"""Where the runtime's ConfigMap (``resources.yaml``) is mounted."""
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$")
WORKER_PORT = 7700
"""Worker port when ``spec.worker.port`` is not set."""


@dataclass(frozen=True)
class Settings:
    """What the operator needs to know beyond the resources themselves."""

    image: str = DEFAULT_IMAGE
    worker_kind: str = "StatefulSet"
    fuse_device_resource: str = ""
    webhook_cert_dir: str = ""
    webhook_port: int = 9443
    retry_s: float = 10.0
    """Seconds before a "not ready yet" resource is looked at again."""
    status_interval_s: float = 30.0
    """Seconds between two status refreshes (and autoscale evaluations) of a runtime."""
    cluster_domain: str = "cluster.local"
    """The cluster's DNS domain (kubelet ``--cluster-domain``)."""
    sync_cluster_role: str = "datacache-sync"
    """ClusterRole granted to metadata-sync pods through a RoleBinding in the Dataset's namespace."""
    sync_volume_size: str = "1Gi"
    """Size of each Dataset's manifest PersistentVolumeClaim (a Kubernetes quantity)."""
    sync_storage_class: str = ""
    """StorageClass of that claim; empty: the cluster's default StorageClass."""

    @classmethod
    def from_env(cls) -> "Settings":
        """Read the settings; raises ``ValueError`` naming the variable when one is wrong."""
        kind = os.environ.get("DATACACHE_WORKER_KIND", "StatefulSet")
        if kind not in ("StatefulSet", "DaemonSet"):
            raise ValueError(f"DATACACHE_WORKER_KIND={kind!r}: use StatefulSet or DaemonSet")
        domain = os.environ.get("DATACACHE_CLUSTER_DOMAIN", "cluster.local").strip(".")
        if not _DOMAIN.match(domain):
            raise ValueError(f"DATACACHE_CLUSTER_DOMAIN={domain!r}: not a DNS domain (e.g. cluster.local); "
                             "set the chart's operator.clusterDomain to the kubelet's --cluster-domain")
        return cls(image=os.environ.get("DATACACHE_IMAGE", DEFAULT_IMAGE), worker_kind=kind,
                   fuse_device_resource=os.environ.get("DATACACHE_FUSE_DEVICE_RESOURCE", ""),
                   webhook_cert_dir=os.environ.get("DATACACHE_WEBHOOK_CERT_DIR", ""),
                   webhook_port=int(os.environ.get("DATACACHE_WEBHOOK_PORT", "9443")),
                   retry_s=float(os.environ.get("DATACACHE_OPERATOR_RETRY_S", "10")),
                   status_interval_s=float(os.environ.get("DATACACHE_STATUS_INTERVAL_S", "30")),
                   cluster_domain=domain,
                   sync_cluster_role=os.environ.get("DATACACHE_SYNC_CLUSTER_ROLE", "datacache-sync"),
                   sync_volume_size=os.environ.get("DATACACHE_SYNC_VOLUME_SIZE", "1Gi"),
                   sync_storage_class=os.environ.get("DATACACHE_SYNC_STORAGE_CLASS", ""))
