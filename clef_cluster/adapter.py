"""prometheus-adapter on the cluster: built from its Go module, serving the custom metrics API from Prometheus.

The adapter runs on the host as the other control-plane processes do, listening on the host's end of the node's link
(where the API server, and only it, calls it). The API server's aggregation layer reaches it through a Service
without selector whose one endpoint is that address (``--enable-aggregator-routing``: the API server calls
endpoints, not Service addresses), over TLS checked against the cluster CA for the Service's name, and passes the
caller's identity in the front-proxy headers the adapter trusts (``--requestheader-client-ca-file``). It checks
callers with the API server's TokenReview and SubjectAccessReview (the HorizontalPodAutoscaler controller's role
may read custom.metrics.k8s.io).

Its one rule exposes the predictor's gauges per pod, and only while the pod reports ``clef_ready == 1``: a pod warming
up or draining counts as a pod without the metric, which the HorizontalPodAutoscaler treats conservatively (as
at the target when scaling down, as 0 when scaling up), instead of as an idle pod that drags the average down.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from clef_cluster import build as building
from clef_cluster.versions import ADAPTER_MODULE, ADAPTER_VERSION, cache_root
from clef_operator.spec import PREDICTOR_GAUGES

NAME = "prometheus-adapter"
NAMESPACE = "monitoring"
SERVICE_PORT = 443
GROUP = "custom.metrics.k8s.io"
# Both versions the adapter serves: the HorizontalPodAutoscaler asks for the preferred one the API server lists.
API_VERSIONS = ("v1beta2", "v1beta1")
RELIST_INTERVAL = "15s"  # how often the adapter re-reads which series exist


def binary() -> Path:
    """The adapter binary for this version and build (built or not)."""
    key = hashlib.sha256(
        f"{ADAPTER_MODULE}@{ADAPTER_VERSION} {building.GO_BUILD} {building.LDFLAGS} {building.go_version()}".encode()
    )
    return cache_root() / f"{NAME}-{ADAPTER_VERSION}-{key.hexdigest()[:12]}" / NAME


def build(log: bool = True) -> Path:
    """Build the adapter from its module once (cached beside the cluster's binaries); its path."""
    target = binary()
    with building._lock(target.parent / "build.lock"):
        if target.is_file():
            return target
        with building._timed(log, NAME):
            source = building.module_source(ADAPTER_MODULE, ADAPTER_VERSION)
            building._go_build(source, ["./cmd/adapter"], target.parent, building.LDFLAGS, rename={"adapter": NAME})
    return target


def config() -> dict[str, Any]:
    """The adapter's rules: each predictor gauge per pod, summed over its label sets, while the pod is ready."""
    gauges = "|".join(PREDICTOR_GAUGES)
    return {
        "rules": [
            {
                "seriesQuery": f'{{__name__=~"{gauges}",namespace!="",pod!=""}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "name": {"matches": "^(.*)$", "as": "${1}"},
                "metricsQuery": "sum by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>} "
                "and on (namespace, pod) (clef_ready{<<.LabelMatchers>>} == 1))",
            }
        ]
    }


def args(
    *,
    bind: str,
    port: int,
    serving: tuple[Path, Path],
    kubeconfig: Path,
    front_proxy_ca: Path,
    prometheus_url: str,
    config_file: Path,
    cert_dir: Path,
) -> list[str]:
    """The adapter's command line."""
    return [
        str(binary()),
        *aggregated_server_args(bind, port, serving, kubeconfig, front_proxy_ca),
        f"--cert-dir={cert_dir}",
        f"--prometheus-url={prometheus_url}",
        f"--config={config_file}",
        f"--metrics-relist-interval={RELIST_INTERVAL}",
    ]


def aggregated_server_args(
    bind: str, port: int, serving: tuple[Path, Path], kubeconfig: Path, front_proxy_ca: Path
) -> list[str]:
    """The flags an aggregated API server on the host takes (Kubernetes' apiserver library, as the adapter and KEDA's
    metrics server use it): it serves on ``bind:port`` with ``serving`` (certificate, key), reads the cluster and
    checks callers through ``kubeconfig``, and trusts the front-proxy CA for the caller's identity."""
    cert, key = serving
    return [
        f"--bind-address={bind}",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--requestheader-client-ca-file={front_proxy_ca}",
    ]


def service_names(name: str = NAME, namespace: str = NAMESPACE) -> tuple[str, ...]:
    """The names the API server checks the serving certificate of the Service ``name`` (the adapter's by default)
    against."""
    return (f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local")


def objects(address: str, port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """The namespace, then the adapter's registration (:func:`registration`) for custom.metrics.k8s.io."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        *registration(NAME, NAMESPACE, GROUP, API_VERSIONS, address, port, ca_bundle),
    ]


def registration(
    name: str, namespace: str, group: str, versions: tuple[str, ...], address: str, port: int, ca_bundle: str
) -> list[dict[str, Any]]:
    """How the aggregation layer reaches an API server running on the host: the selector-less Service ``name``,
    its one endpoint (``address:port``), and an APIService per served version of ``group``, the first version
    preferred (``ca_bundle``: the cluster CA, base64, that signed the server's certificate for the Service's name)."""
    ports = [{"name": "https", "port": SERVICE_PORT, "targetPort": port, "protocol": "TCP"}]
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": ports},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "clef-cluster",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        },
        *(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": f"{version}.{group}"},
                "spec": {
                    "group": group,
                    "version": version,
                    "service": {"name": name, "namespace": namespace, "port": SERVICE_PORT},
                    "caBundle": ca_bundle,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 200 - index * 100,
                },
            }
            for index, version in enumerate(versions)
        ),
    ]
