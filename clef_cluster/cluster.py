"""Bring the cluster up, describe it, take it down.

``up`` makes the cluster's network namespace (clef_cluster.netns) and starts, in order: etcd (on free 127.0.0.1
ports) -> kube-apiserver (on the host's end of the namespace's link, a free port) (Node and RBAC authorizers,
service-account tokens signed with a key made here, the default admission plugins plus
OwnerReferencesPermissionEnforcement) -> kube-controller-manager (every default controller, each with its own
service-account credentials) -> kube-scheduler -> kwok (fake nodes; clef_cluster.kwok: its pod stages) -> the fake
GPU node pools -> optionally KServe's manager in Standard (RawDeployment) mode with its webhooks registered ->
optionally the real node (clef_cluster.node: containerd, kubelet, kube-proxy in the namespace) -> optionally the
metrics pipeline (clef_cluster.metrics: Prometheus scraping the annotated pods, prometheus-adapter serving
custom.metrics.k8s.io) -> optionally KEDA (clef_cluster.keda: its CRDs and roles, its operator, its metrics server
serving external.metrics.k8s.io).
The API server's aggregation layer is configured (a front-proxy CA and its client, the requestheader flags) so
that aggregated APIs such as the adapter's know who calls them. Every process and port, and the namespace's
slot, are recorded in ``<folder>/state.json``; ``down`` stops exactly those processes, newest first, then removes
what the node left (containers, mounts, cgroups) and the namespace. ``up`` in a folder whose earlier cluster
crashed cleans that one up first.

One module of ~650 lines on purpose: the start order of ``up`` and the stop order of ``down`` read from one
place, over one state record; what each component needs in detail lives in its own module (netns, pki, node,
kwok, kserve, metrics, adapter, keda).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clef_cluster import adapter, keda, kserve, kwok, metrics, netns, nodes, pki
from clef_cluster.build import KSERVE_MANAGER, build
from clef_cluster.netns import SERVICE_CIDR, NodeNetwork
from clef_cluster.node import NAME as NODE_NAME
from clef_cluster.node import Node, NodeError, gpu_capacity_patch
from clef_cluster.processes import Recorded, start, stop
from clef_tools.local_server import free_port

REPO = Path(__file__).resolve().parent.parent
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR
CLUSTER_DOMAIN = "cluster.local"
ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMISSION_PLUGINS = "OwnerReferencesPermissionEnforcement"  # on top of the default set
START_TIMEOUT = 120.0
KUBECTL_TIMEOUT_S = 120  # one kubectl call, its own waits (--timeout) included
ESTABLISHED_TIMEOUT_S = 120.0  # a CRD's Established condition
FRONT_PROXY_CLIENT = "front-proxy-client"  # the API server's identity when it calls an aggregated API


class ClusterError(RuntimeError):
    """A component did not start, or the cluster is not in the state asked for."""


@dataclass
class Cluster:
    """A running cluster: its folder, the admin kubeconfig, ports and processes."""

    folder: Path
    ports: dict[str, int] = field(default_factory=dict)
    processes: list[Recorded] = field(default_factory=list)
    kserve: bool = False
    slot: int = 0  # the network namespace's (clef_cluster.netns); 0 before it is made
    real_node: bool = False

    @property
    def kubeconfig(self) -> Path:
        """The cluster-admin kubeconfig."""
        return self.folder / "admin.kubeconfig"

    @property
    def network(self) -> NodeNetwork:
        """The cluster's network namespace: the real node and every client of a Service or pod run in it."""
        return NodeNetwork(self.slot)

    @property
    def node(self) -> Node:
        """The real node (running when ``real_node``)."""
        return Node(self.folder / "node", self.network)

    @property
    def server(self) -> str:
        """The API server's URL: the host's end of the namespace's link (pods reach it there too)."""
        return f"https://{self.network.host_ip}:{self.ports['kube-apiserver']}"

    @property
    def prometheus_url(self) -> str:
        """The metrics pipeline's Prometheus (on 127.0.0.1; started with ``with_metrics``)."""
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    @property
    def kube_cache(self) -> Path:
        """kubectl's discovery cache for this cluster: the default one is keyed by host and port, and a free
        port reused by a later cluster would find the earlier cluster's resource list there."""
        return self.folder / "kube-cache"

    def env(self) -> dict[str, str]:
        """What a shell or a test needs to talk to the cluster."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "KUBECACHEDIR": str(self.kube_cache),
            "CLEF_CLUSTER_DIR": str(self.folder),
        }

    def save(self) -> None:
        """Write state.json (after every started process, so ``down`` works even after a failed ``up``)."""
        state = {
            "ports": self.ports,
            "kserve": self.kserve,
            "slot": self.slot,
            "real_node": self.real_node,
            "processes": [p.as_dict() for p in self.processes],
        }
        (self.folder / "state.json").write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, folder: Path) -> Cluster:
        """The cluster recorded in ``folder``."""
        try:
            state = json.loads((folder / "state.json").read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster in {folder} (no state.json)") from None
        processes = [Recorded(**p) for p in state["processes"]]
        return cls(
            folder, state["ports"], processes, state["kserve"], state.get("slot", 0), state.get("real_node", False)
        )

    def service_hosts(self) -> dict[str, str]:
        """Every Service's ClusterIP by the names a pod would resolve it by (``<name>.<namespace>``,
        ``….svc``, ``….svc.cluster.local``): the cluster runs no DNS server, so ``exec`` puts these in the
        client's /etc/hosts. Headless Services (no ClusterIP) are left out."""
        services = json.loads(self.kubectl("get", "services", "--all-namespaces", "-o", "json").stdout)["items"]
        hosts = {}
        for service in services:
            address = service["spec"].get("clusterIP")
            if address and address != "None":
                base = f"{service['metadata']['name']}.{service['metadata']['namespace']}"
                hosts.update(dict.fromkeys((base, f"{base}.svc", f"{base}.svc.{CLUSTER_DOMAIN}"), address))
        return hosts

    def kubectl_command(self, *args: str) -> list[str]:
        """The command line of kubectl ``args`` against this cluster as its admin."""
        return [kubectl_path(), f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.kube_cache}", *args]

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster as its admin; with ``check``, a failure raises ClusterError with what
        kubectl printed."""
        result = subprocess.run(
            self.kubectl_command(*args),
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=KUBECTL_TIMEOUT_S,
        )
        if check and result.returncode:
            raise ClusterError(
                f"kubectl {' '.join(args)} exited with {result.returncode}: {result.stderr.strip() or result.stdout}"
            )
        return result

    def apply(self, objects: list[dict[str, Any]]) -> None:
        """Server-side apply of ``objects`` as the admin."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(objects))

    def process(self, name: str) -> Recorded:
        """The recorded process called ``name``."""
        return next(p for p in self.processes if p.name == name)

    def restart(self, name: str) -> None:
        """Stop a component and start it again with the same arguments (kept in ``<name>.args``)."""
        old = self.process(name)
        stop(old)
        spec = json.loads((self.folder / f"{name}.args").read_text())
        self.processes[self.processes.index(old)] = start(name, spec["args"], self.folder, spec["env"])
        self.save()


def up(
    folder: Path,
    with_kserve: bool = True,
    with_nodes: bool = True,
    with_node: bool = True,
    with_metrics: bool = False,
    with_keda: bool = False,
) -> Cluster:
    """Build what is missing, start every component and wait until each one serves; see the module doc.
    ``with_nodes``: kwok's fake GPU pools; ``with_node``: the real node; ``with_metrics``: Prometheus and
    prometheus-adapter; ``with_keda``: KEDA's operator and metrics server (implies ``with_metrics``: the
    predictors' triggers read the pipeline's Prometheus)."""
    with_metrics = with_metrics or with_keda
    bins = build(with_kserve=with_kserve)
    if with_metrics:
        metrics.prometheus_binary()  # before anything starts: say what is missing
        adapter.build()
    if with_keda:
        keda.build()
    folder = folder.resolve()
    if (folder / "state.json").exists():
        if any(p.alive() for p in Cluster.load(folder).processes):
            raise ClusterError(f"a cluster already runs in {folder}; run down first")
        down(folder)  # what a crashed run left: its namespace, mounts, containers
    folder.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(folder, kserve=with_kserve, real_node=with_node)
    cluster.save()
    try:
        cluster.slot = netns.create().slot
        # A process holding the namespace while the cluster lives (an empty old namespace is a crashed run's).
        _launch(cluster, "netns-holder", cluster.network.command([str(bins / "pause")]))
        _start_control_plane(cluster, bins)
        if with_nodes:
            cluster.apply(nodes.all_nodes())
            wait_for(lambda: _ready_nodes(cluster) >= len(nodes.all_nodes()), "the fake nodes to be Ready")
        if with_kserve:
            _start_kserve(cluster, bins)
        if with_node:
            _start_node(cluster)
        if with_metrics:
            _start_metrics(cluster)
        if with_keda:
            _start_keda(cluster)
    except BaseException:
        down(folder)
        raise
    return cluster


def down(folder: Path) -> None:
    """Stop the processes ``up`` started in ``folder`` (newest first) and forget them; then end what the real node
    left (containers, mounts, cgroups) and remove the network namespace."""
    cluster = Cluster.load(folder.resolve())
    for process in reversed(cluster.processes):
        stop(process)
    cluster.processes = []
    cluster.save()
    if cluster.slot:
        try:
            cluster.node.clean()
        except (NodeError, netns.NetworkError) as error:
            raise ClusterError(str(error)) from error
        cluster.slot = 0
        cluster.save()


def _start_control_plane(cluster: Cluster, bins: Path) -> None:
    folder = cluster.folder
    pki_dir = folder / "pki"
    ca = pki.Authority.create(pki_dir)
    serving = ca.serving(
        "kube-apiserver",
        (
            *pki.LOOPBACK_NAMES,
            cluster.network.host_ip,
            KUBERNETES_SERVICE_IP,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
    )
    sa = pki.signing_key(pki_dir)
    for name in ("etcd", "etcd-peer", "kube-apiserver", "kwok"):
        cluster.ports[name] = free_port()
    admin = ca.client("admin", "clef-cluster-admin", ("system:masters",))
    to_kubelet = ca.client("apiserver-kubelet", "kube-apiserver-kubelet-client", ("system:masters",))
    front_proxy = pki.Authority.create(pki_dir / "front-proxy")
    proxy_client = front_proxy.client(FRONT_PROXY_CLIENT, FRONT_PROXY_CLIENT)
    _kubeconfig(cluster, "admin", admin, ca.cert)
    cm = _kubeconfig(
        cluster, "controller-manager", ca.client("controller-manager", "system:kube-controller-manager"), ca.cert
    )
    scheduler = _kubeconfig(cluster, "scheduler", ca.client("scheduler", "system:kube-scheduler"), ca.cert)

    etcd_url, peer_url = (f"http://127.0.0.1:{cluster.ports[n]}" for n in ("etcd", "etcd-peer"))
    _launch(
        cluster,
        "etcd",
        [
            str(bins / "etcd"),
            "--name=clef",
            f"--data-dir={folder / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=clef={peer_url}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )
    wait_for(lambda: _http_ok(f"{etcd_url}/health"), "etcd", cluster.process("etcd"))

    _launch(
        cluster,
        "kube-apiserver",
        [
            str(bins / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={cluster.network.host_ip}",
            f"--advertise-address={cluster.network.host_ip}",
            f"--secure-port={cluster.ports['kube-apiserver']}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={ca.cert}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={sa.cert}",
            f"--service-account-signing-key-file={sa.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--enable-admission-plugins={ADMISSION_PLUGINS}",
            "--endpoint-reconciler-type=lease",  # the `kubernetes` Service's endpoint: the address above
            # Aggregated APIs and webhooks are called at their endpoints (pod addresses, routed into the
            # namespace), never at a Service address (unreachable from the host).
            "--enable-aggregator-routing=true",
            # The aggregation layer: the API server calls aggregated APIs with this client certificate and passes
            # the caller's identity in these headers, which an aggregated API trusts from this CA only.
            f"--requestheader-client-ca-file={front_proxy.cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy_client.cert}",
            f"--proxy-client-key-file={proxy_client.key}",
            f"--kubelet-client-certificate={to_kubelet.cert}",
            f"--kubelet-client-key={to_kubelet.key}",
            f"--kubelet-certificate-authority={ca.cert}",
            "--kubelet-preferred-address-types=InternalIP",  # the node's link address (its name resolves nowhere)
            "--allow-privileged=true",
            f"--cert-dir={folder / 'apiserver'}",
            "--profiling=false",
        ],
    )
    wait_for(
        lambda: _http_ok(f"{cluster.server}/readyz", ca.cert, admin),
        "kube-apiserver",
        cluster.process("kube-apiserver"),
    )

    _launch(
        cluster,
        "kube-controller-manager",
        [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={cm}",
            "--secure-port=0",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={sa.key}",
            f"--root-ca-file={ca.cert}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ],
    )
    # The service-account controller making `default` in a namespace shows the controllers run.
    wait_for(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
        "kube-controller-manager",
        cluster.process("kube-controller-manager"),
    )

    _launch(
        cluster,
        "kube-scheduler",
        [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={scheduler}",
            "--secure-port=0",
            "--leader-elect=false",
        ],
    )
    _launch(
        cluster,
        "kwok",
        [
            str(bins / "kwok"),
            f"--kubeconfig={cluster.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={nodes.KWOK_ANNOTATION}={nodes.KWOK_VALUE}",
            "--manage-nodes-with-label-selector=",
            "--cidr=10.0.0.1/16",
            "--node-ip=10.0.0.1",
            f"--disregard-status-with-annotation-selector={nodes.CUSTOM_STATUS_ANNOTATION}={nodes.CUSTOM_STATUS_VALUE}",
            "--disregard-status-with-label-selector=",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{cluster.ports['kwok']}",
            f"--config={kwok.write_config(folder / 'kwok.yaml')}",
        ],
        env={**os.environ, "HOME": str(folder)},
    )  # HOME: no user-wide ~/.kwok configuration
    wait_for(lambda: _http_ok(f"http://127.0.0.1:{cluster.ports['kwok']}/healthz"), "kwok", cluster.process("kwok"))
    wait_for(lambda: cluster.process("kube-scheduler").alive(), "kube-scheduler", cluster.process("kube-scheduler"))


def wait_established(cluster: Cluster, crds: list[dict[str, Any]]) -> None:
    """Wait until the API server serves each of ``crds`` (condition Established); a timeout names those that are not
    and their conditions. Polled here: ``kubectl wait --for=condition=Established`` fails at once, instead of
    waiting, when it reads a CRD so new that it has no conditions yet."""
    names = [crd["metadata"]["name"] for crd in crds]
    pending: dict[str, list[dict[str, Any]]] = {}

    def established() -> bool:
        listed = json.loads(cluster.kubectl("get", "crd", "-o", "json").stdout)["items"]
        found = {item["metadata"]["name"]: item for item in listed}
        pending.clear()
        for name in names:
            conditions = found.get(name, {}).get("status", {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                pending[name] = conditions
        return not pending

    try:
        wait_for(established, "the CRDs to be Established", cluster.process("kube-apiserver"), ESTABLISHED_TIMEOUT_S)
    except ClusterError as error:
        raise ClusterError(f"{error}; not Established: {json.dumps(pending)}") from error


def _start_kserve(cluster: Cluster, bins: Path) -> None:
    for name in ("kserve-webhook", "kserve-metrics", "kserve-probe"):
        cluster.ports[name] = free_port()
    cluster.apply(kserve.crds())
    wait_established(cluster, kserve.crds())
    cluster.apply(kserve.namespace_objects())
    authority = pki.Authority.load(cluster.folder / "pki")
    certs = kserve.write_webhook_certs(cluster.folder / "kserve-tmp", authority)
    _launch(
        cluster,
        "kserve-manager",
        [
            str(bins / KSERVE_MANAGER),
            f"--webhook-port={cluster.ports['kserve-webhook']}",
            f"--metrics-addr=127.0.0.1:{cluster.ports['kserve-metrics']}",
            f"--health-probe-addr=127.0.0.1:{cluster.ports['kserve-probe']}",
        ],
        env={
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "POD_NAMESPACE": kserve.NAMESPACE,
            "TMPDIR": str(certs),
        },
    )
    wait_for(
        lambda: _http_ok(f"http://127.0.0.1:{cluster.ports['kserve-probe']}/readyz"),
        "KServe's manager",
        cluster.process("kserve-manager"),
    )
    cluster.apply(kserve.webhook_configurations(cluster.ports["kserve-webhook"], authority.cert.read_bytes()))


def _start_node(cluster: Cluster) -> None:
    """containerd (then the sandbox image imported), kubelet and kube-proxy in the namespace; waits until the node
    is Ready, then advertises its GPU and waits until kube-proxy translates the ``kubernetes`` Service."""
    node = cluster.node
    ca = pki.Authority.load(cluster.folder / "pki")
    kubelet = _kubeconfig(
        cluster, "kubelet", ca.client("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)), ca.cert
    )
    proxy = _kubeconfig(cluster, "kube-proxy", ca.client("kube-proxy", "system:kube-proxy"), ca.cert)
    serving = ca.serving("kubelet-serving", (cluster.network.node_ip, NODE_NAME))
    node.write_configs({"kube-proxy": proxy}, ca.cert, (serving.cert, serving.key))
    node.make_cgroups()
    _launch(cluster, "containerd", node.containerd_args(), node.env())
    wait_for(node.containerd_ready, "containerd", cluster.process("containerd"))
    node.import_image(node.folder / "images" / "pause.tar")
    _launch(cluster, "kubelet", node.kubelet_args(kubelet), node.env())
    _launch(cluster, "kube-proxy", node.kube_proxy_args(), node.env())
    wait_for(lambda: _node_ready(cluster, NODE_NAME), "the real node to be Ready", cluster.process("kubelet"))
    patch = json.dumps(gpu_capacity_patch())
    cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=json", f"--patch={patch}")
    wait_for(lambda: _gpu_allocatable(cluster), "the real node's GPU to be allocatable", cluster.process("kubelet"))
    wait_for(
        lambda: node.service_routed(KUBERNETES_SERVICE_IP, 443),
        "kube-proxy's rules for the kubernetes Service",
        cluster.process("kube-proxy"),
    )
    if legacy := node.legacy_rules():
        raise ClusterError(f"rules in the legacy iptables backend of {cluster.network.name}: {legacy}")


def _start_metrics(cluster: Cluster) -> None:
    """The pods' targets file, Prometheus, then prometheus-adapter and its APIServices; waits until the API server
    serves custom.metrics.k8s.io through the adapter."""
    folder = cluster.folder / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("prometheus", "prometheus-adapter"):
        cluster.ports[name] = free_port()
    targets = folder / "targets.json"
    _launch(
        cluster,
        "pod-targets",
        [sys.executable, "-m", "clef_cluster.pod_targets", str(cluster.kubeconfig), str(targets)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))},
    )
    wait_for(targets.exists, "the pod targets file", cluster.process("pod-targets"))
    config_file = folder / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(metrics.config(targets)))
    _launch(cluster, "prometheus", metrics.args(config_file, folder / "data", cluster.ports["prometheus"]))
    wait_for(lambda: _http_ok(f"{cluster.prometheus_url}/-/ready"), "Prometheus", cluster.process("prometheus"))

    authority = pki.Authority.load(cluster.folder / "pki")
    serving = authority.serving(adapter.NAME, adapter.service_names())
    rules = folder / "adapter.yaml"
    rules.write_text(yaml.safe_dump(adapter.config()))
    _launch(
        cluster,
        adapter.NAME,
        adapter.args(
            bind=cluster.network.host_ip,
            port=cluster.ports[adapter.NAME],
            serving=(serving.cert, serving.key),
            kubeconfig=cluster.kubeconfig,
            front_proxy_ca=cluster.folder / "pki" / "front-proxy" / "ca.crt",
            prometheus_url=cluster.prometheus_url,
            config_file=rules,
            cert_dir=folder / "adapter-certs",
        ),
    )
    _register_aggregated_api(
        cluster, authority, adapter.objects, adapter.NAME, adapter.GROUP, adapter.API_VERSIONS,
        "the custom metrics API (prometheus-adapter's APIServices)",
    )  # fmt: skip


def _start_keda(cluster: Cluster) -> None:
    """KEDA's CRDs and roles, its operator (waits until it is ready), then its metrics server and its APIService;
    waits until the API server serves external.metrics.k8s.io through it."""
    folder = cluster.folder / "keda"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("keda-grpc", "keda-probe", "keda-operator-metrics", keda.METRICS_SERVER, "keda-metrics"):
        cluster.ports[name] = free_port()
    source = keda.module_source()
    crds = keda.crds(source)
    cluster.apply(crds)
    wait_established(cluster, crds)
    cluster.apply(keda.rbac(source))
    authority = pki.Authority.load(cluster.folder / "pki")
    kubeconfig = _kubeconfig(cluster, keda.USER, authority.client(keda.USER, keda.USER), authority.cert)
    operator_certs, server_certs = keda.write_grpc_certs(folder, authority)
    env = {**os.environ, **keda.env(kubeconfig)}
    _launch(
        cluster,
        keda.OPERATOR,
        keda.operator_args(
            grpc_port=cluster.ports["keda-grpc"],
            probe_port=cluster.ports["keda-probe"],
            metrics_port=cluster.ports["keda-operator-metrics"],
            grpc_certs=operator_certs,
        ),
        env,
    )
    wait_for(
        lambda: _http_ok(f"http://127.0.0.1:{cluster.ports['keda-probe']}/readyz"),
        "KEDA's operator",
        cluster.process(keda.OPERATOR),
    )
    serving = authority.serving(keda.METRICS_SERVER, keda.service_names())
    _launch(
        cluster,
        keda.METRICS_SERVER,
        keda.metrics_server_args(
            bind=cluster.network.host_ip,
            port=cluster.ports[keda.METRICS_SERVER],
            metrics_port=cluster.ports["keda-metrics"],
            serving=(serving.cert, serving.key),
            grpc_port=cluster.ports["keda-grpc"],
            grpc_certs=server_certs,
            kubeconfig=kubeconfig,
            front_proxy_ca=cluster.folder / "pki" / "front-proxy" / "ca.crt",
        ),
        env,
    )
    _register_aggregated_api(
        cluster, authority, keda.objects, keda.METRICS_SERVER, keda.GROUP, keda.API_VERSIONS,
        "the external metrics API (KEDA's metrics server's APIService)",
    )  # fmt: skip


def _register_aggregated_api(
    cluster: Cluster,
    authority: pki.Authority,
    objects: Callable[[str, int, str], list[dict[str, Any]]],
    process: str,
    group: str,
    versions: tuple[str, ...],
    what: str,
) -> None:
    """Apply ``objects`` (the registration of the aggregated API server ``process``, listening on the host's end of
    the node's link at its port) with the cluster CA as the bundle; wait until every version of ``group`` is
    Available."""
    bundle = base64.b64encode(authority.cert.read_bytes()).decode()
    cluster.apply(objects(cluster.network.host_ip, cluster.ports[process], bundle))
    wait_for(
        lambda: all(_api_service_available(cluster, f"{version}.{group}") for version in versions),
        f"{what} to be Available",
        cluster.process(process),
    )


def _api_service_available(cluster: Cluster, name: str) -> bool:
    out = cluster.kubectl("get", "apiservice", name, "-o", "json", check=False)
    if out.returncode:
        return False
    conditions = json.loads(out.stdout).get("status", {}).get("conditions", [])
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


def _gpu_allocatable(cluster: Cluster) -> bool:
    jsonpath = "jsonpath={.status.allocatable.nvidia\\.com/gpu}"
    return bool(cluster.kubectl("get", "node", NODE_NAME, "-o", jsonpath, check=False).stdout.strip())


def _node_ready(cluster: Cluster, name: str) -> bool:
    out = cluster.kubectl("get", "node", name, "-o", "json", check=False)
    if out.returncode:
        return False
    conditions = json.loads(out.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _launch(cluster: Cluster, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
    (cluster.folder / f"{name}.args").write_text(json.dumps({"args": args, "env": env}))
    cluster.processes.append(start(name, args, cluster.folder, env))
    cluster.save()


def _kubeconfig(cluster: Cluster, name: str, client: pki.Pair, ca: Path) -> Path:
    path = cluster.folder / f"{name}.kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "clef",
        "clusters": [{"name": "clef", "cluster": {"server": cluster.server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}],
        "contexts": [{"name": "clef", "context": {"cluster": "clef", "user": name}}],
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _ready_nodes(cluster: Cluster) -> int:
    out = cluster.kubectl("get", "nodes", "-o", "json", check=False)
    if out.returncode:
        return 0
    return sum(
        1
        for node in json.loads(out.stdout)["items"]
        if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
    )


def _http_ok(url: str, ca: Path | None = None, client: pki.Pair | None = None) -> bool:
    context = None
    if ca is not None:
        context = ssl.create_default_context(cafile=str(ca))
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.status == 200
    except OSError:
        return False


def wait_for(
    check: Callable[[], bool], what: str, process: Recorded | None = None, timeout: float = START_TIMEOUT
) -> None:
    """Poll ``check`` until true; fail at ``timeout``, or at once when ``process`` died (naming its log)."""
    deadline = time.monotonic() + timeout
    while not check():
        if process is not None and not process.alive():
            raise ClusterError(f"{what} exited; see {process.log}:\n{_tail(Path(process.log))}")
        if time.monotonic() > deadline:
            log = f"; see {process.log}" if process else ""
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{log}")
        time.sleep(0.25)


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def kubectl_path() -> str:
    """kubectl from the project's virtual environment (scripts/install_k8s_tools.sh), else from PATH."""
    beside_python = Path(sys.executable).parent / "kubectl"
    return str(beside_python) if beside_python.exists() else "kubectl"
