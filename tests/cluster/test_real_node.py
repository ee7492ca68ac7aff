"""The real node (clef_cluster.node): kubelet, containerd, runc, CNI and kube-proxy in the cluster's network
namespace. Pods of a locally built image run as processes, their probes pass, a ClusterIP Service routes to them
from a client in the namespace, ``kubectl logs``/``exec`` work, nothing reaches an address outside, and ``down``
leaves no process, namespace, mount or cgroup behind, even after the node's processes were killed.

Its own cluster (no KServe, no fake pools) on its own worker (tests/worker_groups.py).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clef_cluster import netns, node
from clef_cluster.cluster import KUBERNETES_SERVICE_IP, Cluster, down
from clef_cluster.nodes import REAL_POOL
from clef_operator.pools import evaluate_pool, group_into_pools, summarize_node
from clef_operator.spec import parse_spec
from tests.cluster.helpers import is_ready
from tests.cluster.kube import EXAMPLE, Kube, cluster_for
from tests.polling import eventually

APP = "echo"
PORT = 8080
OUTSIDE = "203.0.113.1:80"  # TEST-NET-3 (RFC 5737): documentation only, never a real host


@pytest.fixture(scope="module")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane and the real node (no KServe, no fake pools)."""
    with cluster_for(tmp_path_factory, "node-cluster", with_kserve=False, with_nodes=False, with_node=True) as running:
        yield running


@pytest.fixture(scope="module")
def kube(node_cluster: Cluster) -> Kube:
    """kubectl as the admin of the node's cluster."""
    return Kube(node_cluster)


@pytest.fixture(scope="module")
def echo_image(node_cluster: Cluster) -> str:
    """The echoserver image (FROM scratch, built here) imported into the node's containerd; its reference."""
    image = node.Node.echoserver_image()
    assert node_cluster.node.import_image(image.write(node_cluster.folder / "echoserver.tar")) == [image.reference]
    return image.reference


@pytest.fixture(scope="module")
def echo(echo_image: str, kube: Kube) -> dict[str, Any]:
    """A pod of the echoserver image (readiness probe on /healthz) and a ClusterIP Service in front of it, the pod
    Ready; the Service object."""
    kube.apply(echo_pod(echo_image), echo_service())
    eventually(lambda: is_ready(kube.get("pod", APP, "default")), "the echo pod to be Ready")
    return kube.get("service", APP, "default")


def echo_pod(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": APP, "namespace": "default", "labels": {"app": APP}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.NAME},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": APP,
                    "image": image,
                    "imagePullPolicy": "Never",
                    "ports": [{"containerPort": PORT}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": PORT}, "periodSeconds": 1},
                }
            ],
        },
    }


def echo_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": APP, "namespace": "default"},
        "spec": {"selector": {"app": APP}, "ports": [{"port": 80, "targetPort": PORT}]},
    }


def test_the_node_registers_ready_as_a_capable_gpu_node(node_cluster: Cluster, kube: Kube) -> None:
    registered = kube.get("node", node.NAME)
    assert is_ready(registered)
    assert registered["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert {"type": "InternalIP", "address": node_cluster.network.node_ip} in registered["status"]["addresses"]
    assert registered["metadata"]["labels"].items() >= node.labels_of_node().items()
    assert registered["status"]["allocatable"][node.GPU_RESOURCE] == "1"
    summary = summarize_node(registered)  # what the operator reads: an FP8-capable pool of its own
    assert summary is not None
    spec = parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])  # the README's ClefDecision
    pools, unpooled = group_into_pools([summary], spec.nodePools.labelKey)
    assert unpooled == [] and [pool.name for pool in pools] == [REAL_POOL.name]
    assert evaluate_pool(pools[0], spec).eligible


def test_a_service_routes_to_the_pod_from_the_namespace(node_cluster: Cluster, echo: dict[str, Any]) -> None:
    cluster_ip = echo["spec"]["clusterIP"]
    # Before the first request: kube-proxy's rules translate the address (an untranslated one goes nowhere).
    eventually(lambda: node_cluster.node.service_routed(cluster_ip, 80), "kube-proxy's rules for the Service")

    def ask() -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{cluster_ip}/hello", timeout=10) as response:
            return json.loads(response.read())

    assert node_cluster.network.call(ask) == {"pod": APP, "path": "/hello"}
    assert node_cluster.node.legacy_rules() == []  # one backend: nf_tables


def test_pods_reach_the_api_server_through_the_kubernetes_service(node_cluster: Cluster) -> None:
    """What an in-cluster client (the operator as a pod) does: https://10.96.0.1 with the cluster's CA, the
    certificate naming that address."""
    context = ssl.create_default_context(cafile=str(node_cluster.folder / "pki" / "ca.crt"))

    def version() -> dict[str, Any]:
        with urllib.request.urlopen(f"https://{KUBERNETES_SERVICE_IP}/version", timeout=10, context=context) as answer:
            return json.loads(answer.read())

    assert node_cluster.network.call(version)["gitVersion"].startswith("v1.")


def test_exec_runs_a_client_that_resolves_service_names(node_cluster: Cluster, echo: dict[str, Any]) -> None:
    """``python -m clef_cluster exec``: a command in the namespace; the cluster has no DNS server, so Service
    names come from the client's /etc/hosts."""
    fetch = (
        "import urllib.request as u; print(u.urlopen('http://echo.default.svc.cluster.local/named').read().decode())"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "clef_cluster",
            "--dir",
            str(node_cluster.folder),
            "exec",
            "--",
            sys.executable,
            "-c",
            fetch,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"pod": APP, "path": "/named"}


def test_service_and_pod_addresses_fail_on_the_host(node_cluster: Cluster, echo: dict[str, Any]) -> None:
    """From the host (outside the namespace) a Service or pod range address is an unreachable route: refused
    locally, never sent to the default route."""
    pod_ip = "10.244.250.9"  # in the pod range, in no running cluster's slot
    for address in (echo["spec"]["clusterIP"], pod_ip):
        with socket.socket() as client, pytest.raises(OSError) as refused:
            client.settimeout(5)
            client.connect((address, 80))
        assert refused.value.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH), (address, refused.value)


def test_kubectl_logs_and_exec_reach_the_container(kube: Kube, node_cluster: Cluster, echo: dict[str, Any]) -> None:
    node_cluster.network.call(lambda: urllib.request.urlopen(f"http://{echo['spec']['clusterIP']}/logged", timeout=10))
    eventually(
        lambda: "request GET /logged" in kube.run("logs", APP, "--namespace=default").stdout, "the logged request"
    )
    # From inside the pod: the API server through the `kubernetes` Service (what in-cluster clients use) ...
    reached = kube.run("exec", APP, "--namespace=default", "--", "/echoserver", "dial", "10.96.0.1:443")
    assert reached.stdout.strip() == "dial succeeded"


def test_nothing_outside_is_reachable_from_a_pod_or_the_namespace(kube: Kube, node_cluster: Cluster, echo: Any) -> None:
    """... but no address outside: the namespace has no default route, so the attempt fails there."""
    refused = kube.run("exec", APP, "--namespace=default", "--", "/echoserver", "dial", OUTSIDE, check=False)
    assert refused.returncode != 0
    assert "unreachable" in refused.stdout or "no route to host" in refused.stdout, refused.stdout
    host, port = OUTSIDE.split(":")

    def connect() -> int:
        with socket.socket() as client:
            client.settimeout(5)
            return client.connect_ex((host, int(port)))

    assert node_cluster.network.call(connect) == errno.ENETUNREACH
    routes = json.loads(node_cluster.network.run("ip", "-j", "-4", "route").stdout)
    assert "default" not in {route["dst"] for route in routes}


def test_deleting_the_pod_stops_its_container(kube: Kube, node_cluster: Cluster, echo: dict[str, Any]) -> None:
    pids = container_pids(node_cluster)
    assert len(pids) == 2  # the sandbox (pause) and the echoserver
    kube.run("delete", "pod", APP, "--namespace=default", "--wait=true", "--timeout=60s")
    eventually(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), "the pod's processes to end")
    eventually(lambda: container_pids(node_cluster) == [], "containerd to have no task")


def test_down_leaves_nothing_even_after_a_crash(node_cluster: Cluster, kube: Kube, echo_image: str) -> None:
    """A pod running, kubelet and containerd killed (as a crash would leave them), then ``down``: no process of the
    node (containers, shims), no namespace, no mount under the cluster folder, no cgroup, no shim socket."""
    network, folder = node_cluster.network, node_cluster.folder
    pod = echo_pod(echo_image)
    pod["metadata"]["name"] = "left-running"
    kube.apply(pod)
    eventually(lambda: is_ready(kube.get("pod", "left-running", "default")), "the second pod to be Ready")
    sockets = node_cluster.node.shim_sockets()
    assert sockets and all(path.exists() for path in sockets)
    for name in ("kubelet", "containerd"):
        os.kill(node_cluster.process(name).pid, 9)
    down(folder)
    assert not network.exists()
    assert netns.processes_in(network) == []
    assert not any(p.alive() for p in Cluster.load(folder).processes)
    assert str(folder) not in Path("/proc/self/mountinfo").read_text()
    assert not Path(f"/sys/fs/cgroup/memory{node_cluster.node.cgroup}").exists()
    assert network.host_if not in os.listdir("/sys/class/net")
    assert not any(path.exists() for path in sockets)


def container_pids(cluster: Cluster) -> list[int]:
    """The pids of containerd's running tasks (pods' sandboxes and containers) on the node."""
    rows = cluster.node.ctr("tasks", "list").stdout.splitlines()[1:]
    return sorted(int(row.split()[1]) for row in rows if row.split()[2] == "RUNNING")
