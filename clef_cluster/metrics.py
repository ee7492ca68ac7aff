"""The metrics pipeline's Prometheus: Debian's ``prometheus`` package, scraping the pods the chart annotates.

``up(..., with_metrics=True)`` (``python -m clef_cluster up --metrics``) starts, after the rest of the cluster:
``pod-targets`` (clef_cluster.pod_targets: the annotated pods' addresses as Prometheus file_sd targets) ->
Prometheus on 127.0.0.1 only (it reaches pod addresses through the host's route into the node's namespace) ->
prometheus-adapter (clef_cluster.adapter) registered with the API server's aggregation layer as
custom.metrics.k8s.io, which the HorizontalPodAutoscaler controller reads.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

JOB = "clef-predictors"
# Short enough that a test sees a load within seconds; a platform's Prometheus usually scrapes every 15-30 s,
# which adds that much to the time before the HorizontalPodAutoscaler sees a load (docs/autoscaling.md).
SCRAPE_INTERVAL_S = 5
RETENTION = "1d"


class PrometheusMissingError(RuntimeError):
    """Debian's prometheus package is not installed."""


def prometheus_binary() -> str:
    """Debian's Prometheus (scripts/install_container_tools.sh installs the package)."""
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusMissingError(
            "the metrics pipeline needs Prometheus: run scripts/install_container_tools.sh (Debian's prometheus)"
        )
    return found


def config(targets_file: Path) -> dict[str, Any]:
    """Prometheus' configuration: one job scraping the targets that clef_cluster.pod_targets writes."""
    interval = f"{SCRAPE_INTERVAL_S}s"
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": f"{SCRAPE_INTERVAL_S - 1}s"},
        "scrape_configs": [{"job_name": JOB, "file_sd_configs": [{"files": [str(targets_file)]}]}],
    }


def args(config_file: Path, data: Path, port: int) -> list[str]:
    """Prometheus' command line: listening on 127.0.0.1 only, its data under the cluster folder."""
    return [
        prometheus_binary(),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
