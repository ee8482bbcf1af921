"""The install without Helm (README: "Without Helm"): ``deploy/kustomize`` is the chart rendered
for release ``dc`` in ``datacache-system`` plus the CRDs, and ``kubectl kustomize`` (offline)
turns it, with the certificate ``make-cert.sh`` makes, into a complete install: CRDs, operator,
RBAC, webhook with a matching caBundle; every object valid (kubernetes-validate, strict).

Regenerate ``deploy/kustomize/datacache.yaml`` after a chart change:
``python tests/operator/test_kustomize.py``."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess

import helm_python as helm
import yaml
from cryptography import x509

from datacache.api.crds import crds
from operator_schemas import validate
from pod_security import level

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUSTOMIZE = os.path.join(ROOT, "deploy", "kustomize")
VALUES = {"webhook": {"existingSecret": "dc-datacache-webhook-cert",
                      # replaced by kustomize with make-cert.sh's CA: a string, so the field keeps its type
                      "caBundle": base64.b64encode(b"(ca.crt from make-cert.sh)").decode()}}


def rendered() -> list[dict]:
    """The CRDs and the chart's objects for ``deploy/kustomize/datacache.yaml`` (templates in
    file-name order)."""
    with helm.Chart.load(os.path.join(ROOT, "charts", "datacache")) as chart:
        files = chart.render(VALUES, name="dc", namespace="datacache-system")
    return [*crds(), *(doc for name in sorted(files) for doc in yaml.safe_load_all(files[name]) if doc)]


def test_kustomize_base_is_the_rendered_chart():
    with open(os.path.join(KUSTOMIZE, "datacache.yaml"), encoding="utf-8") as f:
        assert [d for d in yaml.safe_load_all(f) if d] == rendered()  # regenerate: python tests/operator/test_kustomize.py


def test_kustomize_installs_crds_operator_rbac_and_webhook(tmp_path):
    copy = shutil.copytree(KUSTOMIZE, tmp_path / "kustomize",
                           ignore=shutil.ignore_patterns("*.crt", "*.key"))
    subprocess.run(["sh", str(copy / "make-cert.sh")], check=True, capture_output=True)
    out = subprocess.run(["kubectl", "kustomize", str(copy)], check=True, capture_output=True, text=True).stdout
    objects = [d for d in yaml.safe_load_all(out) if d]
    for obj in objects:
        validate(obj)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["CustomResourceDefinition"] * 8 + [
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "Deployment",
        "Service", "Secret", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
    assert sorted(o["spec"]["names"]["kind"] for o in objects if o["kind"] == "CustomResourceDefinition") == [
        "CacheRuntime", "DataLoad", "DataMigrate", "DataProcess", "Dataset", "JuiceFSRuntime", "ThinRuntime",
        "ThinRuntimeProfile"]
    by_kind = {o["kind"]: o for o in objects}
    namespace, deployment = by_kind["Namespace"], by_kind["Deployment"]
    assert namespace["metadata"]["name"] == deployment["metadata"]["namespace"] == "datacache-system"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"][:2] == ["kopf", "run"]
    assert pod["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"] == "dc-datacache"
    assert by_kind["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "dc-datacache", "namespace": "datacache-system"}]
    # the operator's pod meets the level its namespace enforces
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == level(pod) == "restricted"
    # the webhook: served by the operator with make-cert.sh's certificate, trusted through caBundle
    secret, hook = by_kind["Secret"], by_kind["MutatingWebhookConfiguration"]["webhooks"][0]
    assert (secret["type"], secret["metadata"]["namespace"]) == ("kubernetes.io/tls", "datacache-system")
    assert {"name": "webhook-cert", "secret": {"secretName": secret["metadata"]["name"]}} in pod["volumes"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(hook["clientConfig"]["caBundle"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    service = hook["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in names
    assert by_kind["Service"]["metadata"]["name"] == service["name"]
    flows = by_kind["ValidatingWebhookConfiguration"]["webhooks"][0]  # runAfter checks, same server and CA
    assert flows["clientConfig"]["caBundle"] == hook["clientConfig"]["caBundle"]
    assert flows["clientConfig"]["service"] == {**service, "path": "/flow-run-after"}
    assert not (copy / "ca.key").exists()  # the CA's key is not kept


if __name__ == "__main__":
    with open(os.path.join(KUSTOMIZE, "datacache.yaml"), "w", encoding="utf-8") as f:
        f.write("# Generated by `python tests/operator/test_kustomize.py` from charts/datacache: do not edit.\n")
        yaml.safe_dump_all(rendered(), f, sort_keys=False)
