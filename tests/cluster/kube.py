"""kubectl, helm and the operator process as the real-cluster tests drive them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clef_cluster.cluster import KUBECTL_TIMEOUT_S, Cluster, down, up
from clef_tools.local_server import free_port

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "clef-serving"
RELEASE = "clef-serving"
SYSTEM_NS = "clef-system"
SERVICE_ACCOUNT = "clef-serving"
OPERATOR_DEPLOYMENT = "clef-serving-operator"
HELM = REPO / ".venv" / "bin" / "helm"
#: kubectl's own wait for a deletion (``delete ... --wait=true``): inside the time the kubectl process is given, so a
#: slow deletion fails with kubectl's message rather than a killed process.
DELETE_WAIT = f"--timeout={KUBECTL_TIMEOUT_S - 10}s"
README_NS = "ml-serving"
EXAMPLE = REPO / "manifests" / "examples" / "clefdecision.yaml"


class Kube:
    """kubectl and helm as the cluster's admin, with JSON in and out."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """kubectl ``args``; fails the test with kubectl's message when ``check`` and it fails."""
        done = self.cluster.kubectl(*args, stdin=stdin, check=False)
        if check and done.returncode:
            pytest.fail(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def get(self, kind: str, name: str | None = None, namespace: str | None = None, selector: str | None = None) -> Any:
        """An object (None when absent) or, without a name, the list's items."""
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        args += [f"--namespace={namespace}"] if namespace else ["--all-namespaces"] if not name else []
        args += [f"--selector={selector}"] if selector else []
        done = self.run(*args, check=False)
        if done.returncode:
            if "NotFound" in done.stderr:
                return None
            pytest.fail(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        data = json.loads(done.stdout)
        return data if name else data["items"]

    def apply(self, *objects: dict[str, Any]) -> None:
        """``kubectl apply`` of the objects."""
        self.run("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        """helm ``args`` against the cluster; fails the test with helm's message on failure."""
        done = subprocess.run(
            [str(HELM), f"--kubeconfig={self.cluster.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if done.returncode:
            pytest.fail(f"helm {' '.join(args)} failed: {done.stderr.strip()}")
        return done


class PodLogs:
    """``kubectl logs --follow --timestamps`` of pods' containers, each into a file of ``folder``, in the background:
    a pod's lines up to its container's end, even once the pod itself is gone (a scale-down's removed pod)."""

    def __init__(self, kube: Kube, folder: Path) -> None:
        self.kube = kube
        self.folder = folder
        self.followed: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def follow(self, pod: str, namespace: str, container: str) -> None:
        """Start following ``pod``'s ``container`` (from its first line)."""
        command = self.kube.cluster.kubectl_command(
            "logs", "--follow", "--timestamps", pod, f"--namespace={namespace}", f"--container={container}"
        )
        path = self.folder / f"{pod}.log"
        with path.open("wb") as out:
            self.followed[pod] = (subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT), path)

    def stop(self) -> dict[str, str]:
        """Stop following (a pod already gone has ended its stream); each pod's lines."""
        for process, _ in self.followed.values():
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=30)
        return {pod: path.read_text(errors="replace") for pod, (_, path) in self.followed.items()}


class Operator:
    """``python -m clef_operator`` as a local process, with the Deployment's own arguments and a token of the
    chart's ServiceAccount as its only credentials."""

    def __init__(self, kube: Kube, folder: Path) -> None:
        self.kube = kube
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None
        self.log = folder / "operator.log"

    def kubeconfig(self) -> Path:
        """A kubeconfig holding a fresh token of the chart's ServiceAccount (TokenRequest), nothing else."""
        token = self.kube.run("create", "token", SERVICE_ACCOUNT, f"--namespace={SYSTEM_NS}", "--duration=2h").stdout
        cluster = self.kube.cluster
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "operator",
            "clusters": [
                {
                    "name": "clef",
                    "cluster": {"server": cluster.server, "certificate-authority": str(cluster.folder / "pki/ca.crt")},
                }
            ],
            "users": [{"name": "operator", "user": {"token": token.strip()}}],
            "contexts": [{"name": "operator", "context": {"cluster": "clef", "user": "operator"}}],
        }
        path = self.folder / "operator.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def container(self) -> dict[str, Any]:
        """The operator container of the installed Deployment."""
        deployment = self.kube.get("deployment", OPERATOR_DEPLOYMENT, SYSTEM_NS)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return container

    def start(self, *extra_args: str) -> None:
        """Start the operator as the Deployment's pod would run: its arguments (with a free liveness port on
        127.0.0.1, then ``extra_args``) and its environment; output to operator.log."""
        assert self.process is None or self.process.poll() is not None, "the operator already runs"
        container = self.container()
        args = [*container["args"], f"--liveness-port={free_port()}", "--liveness-host=127.0.0.1", *extra_args]
        pod_fields = {"metadata.name": "operator-local", "metadata.namespace": SYSTEM_NS}
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig())}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        for item in container.get("env", []):
            field = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[item["name"]] = item["value"] if "value" in item else pod_fields[field]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "clef_operator", *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO
            )

    def kill(self) -> None:
        """SIGKILL the operator (no clean-up of any kind) and wait for it to be gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM the operator and wait; SIGKILL after 30 s."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self) -> str:
        """Everything the operator logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def cluster_for(tmp_path_factory: pytest.TempPathFactory, name: str, **options: bool) -> Iterator[Cluster]:
    """A cluster of its own in a fresh folder ``name`` (``options``: clef_cluster.cluster.up's), for the block;
    brought down after it, even when the block fails."""
    folder = tmp_path_factory.mktemp(name)
    running = up(folder, **options)
    try:
        yield running
    finally:
        down(folder)
        # The real node's image store (each layer and its unpacked copy: 11 GB with the CPU predictor image) goes
        # with the block; the logs stay. Kept, it would hold that disk while the suite's other clusters import theirs.
        shutil.rmtree(running.node.folder / "containerd" / "root", ignore_errors=True)


def install_chart(kube: Kube) -> dict[str, Any]:
    """``helm install`` of charts/clef-serving (default values) into clef-system, waited for; the release."""
    kube.helm(
        "install", RELEASE, str(CHART), f"--namespace={SYSTEM_NS}", "--create-namespace", "--wait", "--timeout=3m"
    )
    return {"release": RELEASE, "namespace": SYSTEM_NS}


@contextlib.contextmanager
def operator_for(kube: Kube, folder: Path) -> Iterator[Operator]:
    """The operator running with the chart's ServiceAccount token for the block (tests may kill and restart it)."""
    running = Operator(kube, folder)
    running.start()
    try:
        yield running
    finally:
        running.stop()
