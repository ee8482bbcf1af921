"""The Helm chart rendered by a real Helm engine (Helm v4's Go SDK through helm-python-sdk's
libhelm_c): every object valid for a current Kubernetes release, CRDs equal to `datacache crds`,
RBAC without Secret reads, the webhook's certificate matching its caBundle."""

from __future__ import annotations

import base64
import os

import helm_python as helm
import pytest
import yaml
from cryptography import x509

from datacache.api.crds import crds
from operator_schemas import validate

CHART = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "charts", "datacache")


def _render(values):
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name="dc", namespace="datacache-system")
    return [doc for text in files.values() for doc in yaml.safe_load_all(text) if doc]


def test_chart_crds_are_the_generated_ones():
    with open(os.path.join(CHART, "crds", "datacache-crds.yaml"), encoding="utf-8") as f:
        assert list(yaml.safe_load_all(f)) == crds()  # regenerate: datacache crds > charts/datacache/crds/datacache-crds.yaml


def test_every_rendered_object_is_valid():
    objects = _render({"metrics": {"serviceMonitor": {"enabled": True}},
                       "hpa": {"enabled": True, "runtime": "imagenet"}})
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "Deployment", "HorizontalPodAutoscaler",
                     "MutatingWebhookConfiguration", "Secret", "Service", "ServiceAccount", "ServiceMonitor",
                     "ValidatingWebhookConfiguration"]
    for obj in objects:
        if obj["kind"] != "ServiceMonitor":  # a Prometheus Operator CRD: not in the Kubernetes schemas
            validate(obj)
    hpa = next(o for o in objects if o["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime",
                                             "name": "imagenet"}


def test_rbac_never_reads_secrets():
    roles = [o for o in _render({}) if o["kind"] == "ClusterRole"]
    assert len(roles) == 2
    for role in roles:
        for rule in role["rules"]:
            if "secrets" in rule["resources"] or "*" in rule["resources"]:
                assert rule["verbs"] == ["create"]
            assert "*" not in rule["verbs"]


def test_sync_pods_get_least_privilege_in_their_namespace():
    """The sync pods' ClusterRole: the Dataset's status and the DataLoads, nothing else; the
    operator binds it (RoleBindings: one namespace each) and may bind no other role."""
    objects = _render({"sync": {"volumeSize": "5Gi", "storageClass": "fast-ssd"}})
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    assert roles["dc-datacache-sync"]["rules"] == [
        {"apiGroups": ["datacache.io"], "resources": ["datasets/status"], "verbs": ["get", "patch"]},
        {"apiGroups": ["datacache.io"], "resources": ["dataloads"], "verbs": ["get", "list", "patch"]}]
    operator_rules = roles["dc-datacache"]["rules"]
    assert {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
            "resourceNames": ["dc-datacache-sync"]} in operator_rules
    assert not any("clusterrolebindings" in r["resources"] or "roles" in r["resources"] for r in operator_rules)
    # no ClusterRoleBinding grants the sync role: it only ever applies through a namespace's RoleBinding
    bindings = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert [b["roleRef"]["name"] for b in bindings] == ["dc-datacache"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["DATACACHE_SYNC_CLUSTER_ROLE"], env["DATACACHE_SYNC_VOLUME_SIZE"], env["DATACACHE_SYNC_STORAGE_CLASS"]) == (
        "dc-datacache-sync", "5Gi", "fast-ssd")


def test_webhook_certificate_matches_ca_bundle():
    objects = _render({})
    secret = next(o for o in objects if o["kind"] == "Secret")
    hook = next(o for o in objects if o["kind"] == "MutatingWebhookConfiguration")["webhooks"][0]
    ca = x509.load_pem_x509_certificate(base64.b64decode(hook["clientConfig"]["caBundle"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "dc-datacache-webhook.datacache-system.svc" in names
    assert hook["clientConfig"]["service"]["path"] == "/fuse-sidecar"  # kopf serves a handler at /<id>
    assert hook["objectSelector"]["matchExpressions"] == [{"key": "datacache.io/dataset", "operator": "Exists"}]


def test_hpa_without_runtime_is_one_clear_error():
    with pytest.raises(helm.HelmError) as err:
        _render({"hpa": {"enabled": True}})
    assert "hpa.runtime: set the CacheRuntime's name" in str(err.value)


def test_cluster_domain_reaches_the_operator():
    def domain(values):
        deployment = next(o for o in _render(values) if o["kind"] == "Deployment")
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        return env["DATACACHE_CLUSTER_DOMAIN"]
    assert domain({}) == "cluster.local"
    assert domain({"operator": {"clusterDomain": "corp.example"}}) == "corp.example"
