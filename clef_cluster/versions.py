"""The pinned versions of the cluster's components and where their build is cached.

Kubernetes 1.34 matches the kubectl and helm the project installs (``scripts/install_k8s_tools.sh``: kubectl
v1.34.5, helm v3.19 built on Kubernetes 1.34 libraries) and KServe v0.20.0's controller, whose go.mod pins the
k8s.io libraries to v0.34. etcd v3.6.4 is the release Kubernetes 1.34 itself is tested with; kwok v0.7.0 is
the newest kwok built on libraries older than 1.36 (v0.8.0 needs v0.36). Kubernetes' and etcd's versions live in
``go/go.mod``; kwok and KServe build from their own modules, so their versions are here.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

GO_DIR = Path(__file__).parent / "go"
KSERVE_MODULE = "github.com/kserve/kserve"
KSERVE_VERSION = "v0.20.0"
KWOK_MODULE = "sigs.k8s.io/kwok"
KWOK_VERSION = "v0.7.0"
# The metrics pipeline (clef_cluster.metrics): prometheus-adapter v0.12.0, the newest release, built on the k8s.io
# v0.30 libraries; it serves custom.metrics.k8s.io v1beta1 and v1beta2 (Kubernetes 1.34's HorizontalPodAutoscaler
# asks for v1beta2 first). Prometheus itself is Debian's package (scripts/install_container_tools.sh).
ADAPTER_MODULE = "sigs.k8s.io/prometheus-adapter"
ADAPTER_VERSION = "v0.12.0"
# KEDA (clef_cluster.keda): v2.21.0, the newest release whose go.mod asks for a Go this project's toolchain has
# (v2.21.1 needs a newer Go); its operator and metrics API server build from the module, its CRDs and ClusterRole
# are read from the same module source.
KEDA_MODULE = "github.com/kedacore/keda/v2"
KEDA_VERSION = "v2.21.0"
CACHE_ENV = "CLEF_CLUSTER_CACHE"


def go_mod_version(module: str) -> str:
    """The version of ``module`` that go/go.mod requires."""
    match = re.search(rf"^\s*{re.escape(module)} (v\S+)$", (GO_DIR / "go.mod").read_text(), re.MULTILINE)
    if match is None:
        raise LookupError(f"{module} is not required by {GO_DIR / 'go.mod'}")
    return match.group(1)


def cache_root() -> Path:
    """Where builds are cached: $CLEF_CLUSTER_CACHE, else ~/.cache/clef-serving/cluster."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "clef-serving" / "cluster"
    return Path(os.environ.get(CACHE_ENV, default))


def build_key() -> str:
    """A hash of everything that decides the binaries: go.mod, go.sum, the Go sources, kwok's and KServe's
    versions, and the build commands (build.py)."""
    digest = hashlib.sha256(f"{KWOK_VERSION} {KSERVE_VERSION}".encode())
    digest.update((Path(__file__).parent / "build.py").read_bytes())
    for path in sorted(GO_DIR.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(GO_DIR).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def bin_dir() -> Path:
    """The folder holding this build's binaries."""
    return cache_root() / build_key() / "bin"
