"""Build the cluster's binaries once per version set, into a cache outside the repository.

The control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd) and the real node's Kubernetes
parts (kubelet, kube-proxy) plus its two small programs (the sandbox's ``pause`` and the test workload
``echoserver``) are one ``go build`` of ``go/go.mod``, so the packages they share compile once; kwok and KServe's
manager build from their own modules (their go.mod files pin and replace what they need; neither compiles
against the other's k8s.io libraries). Go's module and build caches live beside the binaries, so the whole build
can be measured and removed as one folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clef_cluster.versions import (
    GO_DIR,
    KSERVE_MODULE,
    KSERVE_VERSION,
    KWOK_MODULE,
    KWOK_VERSION,
    bin_dir,
    cache_root,
    go_mod_version,
)

CONTROL_PLANE: dict[str, str] = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "etcd": "./etcd",
}
# The real node (clef_cluster.node): kubelet and kube-proxy from the same Kubernetes module, the sandbox image's
# program and a test workload, both shipped as FROM-scratch images (clef_cluster.oci).
NODE: dict[str, str] = {
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "pause": "./pause",
    "echoserver": "./echoserver",
}
KUBERNETES = {**CONTROL_PLANE, **NODE}
KWOK = "kwok"
KSERVE_MANAGER = "kserve-manager"
# Binaries built from their own module: name -> (module, version, package).
OWN_MODULE: dict[str, tuple[str, str, str]] = {
    KWOK: (KWOK_MODULE, KWOK_VERSION, "./cmd/kwok"),
    KSERVE_MANAGER: (KSERVE_MODULE, KSERVE_VERSION, "./cmd/manager"),
}
GO_BUILD = ("go", "build", "-trimpath")
LDFLAGS = "-s -w"
# Where Kubernetes' binaries read the version they report (GET /version, --version): a build outside
# Kubernetes' own scripts would say v0.0.0-master, which Helm's kubeVersion check and clients refuse.
VERSION_PACKAGE = "k8s.io/component-base/version"


def kubernetes_ldflags() -> str:
    """The linker flags that stamp the control plane with the Kubernetes version go/go.mod pins."""
    version = go_mod_version("k8s.io/kubernetes")
    major, minor = version.lstrip("v").split(".")[:2]
    stamps = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    return " ".join([LDFLAGS, *(f"-X {VERSION_PACKAGE}.{key}={value}" for key, value in stamps.items())])


def go_env() -> dict[str, str]:
    """Go's environment: caches under the cluster cache, static binaries, no VCS stamping, no toolchain fetch."""
    go_cache = cache_root() / "go"
    return {
        **os.environ,
        "GOMODCACHE": str(go_cache / "mod"),
        "GOCACHE": str(go_cache / "build"),
        "GOFLAGS": "-buildvcs=false -mod=readonly",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
    }


def missing(with_kserve: bool) -> list[str]:
    """The binaries this version set still lacks."""
    wanted = [*KUBERNETES, KWOK, *([KSERVE_MANAGER] if with_kserve else [])]
    return [name for name in wanted if not (bin_dir() / name).is_file()]


def build(with_kserve: bool = True, log: bool = True) -> Path:
    """Build whatever binaries are missing and return their folder; a no-op when all are there."""
    target = bin_dir()
    with _lock(target.parent / "build.lock"):
        todo = missing(with_kserve)
        if not todo:
            return target
        target.mkdir(parents=True, exist_ok=True)
        if any(name in KUBERNETES for name in todo):
            with _timed(log, "the control plane and the node"):
                _go_build(GO_DIR, list(KUBERNETES.values()), target, kubernetes_ldflags())
        for name in (n for n in OWN_MODULE if n in todo):
            module, version, package = OWN_MODULE[name]
            with _timed(log, name):
                _go_build(module_source(module, version), [package], target, LDFLAGS, rename={Path(package).name: name})
    return target


def go_version() -> str:
    """The Go toolchain's version (part of the cache key of a binary built outside the version set)."""
    return subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


def module_source(module: str, version: str) -> Path:
    """A Go module's source (downloaded into the module cache once)."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        env={**go_env(), "GOFLAGS": "-buildvcs=false"},
        cwd=_workdir(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(json.loads(out)["Dir"])


def kserve_source() -> Path:
    """KServe's module source at the pinned version."""
    return module_source(KSERVE_MODULE, KSERVE_VERSION)


def _go_build(
    module_dir: Path, packages: list[str], target: Path, ldflags: str, rename: dict[str, str] | None = None
) -> None:
    """``go build`` the packages in ``module_dir`` into a scratch folder, then move the binaries into ``target``."""
    scratch = _workdir() / f"out-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        subprocess.run(
            [*GO_BUILD, f"-ldflags={ldflags}", "-o", f"{scratch}/", *packages], cwd=module_dir, env=go_env(), check=True
        )
        for binary in scratch.iterdir():
            binary.replace(target / (rename or {}).get(binary.name, binary.name))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _workdir() -> Path:
    path = cache_root() / "work"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _timed(log: bool, what: str) -> Iterator[None]:
    start = time.monotonic()
    if log:
        print(f"building {what} (first time for these versions; cached in {cache_root()})", flush=True)
    yield
    if log:
        print(f"built {what} in {time.monotonic() - start:.0f} s", flush=True)


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One build at a time per version set (parallel test runs wait for the first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
