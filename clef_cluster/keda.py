"""KEDA on the cluster: its operator and metrics API server built from KEDA's Go module, run on the host.

Both run on the host as the other control-plane processes do. The operator watches ScaledObjects, makes the
HorizontalPodAutoscaler ``keda-hpa-<name>`` of each, and answers metric requests over gRPC on 127.0.0.1 (its
scalers query the Prometheus URLs the triggers name, such as the metrics pipeline's on 127.0.0.1). The metrics API
server serves external.metrics.k8s.io, asking the operator over that gRPC link; the API server's aggregation layer
reaches it as it reaches prometheus-adapter (clef_cluster.adapter.registration: a selector-less Service whose one
endpoint is the host's end of the node's link). The gRPC link is mutual TLS with certificates from the cluster CA
(KEDA's own certificate generation, ``--enable-cert-rotation``, stays off): the operator serves with a certificate
for 127.0.0.1, the metrics server presents a client certificate, each trusting the cluster CA.

Both talk to the API server as one user of their own (a cluster-CA client certificate), bound to KEDA's own roles
read from the module source: the operator's ClusterRole and Role (config/rbac) and the metrics server's
delegated-authentication bindings (config/metrics-server), whose ServiceAccount subject becomes that user; the
binding that lets the HorizontalPodAutoscaler controller read external metrics is KEDA's as it stands. The CRDs
come from the same source (config/crd/bases).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import yaml

from clef_cluster import adapter
from clef_cluster import build as building
from clef_cluster.pki import Authority
from clef_cluster.versions import KEDA_MODULE, KEDA_VERSION, cache_root

OPERATOR = "keda-operator"
METRICS_SERVER = "keda-metrics-apiserver"
PACKAGES = {"operator": OPERATOR, "adapter": METRICS_SERVER}  # KEDA's ./cmd/<package> -> the binary's name
NAMESPACE = "keda"  # where KEDA keeps its own objects (its Role, leader lease; the Service of its metrics server)
USER = "keda"  # the API server's name for both processes (their client certificate's CN)
SERVICE_ACCOUNT = {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}  # KEDA's own subject
GROUP = "external.metrics.k8s.io"
API_VERSIONS = ("v1beta1",)
LDFLAGS = f"{building.LDFLAGS} -X {KEDA_MODULE}/version.Version={KEDA_VERSION}"
# The module's manifests this cluster applies: the CRDs, then the roles and bindings (see the module doc).
CRD_DIR = "config/crd/bases"
RBAC_FILES = (
    "config/rbac/role.yaml",
    "config/rbac/role_binding.yaml",
    "config/metrics-server/role.yaml",
    "config/metrics-server/role_binding.yaml",
)


def binaries() -> dict[str, Path]:
    """The operator's and the metrics server's binaries for this version and build (built or not), by name."""
    key = hashlib.sha256(f"{KEDA_MODULE}@{KEDA_VERSION} {building.GO_BUILD} {LDFLAGS} {building.go_version()}".encode())
    folder = cache_root() / f"keda-{KEDA_VERSION}-{key.hexdigest()[:12]}"
    return {name: folder / name for name in PACKAGES.values()}


def build(log: bool = True) -> dict[str, Path]:
    """Build both binaries from KEDA's module once (cached beside the cluster's binaries); their paths."""
    targets = binaries()
    folder = next(iter(targets.values())).parent
    with building._lock(folder / "build.lock"):
        if all(path.is_file() for path in targets.values()):
            return targets
        with building._timed(log, "KEDA's operator and metrics server"):
            building._go_build(
                module_source(), [f"./cmd/{package}" for package in PACKAGES], folder, LDFLAGS, rename=PACKAGES
            )
    return targets


def module_source() -> Path:
    """KEDA's module source at the pinned version."""
    return building.module_source(KEDA_MODULE, KEDA_VERSION)


def crds(source: Path) -> list[dict[str, Any]]:
    """KEDA's CustomResourceDefinitions, from the module source."""
    return [doc for path in sorted((source / CRD_DIR).glob("*.yaml")) for doc in _documents(path)]


def rbac(source: Path) -> list[dict[str, Any]]:
    """KEDA's namespace, then its roles and bindings from the module source, each binding to KEDA's
    ServiceAccount made a binding to :data:`USER`."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    objects = [doc for name in RBAC_FILES for doc in _documents(source / name)]
    for binding in (o for o in objects if "subjects" in o):
        binding["subjects"] = [
            {"kind": "User", "name": USER, "apiGroup": "rbac.authorization.k8s.io"}
            if subject == SERVICE_ACCOUNT
            else subject
            for subject in binding["subjects"]
        ]
    return [namespace, *objects]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def write_grpc_certs(folder: Path, authority: Authority) -> tuple[Path, Path]:
    """The gRPC link's certificate folders, as KEDA reads them (ca.crt, tls.crt, tls.key): the operator's, with a
    server certificate for 127.0.0.1, and the metrics server's, with a client certificate; both trust the CA."""
    pairs = {
        "operator-grpc": authority.serving(f"{OPERATOR}-grpc"),
        "metrics-server-grpc": authority.client(f"{METRICS_SERVER}-grpc", METRICS_SERVER),
    }
    folders = []
    for name, pair in pairs.items():
        target = folder / name
        target.mkdir(parents=True, exist_ok=True)
        for source, file in ((authority.cert, "ca.crt"), (pair.cert, "tls.crt"), (pair.key, "tls.key")):
            shutil.copy(source, target / file)
        (target / "tls.key").chmod(0o600)
        folders.append(target)
    return folders[0], folders[1]


def env(kubeconfig: Path) -> dict[str, str]:
    """What both processes read from their environment: where the API server is, which namespaces they watch
    (all), and KEDA's own namespace (in a pod, the service account's)."""
    return {
        "KUBECONFIG": str(kubeconfig),
        "WATCH_NAMESPACE": "",
        "POD_NAMESPACE": NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
    }


def operator_args(*, grpc_port: int, probe_port: int, metrics_port: int, grpc_certs: Path) -> list[str]:
    """The operator's command line: every listener on 127.0.0.1, the gRPC server's certificates from
    ``grpc_certs``, no certificate generation, no webhooks or APIService patching (KEDA's webhooks do not run)."""
    return [
        str(binaries()[OPERATOR]),
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
        f"--cert-dir={grpc_certs}",
        f"--ca-dir={grpc_certs}",  # the CAs its scalers trust besides the system's: the cluster CA
        "--enable-cert-rotation=false",
        "--enable-webhook-patching=false",
        "--enable-apiservice-patching=false",
        "--leader-elect=false",
    ]


def metrics_server_args(
    *,
    bind: str,
    port: int,
    metrics_port: int,
    serving: tuple[Path, Path],
    grpc_port: int,
    grpc_certs: Path,
    kubeconfig: Path,
    front_proxy_ca: Path,
) -> list[str]:
    """The metrics API server's command line: it serves on ``bind:port`` with ``serving`` (the certificate for its
    Service's name), reads its gRPC client certificate from ``grpc_certs`` (its ``--cert-dir``) and trusts the
    front-proxy CA for the caller's identity, as prometheus-adapter does. Its own /metrics listens on
    ``metrics_port`` of every address (KEDA takes a port only)."""
    return [
        str(binaries()[METRICS_SERVER]),
        *adapter.aggregated_server_args(bind, port, serving, kubeconfig, front_proxy_ca),
        f"--cert-dir={grpc_certs}",
        f"--metrics-service-address=127.0.0.1:{grpc_port}",
        f"--port={metrics_port}",
    ]


def service_names() -> tuple[str, ...]:
    """The names the API server checks the metrics server's serving certificate against."""
    return adapter.service_names(METRICS_SERVER, NAMESPACE)


def objects(address: str, port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """The metrics server's registration for external.metrics.k8s.io (clef_cluster.adapter.registration)."""
    return adapter.registration(METRICS_SERVER, NAMESPACE, GROUP, API_VERSIONS, address, port, ca_bundle)
