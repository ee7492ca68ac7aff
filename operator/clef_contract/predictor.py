"""The predictor container's contract: its port, model path, user and compile-cache layout."""

from __future__ import annotations

# The port `python -m predictor` serves HTTP on inside the pod, and where KServe's storage initializer puts
# the release.
PREDICTOR_PORT = 8080
MODEL_DIR = "/mnt/models"

# The predictor image's unprivileged user and group: docker/predictor.Dockerfile creates them
# (`useradd --uid 10001`) and runs as `USER 10001:10001`; tests/deploy/test_dockerfiles.py fails when the two
# drift apart. The InferenceServices' pods use the group as fsGroup, so that Kubernetes makes the volumes it
# can manage (emptyDir, most claims; not hostPath) writable by the predictor.
PREDICTOR_UID = 10001
PREDICTOR_GID = 10001
# The image's $HOME (`--home-dir` there): a writable scratch volume under the read-only root filesystem.
PREDICTOR_HOME = "/home/clef"

# The compile cache: vLLM's torch.compile artifacts, Inductor's cache, Triton's kernels and Triton's autotuning
# results on a volume, so a restarted predictor loads them instead of compiling and benchmarking kernels again
# (the measured warm and cold ready times: BENCHMARKS.md, the verdict table's start-time row).
COMPILE_CACHE_VOLUME = "compile-cache"
COMPILE_CACHE_DIR = "/var/cache/clef"
COMPILE_CACHE_ENV: dict[str, str] = {
    "VLLM_CACHE_ROOT": f"{COMPILE_CACHE_DIR}/vllm",
    "TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE_DIR}/inductor",
    "TRITON_CACHE_DIR": f"{COMPILE_CACHE_DIR}/triton",
    "TRITON_CACHE_AUTOTUNING": "1",
}

# Probes. Readiness is KServe's V1 model status, which answers 200 only once warm-up has finished and the engine
# is alive. Liveness fails only when the process can no longer serve; the predictor also exits when its engine
# dies, so Kubernetes restarts it either way.
LIVENESS_PATH = "/health/live"

# Prometheus text of the predictor's own metrics (clef_queue_depth, clef_engine_in_flight, clef_ready, ...), on
# the HTTP port, without API keys.
METRICS_PATH = "/metrics"


def scrape_annotations() -> dict[str, str]:
    """The predictor pods' annotations that tell Prometheus to scrape them (the prometheus.io/* convention of
    Prometheus' own example Kubernetes configuration, which needs no Prometheus Operator CRDs)."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(PREDICTOR_PORT),
        "prometheus.io/path": METRICS_PATH,
    }


def readiness_path(model_name: str) -> str:
    """The warm-up-gated readiness endpoint of a predictor serving ``model_name``."""
    return f"/v1/models/{model_name}"


# Optional API keys: the operator mounts a Secret's key at this path and passes `--api-key-file` with it.
API_KEY_DIR = "/etc/clef/api-keys"
API_KEY_FILE = f"{API_KEY_DIR}/keys"
