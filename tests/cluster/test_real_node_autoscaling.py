"""Autoscaling on real metrics from real pods: a deployment-backend pool whose HorizontalPodAutoscaler reads the
predictor's own ``clef_queue_depth`` per pod (``autoscaling.podMetric``) through the metrics pipeline (Prometheus
scraping the pods by their prometheus.io/* annotations, prometheus-adapter serving custom.metrics.k8s.io), on the
real node with the CPU predictor image.

The last test switches the same pool to ``autoscaling.keda``: KEDA's operator and metrics server (built from KEDA's
module, clef_cluster.keda) scale it through the external metrics API on a Prometheus trigger.

Its own cluster (control plane, the real node advertising two GPUs, the metrics pipeline, KEDA; no KServe, so the
chart's operator picks the deployment backend) on a worker of its own (tests/worker_groups.py). The tests run in
order on one ClefDecision. The figures (load start to the second replica Ready, load end to the
scale-down) are printed; docs/autoscaling.md and the README quote them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clef_cluster import node
from clef_cluster.cluster import Cluster
from clef_cluster.storage import MODELS_CLAIM, make_volume_folders, namespace_with_claims
from clef_contract.container import CONTAINER_NAME
from clef_operator.constants import PREDICTOR_LABEL
from predictor.demo import demo_release
from tests.cluster.helpers import condition, is_ready
from tests.cluster.kube import REPO, Kube, PodLogs, cluster_for
from tests.cluster.test_real_node_e2e import REQUEST, install_chart_with_our_images, parse_time, summary
from tests.polling import eventually

NS = "autoscale"
DECISION = "clef-scale"
DEPLOYMENT = f"{DECISION}-real-pool"  # the pool's Deployment, Service and HorizontalPodAutoscaler
URL = f"http://{DEPLOYMENT}.{NS}.svc"
TARGET = 2  # clef_queue_depth per pod
START_S = 600.0  # a predictor pod's start (image, engine, warm-up) on a busy 2-core machine
SCALE_S = 300.0  # the longest wait for the autoscaler to act once its window has passed
DASHBOARD = REPO / "charts" / "clef-serving" / "dashboards" / "clef-predictors.json"
# Short windows so that the test sees both moves within minutes (the defaults, 60 s and 600 s, are for a real model).
SHORT_WINDOWS = {"scaleUpStabilizationSeconds": 0, "scaleDownStabilizationSeconds": 30}


@pytest.fixture(scope="module")
def scaling_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane, the real node, the metrics pipeline and KEDA (no KServe, no fake pools)."""
    with cluster_for(
        tmp_path_factory, "autoscaling-cluster", with_kserve=False, with_nodes=False, with_node=True, with_keda=True
    ) as running:
        yield running


@pytest.fixture(scope="module")
def kube(scaling_cluster: Cluster) -> Kube:
    return Kube(scaling_cluster)


@pytest.fixture(scope="module")
def two_gpus(kube: Kube) -> None:
    """The real node advertises two GPUs (as a device plugin would), so that two one-GPU replicas fit."""
    patch = [{"op": "replace", "path": "/status/capacity/nvidia.com~1gpu", "value": "2"}]
    kube.run("patch", "node", node.NAME, "--subresource=status", "--type=json", f"--patch={json.dumps(patch)}")
    eventually(
        lambda: kube.get("node", node.NAME)["status"]["allocatable"].get("nvidia.com/gpu") == "2",
        "the node's two GPUs to be allocatable",
    )


@pytest.fixture(scope="module")
def chart(scaling_cluster: Cluster, kube: Kube, two_gpus: None) -> None:
    """The chart installed with our images, the operator as a pod on the real node."""
    install_chart_with_our_images(scaling_cluster, kube)


def decision_body(autoscaling: dict[str, Any]) -> dict[str, Any]:
    """The real-node ClefDecision on the deployment backend, autoscaled on clef_queue_depth per pod."""
    return {
        "apiVersion": "clef-serving.io/v1alpha1",
        "kind": "ClefDecision",
        "metadata": {"name": DECISION, "namespace": NS},
        "spec": {
            "model": {"storageUri": "pvc://clef-models/clef-flash-fp8", "name": "clef-flash"},
            "backend": "deployment",
            "nodePools": {"include": ["real-pool"]},
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "podMetric": {"name": "clef_queue_depth", "target": str(TARGET)},
                **autoscaling,
            },
            "predictor": {
                "maxModelLen": 4096,
                "extraArgs": ["--json-logs"],
                "shmSize": "256Mi",
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "6Gi"}},
            },
        },
    }


@pytest.fixture(scope="module")
def decision(scaling_cluster: Cluster, kube: Kube, chart: None) -> dict[str, Any]:
    """The demo release on the claim, the ClefDecision applied and Ready with one replica."""
    root = scaling_cluster.folder / "volumes"
    target = make_volume_folders(NS, root)[MODELS_CLAIM] / "clef-flash-fp8"
    shutil.copytree(demo_release(), target)
    for path in (target, *target.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    kube.apply(*namespace_with_claims(NS, root))
    kube.apply(decision_body(SHORT_WINDOWS))
    return wait_ready(kube)


def wait_ready(kube: Kube) -> dict[str, Any]:
    try:
        return eventually(
            lambda: (d := kube.get("clefdecision", DECISION, NS)) and is_ready(d) and d, "Ready", timeout=START_S
        )
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{diagnostics(kube)}")


def diagnostics(kube: Kube) -> str:
    shown = [
        kube.run(*args, check=False).stdout
        for args in (
            ("get", "clefdecision", DECISION, f"--namespace={NS}", "-o", "jsonpath={.status}"),
            ("get", "pods,hpa", f"--namespace={NS}", "-o", "wide"),
            ("describe", "hpa", f"--namespace={NS}"),
            ("get", "scaledobjects", f"--namespace={NS}", "-o", "jsonpath={.items[*].status}"),
            ("get", "events", f"--namespace={NS}", "--sort-by=.lastTimestamp"),
        )
    ]
    return "\n".join(shown)


def pods(kube: Kube) -> list[dict[str, Any]]:
    """The pool's predictor pods, terminating ones included."""
    found: list[dict[str, Any]] = kube.get("pods", namespace=NS, selector=f"{PREDICTOR_LABEL}={DEPLOYMENT}")
    return found


def ready_pods(kube: Kube) -> list[dict[str, Any]]:
    return [p for p in pods(kube) if is_ready(p) and not p["metadata"].get("deletionTimestamp")]


def wanted(kube: Kube, autoscaler: str = DEPLOYMENT) -> int:
    """The replicas the HorizontalPodAutoscaler ``autoscaler`` wants now."""
    hpa = kube.get("horizontalpodautoscaler", autoscaler, NS) or {}
    return int((hpa.get("status") or {}).get("desiredReplicas", 0))


def prometheus(cluster: Cluster, query: str) -> dict[str, Any]:
    """Prometheus' instant query API: the whole answer."""
    url = f"{cluster.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=30) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def custom_metric(kube: Kube, metric: str) -> list[dict[str, Any]]:
    """The custom metrics API's values of ``metric`` for the namespace's pods (what the autoscaler reads); none
    until the adapter has found the metric's series (it looks every 15 s)."""
    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/{metric}"
    done = kube.run("get", "--raw", path, check=False)
    if done.returncode:
        assert "could not find the metric" in done.stderr, done.stderr
        return []
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


class Load:
    """tests/cluster/in_namespace.py's load in the node's network namespace, in the background, until stopped."""

    def __init__(self, cluster: Cluster, folder: Path, **job: Any) -> None:
        self.stop_file = folder / "stop"
        self.stop_file.unlink(missing_ok=True)
        spec = {"mode": "load", "url": URL, "request": REQUEST, "fresh": True, "unique": True, "seconds": 1800, **job}
        spec["stop_file"] = str(self.stop_file)
        command = [
            sys.executable, "-m", "clef_cluster", "--dir", str(cluster.folder), "exec", "--",
            sys.executable, str(Path(__file__).with_name("in_namespace.py")),
        ]  # fmt: skip
        job_file = folder / f"load-{time.monotonic_ns()}.json"
        job_file.write_text(json.dumps(spec))
        with job_file.open() as stdin:
            self.process = subprocess.Popen(
                command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        self.started = time.monotonic()

    def stop(self) -> list[dict[str, Any]]:
        """End the load; every request's outcome."""
        self.stop_file.touch()
        out, err = self.process.communicate(timeout=240)
        assert self.process.returncode == 0, err[-3000:]
        outcomes: list[dict[str, Any]] = json.loads(out)
        return outcomes


def wait_until(check: Callable[[], bool], what: str, kube: Kube, timeout: float = SCALE_S) -> float:
    """Poll ``check`` every second; the monotonic time it first held (fails with the cluster's state)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(1.0)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnostics(kube)}")


def test_the_pipeline_reads_the_predictors_gauges(scaling_cluster: Cluster, kube: Kube, decision: Any) -> None:
    """Prometheus scrapes the pod by its annotations, and the custom metrics API serves its gauges."""
    (pod,) = ready_pods(kube)
    name = pod["metadata"]["name"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    query = f'clef_ready{{namespace="{NS}",pod="{name}"}}'
    eventually(  # the first scrape may predate the end of the warm-up
        lambda: [s["value"][1] for s in prometheus(scaling_cluster, query)["data"]["result"]] == ["1"],
        "Prometheus to have scraped the ready predictor",
        timeout=60,
    )
    items = eventually(lambda: custom_metric(kube, "clef_queue_depth"), "the custom metric", timeout=60)
    assert [(item["describedObject"]["name"], item["value"]) for item in items] == [(name, "0")]


def test_load_above_the_target_scales_to_two_and_back_to_one_without_errors(
    scaling_cluster: Cluster, kube: Kube, decision: Any, tmp_path: Path
) -> None:
    """Six clients (queue depth about 6 against a target of 2 per pod) until the second replica has served for
    30 s: the autoscaler wants 2, the new pod is Ready only after its warm-up and gets requests only then, every
    answer a 200 or (what the replicas cannot admit) a 429 with Retry-After, which the clients honour. Then one
    client (depth below the target) while the pool scales back to one replica: every
    answer a 200, no connection broken after a request was sent (the removed pod drains)."""
    scale_up_and_down(scaling_cluster, kube, tmp_path, DEPLOYMENT)


def scale_up_and_down(cluster: Cluster, kube: Kube, folder: Path, autoscaler: str) -> None:
    """The scale test's body (see its doc) on the HorizontalPodAutoscaler ``autoscaler``; prints the times."""
    (first,) = ready_pods(kube)
    heavy = Load(cluster, folder, clients=6, backoff=True)
    wanted_two = wait_until(lambda: wanted(kube, autoscaler) >= 2, "the autoscaler to want 2 replicas", kube)
    two_ready = wait_until(lambda: len(ready_pods(kube)) == 2, "two Ready replicas", kube, timeout=START_S)
    (second,) = [p for p in ready_pods(kube) if p["metadata"]["name"] != first["metadata"]["name"]]
    time.sleep(30)  # both serve
    outcomes = heavy.stop()
    load_ended = time.monotonic()
    print(
        f"\nscale-up ({autoscaler}): the autoscaler wanted 2 replicas {wanted_two - heavy.started:.1f} s after the "
        f"load began, the second replica was Ready {two_ready - heavy.started:.1f} s after; heavy load: "
        f"{summary(outcomes)}"
    )
    # Above the replicas' capacity the predictor sheds what it cannot admit with 429 + Retry-After (its admission,
    # docs/predictor.md): a client's cue to come back, not an error; nothing else but answers. How much is shed
    # depends on the machine (two replicas on two busy cores add no capacity), so it is printed, not bounded.
    shed = [o for o in outcomes if o.get("status") == 429]
    assert all(o.get("retry_after") for o in shed), shed
    assert outcomes and all(o.get("status") in (200, 429) for o in outcomes), unexpected_answers(
        outcomes, {}, expected=(200, 429)
    )
    both_serving = [o for o in outcomes if o["at"] >= two_ready - heavy.started and o["status"] == 200]
    assert both_serving, summary(outcomes)

    logs = kube.run(
        "logs", second["metadata"]["name"], f"--namespace={NS}", f"--container={CONTAINER_NAME}", "--timestamps"
    ).stdout
    served = [line.split(" ", 1)[0] for line in logs.splitlines() if '"path": "/v1/systemone"' in line]
    assert served, logs[-3000:]  # the Service spread new connections over both replicas
    ready_since = parse_time(condition(kube.get("pod", second["metadata"]["name"], NS), "Ready")["lastTransitionTime"])
    assert parse_time(served[0]) >= ready_since.replace(microsecond=0), (served[0], ready_since)

    pod_logs = PodLogs(kube, folder)  # the removed pod's lines, its shutdown's included, outlive the pod
    for pod in ready_pods(kube):
        pod_logs.follow(pod["metadata"]["name"], NS, CONTAINER_NAME)
    try:
        light = Load(cluster, folder, clients=1)
        wanted_one = wait_until(lambda: wanted(kube, autoscaler) == 1, "the autoscaler to want 1 replica", kube)
        one_left = wait_until(lambda: len(pods(kube)) == 1, "one predictor pod left", kube, timeout=START_S)
        time.sleep(10)
        calm = light.stop()
    finally:
        logs_by_pod = pod_logs.stop()
    print(
        f"scale-down ({autoscaler}): the autoscaler wanted 1 replica {wanted_one - load_ended:.1f} s after the load "
        f"ended (window {SHORT_WINDOWS['scaleDownStabilizationSeconds']} s), one pod left "
        f"{one_left - load_ended:.1f} s after; light load during the scale-down: {summary(calm)}"
    )
    assert calm and all(o.get("status") == 200 for o in calm), unexpected_answers(calm, logs_by_pod)


def unexpected_answers(
    outcomes: list[dict[str, Any]], logs_by_pod: dict[str, str], expected: tuple[int, ...] = (200,)
) -> str:
    """The outcomes whose status is not ``expected`` (with their bodies) and, per pod, its log less the lines of
    requests answered 200 and KServe's per-request timing lines: its shutdown, and the lines naming those requests."""
    unexpected = [o for o in outcomes if o.get("status") not in expected]
    shown = [f"{summary(outcomes)}; not {expected}: {json.dumps(unexpected, indent=1)}"]
    for pod, text in logs_by_pod.items():
        kept = [
            line
            for line in text.splitlines()
            if "kserve.trace" not in line and not ('"route": ' in line and '"status": 200' in line)
        ]
        shown.append(f"--- {pod}: {len(text.splitlines())} lines, these {len(kept[-150:])} kept:")
        shown.extend(kept[-150:])
    return "\n".join(shown)


def test_a_load_around_the_target_does_not_flap_with_the_default_windows(
    scaling_cluster: Cluster, kube: Kube, decision: Any, tmp_path: Path
) -> None:
    """The default windows (60 s up, 600 s down): a load that swings around the target every 20 s (3 clients, then
    1; 2 on average, the target) for three minutes moves the replicas at most once. Without windows the
    autoscaler would follow each swing (1.5 times the target, then half of it)."""
    kube.run("patch", "clefdecision", DECISION, f"--namespace={NS}", "--type=json", "--patch=" + json.dumps(
        [{"op": "remove", "path": f"/spec/autoscaling/{field}"} for field in SHORT_WINDOWS]
    ))  # fmt: skip
    eventually(
        lambda: (
            kube.get("horizontalpodautoscaler", DEPLOYMENT, NS)["spec"]["behavior"]["scaleDown"][
                "stabilizationWindowSeconds"
            ]
            == 600
        ),
        "the default windows on the autoscaler",
    )
    assert len(ready_pods(kube)) == 1
    swinging = Load(scaling_cluster, tmp_path, clients=3, phases=[[3, 20], [1, 20]])
    replicas: list[int] = []
    while time.monotonic() - swinging.started < 180:
        replicas.append(int(kube.get("deployment", DEPLOYMENT, NS)["spec"]["replicas"]))
        time.sleep(2)
    outcomes = swinging.stop()
    changes = sum(1 for before, after in zip(replicas, replicas[1:], strict=False) if before != after)
    print(f"\naround the target for 180 s: replicas {sorted(set(replicas))}, {changes} change(s); {summary(outcomes)}")
    assert changes <= 1, replicas
    assert all(o.get("status") == 200 for o in outcomes), summary(outcomes)


def test_every_dashboard_query_runs_on_the_pipelines_prometheus(scaling_cluster: Cluster, kube: Kube) -> None:
    """charts/clef-serving/dashboards/clef-predictors.json: each panel's query (its variables set to this pool)
    succeeds on the Prometheus that scrapes the pods, and the gauges' panels show the real pod."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert queries
    serving = {p["metadata"]["name"] for p in ready_pods(kube)}
    empty = []
    for title, expr in queries:
        query = expr.replace("$namespace", NS).replace("$pod", f"{DEPLOYMENT}-.*").replace("$__rate_interval", "1m")
        answer = prometheus(scaling_cluster, query)
        assert answer["status"] == "success", (title, query, answer)
        gauge = any(name in expr for name in ("clef_ready", "clef_queue_depth", "clef_engine_in_flight"))
        if gauge and not serving & {series["metric"].get("pod") for series in answer["data"]["result"]}:
            empty.append((title, query, answer["data"]["result"]))
    assert empty == []


def test_a_keda_trigger_scales_the_pool_to_two_and_back_to_one(
    scaling_cluster: Cluster, kube: Kube, decision: Any, tmp_path: Path
) -> None:
    """The same pool switched to ``autoscaling.keda`` (a Prometheus trigger on the sum of clef_queue_depth over the
    pool's pods, 2 per replica, on the pipeline's Prometheus) with the short windows: the operator replaces its
    HorizontalPodAutoscaler with a ScaledObject, KEDA's operator makes ``keda-hpa-<pool>`` from it, the external
    metrics API serves the trigger's value through KEDA's metrics server, and the scale test's loads move the pool
    1 -> 2 -> 1 with the same answers."""
    keda = {"metric": "clef_queue_depth", "target": str(TARGET), "serverAddress": scaling_cluster.prometheus_url}
    patch = {"spec": {"autoscaling": {"podMetric": None, "keda": keda, **SHORT_WINDOWS}}}
    kube.run("patch", "clefdecision", DECISION, f"--namespace={NS}", "--type=merge", f"--patch={json.dumps(patch)}")
    autoscaler = f"keda-hpa-{DEPLOYMENT}"

    def keda_in_charge() -> bool:
        scaled = kube.get("scaledobject", DEPLOYMENT, NS)
        return (
            is_ready(scaled)
            and kube.get("horizontalpodautoscaler", DEPLOYMENT, NS) is None
            and kube.get("horizontalpodautoscaler", autoscaler, NS) is not None
        )

    wait_until(keda_in_charge, "KEDA's autoscaler in place of the operator's", kube, timeout=120)
    hpa = kube.get("horizontalpodautoscaler", autoscaler, NS)
    assert (
        hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        == (SHORT_WINDOWS["scaleDownStabilizationSeconds"])
    )
    (external,) = [m["external"] for m in hpa["spec"]["metrics"]]
    selector = ",".join(f"{k}={v}" for k, v in external["metric"]["selector"]["matchLabels"].items())
    metric = external["metric"]["name"]
    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/{metric}?labelSelector={selector}"
    # No load: the trigger's value (the sum of the pool's queue depths) is 0 once a single replica is left (the
    # no-flap test may have left two, which the short windows now take back to one).
    wait_until(lambda: len(pods(kube)) == 1 and len(ready_pods(kube)) == 1, "one Ready predictor pod", kube)
    eventually(  # the previous test's load may have ended a scrape ago
        lambda: [item["value"] for item in json.loads(kube.run("get", "--raw", path).stdout)["items"]] == ["0"],
        "the external metric (the trigger's value) at 0 without load",
        timeout=60,
    )
    scale_up_and_down(scaling_cluster, kube, tmp_path, autoscaler)
