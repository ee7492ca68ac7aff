"""KServe's controller on the cluster: its CRDs, its configuration and its webhooks, from KServe's own module.

Everything is read from KServe's module source at the pinned version (the one its manager is built from), so
the CRDs, the ``inferenceservice-config`` ConfigMap and the webhook rules are exactly KServe's. Three things are
changed for a cluster without Knative, Istio, an ingress controller or a Service in front of the manager: the
default deployment mode is ``Standard`` (RawDeployment); the ingress domain is KServe's cluster-local one, with a
domain template that makes an InferenceService's ``status.url`` its predictor Service's name
(``http://<name>-predictor.<namespace>.svc.cluster.local``; KServe then creates no Ingress); and every webhook is
called at ``https://127.0.0.1:<port>`` with a certificate made here instead of through KServe's webhook Service.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from clef_cluster import pki
from clef_cluster.build import kserve_source

NAMESPACE = "kserve"
CONFIGMAP = "inferenceservice-config"
CRD_FILES = (
    "serving.kserve.io_inferenceservices.yaml",
    "serving.kserve.io_servingruntimes.yaml",
    "serving.kserve.io_clusterservingruntimes.yaml",
    "serving.kserve.io_inferencegraphs.yaml",
    "serving.kserve.io_trainedmodels.yaml",
    "clusterstoragecontainer/serving.kserve.io_clusterstoragecontainers.yaml",
)
DEPLOYMENT_MODE = "Standard"
INGRESS_DOMAIN = "svc.cluster.local"  # KServe's cluster-local domain: no Ingress is created
DOMAIN_TEMPLATE = "{{ .Name }}-predictor.{{ .Namespace }}.{{ .IngressDomain }}"  # the predictor Service's name


def crds() -> list[dict[str, Any]]:
    """KServe's CustomResourceDefinitions for InferenceServices, runtimes, graphs, trained models, storage."""
    folder = kserve_source() / "config" / "crd" / "full"
    return [yaml.safe_load((folder / name).read_text()) for name in CRD_FILES]


def config_map() -> dict[str, Any]:
    """KServe's ``inferenceservice-config`` with the Standard (RawDeployment) deployment mode as default and
    ``status.url`` the predictor Service's cluster-local name."""
    config = yaml.safe_load((kserve_source() / "config" / "configmap" / "inferenceservice.yaml").read_text())
    config["metadata"] = {"name": CONFIGMAP, "namespace": NAMESPACE}
    config["data"]["deploy"] = json.dumps({"defaultDeploymentMode": DEPLOYMENT_MODE})
    ingress = json.loads(config["data"]["ingress"])
    config["data"]["ingress"] = json.dumps(
        {**ingress, "ingressDomain": INGRESS_DOMAIN, "domainTemplate": DOMAIN_TEMPLATE}
    )
    return config


def namespace_objects() -> list[dict[str, Any]]:
    """KServe's namespace and its ``inferenceservice-config`` ConfigMap (applied after the CRDs)."""
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, config_map()]


def write_webhook_certs(tmp: Path, authority: pki.Authority) -> Path:
    """Write the webhook's serving certificate where controller-runtime's webhook server reads it
    (``$TMPDIR/k8s-webhook-server/serving-certs/tls.{crt,key}``); return ``tmp``, the manager's TMPDIR."""
    certs = tmp / "k8s-webhook-server" / "serving-certs"
    certs.mkdir(parents=True, exist_ok=True)
    pair = authority.serving("kserve-webhook")
    (certs / "tls.crt").write_bytes(pair.cert.read_bytes())
    (certs / "tls.key").write_bytes(pair.key.read_bytes())
    (certs / "tls.key").chmod(0o600)
    return tmp


def webhook_configurations(port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """KServe's webhook configurations, each webhook called at https://127.0.0.1:<port><its path>."""
    source = kserve_source() / "config" / "webhook" / "manifests.yaml"
    configurations = [doc for doc in yaml.safe_load_all(source.read_text()) if doc]
    bundle = base64.b64encode(ca_bundle).decode()
    for configuration in configurations:
        configuration["metadata"].pop("creationTimestamp", None)
        for webhook in configuration["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
    return configurations
