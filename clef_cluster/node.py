"""The cluster's real node: Debian's containerd (its CRI plugin) + runc + the CNI plugins, kubelet and kube-proxy,
all inside the cluster's network namespace (clef_cluster.netns), every file under ``<cluster>/node``.

- containerd: own config, root, state and socket; ``restrict_oom_score_adj`` (this kind of VM refuses a negative
  ``oom_score_adj``); the sandbox image is the ``pause`` program built here, imported before kubelet starts.
- CNI: ``bridge`` (``cni0``, the slot's /24, ``host-local`` leases under the node folder), ``portmap``, and the
  ``loopback`` plugin containerd adds itself, from ``/usr/lib/cni``.
- kubelet: cgroupfs driver under a cgroup root of its own (``/clef-<slot>``, so clusters do not share
  ``kubepods``), cgroup v1 allowed, swap allowed, no host DNS for pods, pod logs under the node folder; its node IP
  is the namespace's end of the link, which the API server reaches for ``kubectl logs``/``exec``.
- kube-proxy: ``nftables`` mode (its rules are a table of the namespace's own; kubelet's and portmap's few
  iptables rules go through ``iptables-nft`` as well: :func:`Node.tool_path` pins that backend), masquerading all
  Service traffic so replies come back through the node.

Images reach the node as a cluster without a registry gets them: an OCI archive imported into containerd's
``k8s.io`` namespace (:meth:`Node.import_image`), used by pods with ``imagePullPolicy: Never`` (or
``IfNotPresent``: a tag other than ``latest`` that is present is never pulled, and the namespace has no route to
any registry, so a missing image fails at once instead of leaving the machine).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clef_cluster import netns, oci
from clef_cluster.nodes import REAL_POOL
from clef_cluster.versions import bin_dir

NAME = REAL_POOL.node_name(0)
GPU_RESOURCE = "nvidia.com/gpu"
CNI_BIN = Path("/usr/lib/cni")
IPTABLES_TOOLS = ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore")
CGROUP_ROOT = Path("/sys/fs/cgroup")
SHIM_SOCKETS = Path("/run/containerd/s")
LEGACY_LOG_LINKS = Path("/var/log/containers")  # kubelet links each container's log here, whatever its root


class NodeError(RuntimeError):
    """The node's processes could not be started, checked or cleaned up."""


@dataclass(frozen=True)
class Node:
    """The real node of a cluster: its folder (``<cluster>/node``) and network namespace."""

    folder: Path
    network: netns.NodeNetwork

    @property
    def socket(self) -> Path:
        """containerd's socket (its CRI endpoint)."""
        return self.folder / "containerd" / "containerd.sock"

    @property
    def cgroup(self) -> str:
        """kubelet's cgroup root (every pod's cgroups are below it, in each v1 hierarchy)."""
        return f"/clef-{self.network.slot}"

    @property
    def tool_path(self) -> Path:
        """A folder put first on the node's PATH: ``iptables*`` there are the nf_tables backend's."""
        return self.folder / "bin"

    def env(self) -> dict[str, str]:
        """The node processes' environment."""
        return {**os.environ, "PATH": f"{self.tool_path}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``ctr`` against the node's containerd, in the CRI's ``k8s.io`` namespace."""
        done = subprocess.run(
            ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode:
            raise NodeError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done

    def import_image(self, archive: Path) -> list[str]:
        """Import an OCI (or docker) image archive into the node's containerd; the image references it holds.
        Pods use them with ``imagePullPolicy: Never`` (or ``IfNotPresent`` with a tag other than ``latest``)."""
        out = self.ctr("images", "import", "--all-platforms", str(archive)).stdout
        return [line.split()[1] for line in out.splitlines() if line.startswith("unpacking ")]

    def images(self) -> list[str]:
        """The image references in the node's containerd."""
        return self.ctr("images", "list", "--quiet").stdout.split()

    def service_routed(self, cluster_ip: str, port: int, protocol: str = "tcp") -> bool:
        """Whether kube-proxy's rules translate ``cluster_ip:port`` yet (its ``service-ips`` map has the element)."""
        done = self.network.run("nft", "-j", "list", "map", "ip", "kube-proxy", "service-ips", check=False)
        if done.returncode:
            return False
        for entry in json.loads(done.stdout)["nftables"]:
            for element in (entry.get("map") or {}).get("elem", []):
                key = element[0]["concat"] if isinstance(element, list) else []
                if key[:3] == [cluster_ip, protocol, port]:
                    return True
        return False

    def legacy_rules(self) -> list[str]:
        """Rules in the namespace's legacy (xtables) iptables: there must be none, every rule of the node's being in
        nf_tables (kube-proxy's own table, and kubelet's and portmap's through ``iptables-nft``); rules split over
        both backends are what ``iptables`` calls "incompatible"."""
        saved = self.network.run("iptables-legacy-save").stdout
        return [line for line in saved.splitlines() if line.startswith("-A ")]

    # What ``up`` writes and starts.

    def write_configs(self, server_kubeconfigs: dict[str, Path], ca: Path, serving: tuple[Path, Path]) -> None:
        """containerd's, the CNI's, kubelet's and kube-proxy's configuration, the sandbox image, and the tool path."""
        for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "bin", "images"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        for tool in IPTABLES_TOOLS:
            link = self.tool_path / tool
            link.unlink(missing_ok=True)
            link.symlink_to(f"/usr/sbin/{tool.replace('tables', 'tables-nft', 1)}")
        (self.folder / "containerd" / "config.toml").write_text(self._containerd_config())
        (self.folder / "cni" / "net.d" / "10-clef.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        (self.folder / "kubelet.yaml").write_text(yaml.safe_dump(self._kubelet_config(ca, serving)))
        (self.folder / "kube-proxy.yaml").write_text(yaml.safe_dump(self._kube_proxy_config(server_kubeconfigs)))
        self.sandbox_image().write(self.folder / "images" / "pause.tar")

    def containerd_args(self) -> list[str]:
        """The containerd command, in the namespace."""
        return self.network.command(["containerd", f"--config={self.folder / 'containerd' / 'config.toml'}"])

    def kubelet_args(self, kubeconfig: Path) -> list[str]:
        """The kubelet command, in the namespace, registering this node with its labels."""
        labels = ",".join(f"{key}={value}" for key, value in sorted(labels_of_node().items()))
        return self.network.command(
            [
                str(bin_dir() / "kubelet"),
                f"--config={self.folder / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.folder / 'kubelet'}",
                f"--hostname-override={NAME}",
                f"--node-ip={self.network.node_ip}",
                f"--node-labels={labels}",
            ]
        )

    def kube_proxy_args(self) -> list[str]:
        """The kube-proxy command, in the namespace."""
        return self.network.command([str(bin_dir() / "kube-proxy"), f"--config={self.folder / 'kube-proxy.yaml'}"])

    def containerd_ready(self) -> bool:
        """Whether containerd answers on its socket."""
        return self.socket.exists() and self.ctr("version", check=False, timeout=10).returncode == 0

    def make_cgroups(self) -> None:
        """kubelet's cgroup root in every v1 hierarchy (kubelet refuses a root that does not exist)."""
        for hierarchy in _v1_hierarchies():
            path = hierarchy / self.cgroup.lstrip("/")
            path.mkdir(exist_ok=True)
            if (hierarchy / "cpuset.cpus").exists():  # a new cpuset starts empty: give it its parent's
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text((hierarchy / name).read_text())

    @staticmethod
    def sandbox_image() -> oci.ScratchImage:
        """The ``pause`` program, FROM scratch, named after the build it comes from."""
        return oci.ScratchImage(
            f"localhost/clef-cluster/pause:{bin_dir().parent.name}", bin_dir() / "pause", ("/pause",), "65535:65535"
        )

    @staticmethod
    def echoserver_image() -> oci.ScratchImage:
        """The test workload (``echoserver serve`` on :8080; ``echoserver dial HOST:PORT``), FROM scratch."""
        return oci.ScratchImage(
            f"localhost/clef-cluster/echoserver:{bin_dir().parent.name}",
            bin_dir() / "echoserver",
            ("/echoserver", "serve"),
        )

    # What ``down`` removes once the recorded processes have stopped.

    def clean(self) -> None:
        """End every process left in the namespace or in the node's cgroups (shims, containers), unmount what is
        mounted under the node folder, remove the cgroups, kubelet's log links and the namespace."""
        deadline = time.monotonic() + 30
        sockets = self.shim_sockets()
        while pids := self._leftover_pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise NodeError(f"processes {pids} of {self.network.name} did not end")
            time.sleep(0.1)
        for path in sockets:  # a shim removes its socket when it exits, not when it is killed
            path.unlink(missing_ok=True)
        for mount in reversed(_mounts_under(self.folder)):
            subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
        if left := _mounts_under(self.folder):
            raise NodeError(f"still mounted under {self.folder}: {left}")
        for hierarchy in _v1_hierarchies():
            _remove_cgroup(hierarchy / self.cgroup.lstrip("/"))
        logs = self.folder / "pod-logs"
        if LEGACY_LOG_LINKS.is_dir():
            for link in LEGACY_LOG_LINKS.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(f"{logs}/"):
                    link.unlink()
        netns.delete(self.network)

    def shim_sockets(self) -> list[Path]:
        """The sockets of this containerd's running shims: ``/run/containerd/s/<sha256 of address/namespace/id>``
        (containerd 1.6 puts them there whatever its state folder)."""
        sockets = []
        for pid in netns.processes_in(self.network):
            with contextlib.suppress(OSError):
                args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
                flags = dict(zip(args[1::2], args[2::2], strict=False)) if "-address" in args else {}
                if flags.get("-address") == str(self.socket):
                    key = f"{self.socket}/{flags['-namespace']}/{flags['-id']}".encode()
                    sockets.append(SHIM_SOCKETS / hashlib.sha256(key).hexdigest())
        return sockets

    def _leftover_pids(self) -> list[int]:
        pids = set(netns.processes_in(self.network))
        for hierarchy in _v1_hierarchies()[:1]:
            root = hierarchy / self.cgroup.lstrip("/")
            for procs in root.rglob("cgroup.procs") if root.is_dir() else []:
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        pids.discard(os.getpid())
        return sorted(pids)

    def _containerd_config(self) -> str:
        base = self.folder / "containerd"
        cri = '[plugins."io.containerd.grpc.v1.cri"]'
        runc = f"{cri[:-1]}.containerd.runtimes.runc]"
        return "\n".join(
            [
                "version = 2",
                f"root = {json.dumps(str(base / 'root'))}",
                f"state = {json.dumps(str(base / 'state'))}",
                "[grpc]",
                f"  address = {json.dumps(str(self.socket))}",
                '[plugins."io.containerd.internal.v1.opt"]',
                f"  path = {json.dumps(str(base / 'opt'))}",
                cri,
                f"  sandbox_image = {json.dumps(self.sandbox_image().reference)}",
                "  restrict_oom_score_adj = true",
                "  netns_mounts_under_state_dir = true",
                "  disable_apparmor = true",
                f"{cri[:-1]}.containerd]",
                '  snapshotter = "overlayfs"',
                '  default_runtime_name = "runc"',
                runc,
                '  runtime_type = "io.containerd.runc.v2"',
                f"{runc[:-1]}.options]",
                '  BinaryName = "runc"',
                f"  Root = {json.dumps(str(base / 'runc'))}",
                "  SystemdCgroup = false",
                f"{cri[:-1]}.cni]",
                f"  bin_dir = {json.dumps(str(CNI_BIN))}",
                f"  conf_dir = {json.dumps(str(self.folder / 'cni' / 'net.d'))}",
                "  max_conf_num = 1",
                "",
            ]
        )

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0",
            "name": "clef",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.network.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.folder / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _kubelet_config(self, ca: Path, serving: tuple[Path, Path]) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.network.node_ip,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "tlsCertFile": str(serving[0]),
            "tlsPrivateKeyFile": str(serving[1]),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup,
            "failCgroupV1": False,
            "failSwapOn": False,
            "resolvConf": "",  # pods get no nameserver of the host's (there is no route to one)
            "podLogsDir": str(self.folder / "pod-logs"),
            "staticPodPath": "",
            "maxPods": 30,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # Absolute and small: the node shares this machine's disk with everything else, and 1 % of a large shared
            # disk (2.5 GB of 252 GB) was crossed by other work's writes, which evicted the pods and garbage-collected
            # the sandbox image (no registry to pull it back from), so no pod could start again.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "256Mi",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "256Mi",
            },
        }

    def _kube_proxy_config(self, kubeconfigs: dict[str, Path]) -> dict[str, Any]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(kubeconfigs["kube-proxy"])},
            "hostnameOverride": NAME,
            "bindAddress": self.network.node_ip,
            "clusterCIDR": self.network.pod_cidr,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            "masqueradeAll": True,
            "nodePortAddresses": [f"{self.network.node_ip}/32"],
            # Leave the kernel's conntrack settings alone (some are machine-wide).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
                "udpTimeout": "0s",
                "udpStreamTimeout": "0s",
            },
        }


def labels_of_node() -> dict[str, str]:
    """The labels the node registers with: its pool's (GKE pool label), GPU Feature Discovery's for one H100."""
    return {
        REAL_POOL.label_key: REAL_POOL.name,
        **REAL_POOL.gfd_labels(),
        "node.kubernetes.io/instance-type": REAL_POOL.instance_type,
    }


def gpu_capacity_patch() -> list[dict[str, Any]]:
    """The node-status JSON patch that advertises the pool's GPUs as an extended resource (as a device plugin
    would; kubelet keeps an extended resource it did not set and copies it to allocatable)."""
    return [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(REAL_POOL.gpus)}]


def _v1_hierarchies() -> list[Path]:
    """The mount points of the cgroup v1 hierarchies (``memory`` first: its ``cgroup.procs`` list every pod)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] == "cgroup":
            found.append(Path(fields[4]))
    return sorted(found, key=lambda path: path.name != "memory")


def _mounts_under(folder: Path) -> list[str]:
    """Mount points below ``folder``, in mount order."""
    prefix = f"{folder}/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix) or point == str(folder):
            points.append(point)
    return points


def _remove_cgroup(path: Path) -> None:
    """Remove a cgroup and every cgroup below it, deepest first."""
    if not path.is_dir():
        return
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()
