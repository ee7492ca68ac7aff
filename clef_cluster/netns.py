"""The network namespace a cluster's real node lives in, and the only way in or out of it: one veth pair.

Pod and Service addresses are private ranges that must never reach a network outside this machine, so:

- the node (containerd, kubelet, kube-proxy, the CNI bridge and every pod) runs in a namespace ``clef-<slot>``
  made here, joined to the host by a veth pair on a /30 link subnet (host ``10.243.<slot>.1``, node
  ``10.243.<slot>.2``, the node's ``eth0``). Inside there is NO default route: the link subnet, the pods' bridge
  (``10.244.<slot>.0/24``) and the Service range (routed to a sink: a veth whose peer is down, where a packet
  kube-proxy did not translate is dropped) are all it can reach; any other address fails there at once with
  "network is unreachable";
- on the host, the pod, Service and link ranges and kwok's fake addresses are ``unreachable`` routes (a Service
  address from the host, or a pod of a cluster that is gone, fails locally instead of following the default
  route); the one /24 of each running cluster's pods is routed into its namespace, so the API server reaches
  pods (aggregated APIs, webhooks);
- the API server listens on the host end of the link, which pods reach through the ``kubernetes`` Service.

Several clusters run at once, one slot each. A namespace with no process left in it after :data:`STALE_AFTER_S`
is a crashed run's leftover: the next ``create`` removes it with its veth (and the host routes go with the veth).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

SERVICE_CIDR = "10.96.0.0/16"
POD_RANGE = "10.244.0.0/16"  # one /24 per slot
LINK_RANGE = "10.243.0.0/16"  # one /30 per slot
KWOK_RANGE = "10.0.0.0/16"  # kwok's fake nodes' and pods' addresses (nothing answers there)
GUARDED = (SERVICE_CIDR, POD_RANGE, LINK_RANGE, KWOK_RANGE)
PREFIX = "clef-"
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
LOCK = Path("/run/clef-cluster.lock")
SLOTS = range(1, 251)
STALE_AFTER_S = 120.0
NODE_IF = "eth0"
SERVICE_IF = "services"
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


class NetworkError(RuntimeError):
    """The namespace could not be made, or the host's routes overlap the ranges it needs."""


@dataclass(frozen=True)
class NodeNetwork:
    """The namespace of slot ``slot``: its name, interfaces and addresses."""

    slot: int

    @property
    def name(self) -> str:
        """The namespace's name (``ip netns``)."""
        return f"{PREFIX}{self.slot}"

    @property
    def path(self) -> Path:
        """Its bind mount, what ``nsenter --net=`` and ``setns`` open."""
        return NETNS_DIR / self.name

    @property
    def host_if(self) -> str:
        """The host's end of the veth pair."""
        return f"clef{self.slot}h"

    @property
    def host_ip(self) -> str:
        """The host's address on the link: the API server listens here."""
        return f"10.243.{self.slot}.1"

    @property
    def node_ip(self) -> str:
        """The node's address on the link (its InternalIP: kubelet's API for logs and exec)."""
        return f"10.243.{self.slot}.2"

    @property
    def pod_cidr(self) -> str:
        """The node's pod range (the CNI bridge's host-local range)."""
        return f"10.244.{self.slot}.0/24"

    def command(self, args: list[str]) -> list[str]:
        """``args`` run in the namespace (its network only: the mount namespace stays the host's, so kubelet's
        volume mounts are the ones containerd sees)."""
        return ["nsenter", f"--net={self.path}", "--", *args]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command in the namespace, output captured."""
        return subprocess.run(self.command(list(args)), capture_output=True, text=True, check=check, timeout=60)

    def call(self, function: Callable[[], T]) -> T:
        """``function()`` on a thread that has joined the namespace: the sockets it opens live there (a client of a
        Service or a pod). Its result is returned, its exception raised."""

        def inside() -> T:
            with self.path.open("rb") as handle:
                if _libc().setns(handle.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {self.path} failed")
            return function()

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"in-{self.name}") as pool:  # its thread ends here
            return pool.submit(inside).result()

    def exists(self) -> bool:
        """Whether the namespace is there."""
        return self.path.exists()

    @property
    def etc(self) -> Path:
        """``/etc/netns/<name>``: ``ip netns exec`` mounts the files here over /etc's (hosts, resolv.conf)."""
        return ETC_NETNS / self.name

    def client_command(self, args: list[str], hosts: dict[str, str]) -> list[str]:
        """``args`` as a client in the namespace (``ip netns exec``: a mount namespace of its own too) that resolves
        the names in ``hosts`` (name -> address) and asks no nameserver (there is no route to one)."""
        self.etc.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", *(f"{address} {name}" for name, address in sorted(hosts.items()))]
        (self.etc / "hosts").write_text("\n".join(lines) + "\n")
        (self.etc / "resolv.conf").write_text("# no nameserver: Service names are in /etc/hosts\n")
        return ["ip", "netns", "exec", self.name, *args]


def create() -> NodeNetwork:
    """A new namespace on a free slot, linked to the host, with the host's guard routes in place."""
    with _locked():
        _sweep_stale()
        _check_host_routes()
        for slot in SLOTS:
            network = NodeNetwork(slot)
            if _ip("netns", "add", network.name, check=False).returncode == 0:
                break
        else:
            raise NetworkError(f"no free slot: {len(SLOTS)} namespaces named {PREFIX}* exist")
        try:
            _wire(network)
        except BaseException:
            _remove(network)
            raise
    return network


def delete(network: NodeNetwork) -> None:
    """Remove the namespace (its veth, its iptables/nftables rules and its routes go with it); the host's guard
    routes go with the last cluster's namespace."""
    with _locked():
        _remove(network)


def _wire(network: NodeNetwork) -> None:
    slot = network.slot
    _ip("link", "add", network.host_if, "type", "veth", "peer", "name", NODE_IF, "netns", network.name)
    _ip("addr", "add", f"{network.host_ip}/30", "dev", network.host_if)
    _ip("link", "set", network.host_if, "up")
    inside = ("-n", network.name)
    _ip(*inside, "link", "set", "lo", "up")
    _ip(*inside, "addr", "add", f"{network.node_ip}/30", "dev", NODE_IF)
    _ip(*inside, "link", "set", NODE_IF, "up")
    # A sink for Service addresses: one end of a veth pair whose other end stays down (no dummy driver needed).
    _ip(*inside, "link", "add", SERVICE_IF, "type", "veth", "peer", "name", f"{SERVICE_IF}-sink")
    _ip(*inside, "link", "set", SERVICE_IF, "up")
    _ip(*inside, "route", "add", SERVICE_CIDR, "dev", SERVICE_IF)
    for key, value in (("net.ipv4.ip_forward", "1"), ("net.ipv6.conf.all.disable_ipv6", "1")):
        network.run("sysctl", "-q", "-w", f"{key}={value}")
    for guarded in GUARDED:
        if _ip("route", "add", "unreachable", guarded, check=False).returncode:
            _ip("route", "replace", "unreachable", guarded)
    _ip("route", "add", network.pod_cidr, "via", network.node_ip, "dev", network.host_if)
    routes = _ip("-n", network.name, "-j", "-4", "route").stdout
    if any(route["dst"] == "default" for route in json.loads(routes)):
        raise NetworkError(f"{network.name} has a default route (slot {slot})")


def _remove(network: NodeNetwork) -> None:
    _ip("link", "del", network.host_if, check=False)  # takes its peer, and the pod route, with it
    _ip("netns", "del", network.name, check=False)
    shutil.rmtree(network.etc, ignore_errors=True)
    with contextlib.suppress(OSError):  # /etc/netns itself, once no namespace has files there
        ETC_NETNS.rmdir()
    if not any(path.name.startswith(PREFIX) for path in _namespaces()):
        for guarded in GUARDED:
            _ip("route", "del", "unreachable", guarded, check=False)


def _sweep_stale() -> None:
    """Remove namespaces of ours that hold no process and are older than :data:`STALE_AFTER_S`."""
    now = time.time()
    used = _used_namespaces()
    for path in _namespaces():
        if now - path.stat().st_mtime > STALE_AFTER_S and path.stat().st_ino not in used:
            _remove(NodeNetwork(int(path.name.removeprefix(PREFIX))))


def _namespaces() -> list[Path]:
    if not NETNS_DIR.is_dir():
        return []
    return [p for p in NETNS_DIR.iterdir() if p.name.startswith(PREFIX) and p.name.removeprefix(PREFIX).isdigit()]


def _used_namespaces() -> set[int]:
    """The inodes of the network namespaces some process is in."""
    used = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            used.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
        except OSError:
            continue
    return used


def processes_in(network: NodeNetwork) -> list[int]:
    """The pids of the processes in the namespace (those ``down`` must end)."""
    try:
        inode = network.path.stat().st_ino
    except OSError:
        return []
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino == inode:
                pids.append(int(pid))
        except OSError:
            continue
    return pids


def _check_host_routes() -> None:
    """Refuse when a host route other than ours overlaps the ranges the namespaces use."""
    guarded = [ipaddress.ip_network(r) for r in GUARDED]
    for route in json.loads(_ip("-j", "-4", "route").stdout):
        if route["dst"] == "default" or route.get("dev", "").startswith("clef") or route.get("type") == "unreachable":
            continue
        dst = ipaddress.ip_network(route["dst"], strict=False)
        if any(dst.overlaps(g) for g in guarded):
            raise NetworkError(f"the host routes {dst} (dev {route.get('dev')}), which overlaps {', '.join(GUARDED)}")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@contextmanager
def _locked() -> Iterator[None]:
    """One namespace change at a time on this machine (slots and the shared guard routes)."""
    with LOCK.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
