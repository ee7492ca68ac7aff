"""End to end on the real node: the images built here, ``helm install`` with the operator running as a pod from its
image, the real-node variant of the README's ClefDecision (manifests/examples/clefdecision-real-node.yaml) served
by KServe's Deployment from the CPU predictor image, the demo release on a ``pvc://`` claim, and System One requests
to the InferenceService's ``status.url`` from a client in the node's network namespace (Service, kube-proxy).

Its own cluster (control plane, KServe, the real node; no fake pools) on the real node's worker
(tests/worker_groups.py). The tests run in order: each leaves the cluster as the next expects it.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clef_cluster import images, node
from clef_cluster.cluster import Cluster
from clef_cluster.storage import MODELS_CLAIM, make_volume_folders, namespace_with_claims
from clef_contract.container import CONTAINER_NAME
from predictor.demo import demo_release
from tests.cluster.helpers import condition, is_ready, pods_of, pool_status
from tests.cluster.kube import CHART, RELEASE, REPO, SYSTEM_NS, Kube, cluster_for
from tests.polling import eventually
from tests.predictor.conftest import start_predictor, stop, without_timing

NS = "ml-serving"
EXAMPLE = REPO / "manifests" / "examples" / "clefdecision-real-node.yaml"
DECISION = "clef-flash"
ISVC = "clef-flash-real-pool"
MODEL = "clef-flash"
REQUEST = json.loads((REPO / "scripts" / "demo_request.json").read_text())
START_S = 600.0  # a predictor pod's start (image, engine, warm-up) on a busy 2-core machine
SECRET = "clef-api-keys"
API_KEY = "sk-real-node-test"


@pytest.fixture(scope="module")
def e2e_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane with KServe and the real node (no fake pools)."""
    with cluster_for(tmp_path_factory, "e2e-cluster", with_kserve=True, with_nodes=False, with_node=True) as running:
        yield running


@pytest.fixture(scope="module")
def kube(e2e_cluster: Cluster) -> Kube:
    return Kube(e2e_cluster)


def install_chart_with_our_images(cluster: Cluster, kube: Kube) -> None:
    """Both images (built once per input hash) imported into the node's containerd, then ``helm install --wait``
    with them (pull policy IfNotPresent: their tags are not ``latest``), the operator pod on the real node."""
    built = images.build_all()
    for image in built.values():
        assert cluster.node.import_image(image.archive) == [image.reference]
    operator, predictor = built["clef-operator"].reference, built["clef-predictor-cpu"].reference
    kube.helm(
        "install", RELEASE, str(CHART), f"--namespace={SYSTEM_NS}", "--create-namespace", "--wait", "--timeout=5m",
        *image_values("operator.image", operator), *image_values("predictor.image", predictor),
        f"--set-string=operator.nodeSelector.kubernetes\\.io/hostname={node.NAME}",
    )  # fmt: skip


@pytest.fixture(scope="module")
def chart(e2e_cluster: Cluster, kube: Kube) -> dict[str, Any]:
    """The chart installed with our images (:func:`install_chart_with_our_images`); the operator's pod once Ready."""
    install_chart_with_our_images(e2e_cluster, kube)
    (pod,) = kube.get("pods", namespace=SYSTEM_NS, selector="app.kubernetes.io/component=operator")
    return pod


def image_values(key: str, reference: str) -> list[str]:
    repository, tag = reference.rsplit(":", 1)
    return [f"--set={key}.repository={repository}", f"--set={key}.tag={tag}"]


@pytest.fixture(scope="module")
def release(e2e_cluster: Cluster, kube: Kube) -> Path:
    """The demo release in the ``clef-models`` claim's folder (a hostPath volume), where the example's
    ``pvc://clef-models/clef-flash-fp8`` points, readable by the predictor's uid 10001; the claims applied."""
    root = e2e_cluster.folder / "volumes"
    folders = make_volume_folders(NS, root)
    target = folders[MODELS_CLAIM] / "clef-flash-fp8"
    shutil.copytree(demo_release(), target)
    for path in (target, *target.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    kube.apply(*namespace_with_claims(NS, root))
    return target


@pytest.fixture(scope="module")
def decision(kube: Kube, chart: dict[str, Any], release: Path) -> dict[str, Any]:
    """The example applied with kubectl, waited for until Ready; the seconds it took are in ``ready_after_s``."""
    started = time.monotonic()
    kube.run("apply", f"--namespace={NS}", "-f", str(EXAMPLE))
    ready = wait_decision_ready(kube)
    print(f"\nClefDecision Ready {time.monotonic() - started:.1f} s after kubectl apply")
    return ready


def wait_decision_ready(kube: Kube) -> dict[str, Any]:
    try:
        return eventually(
            lambda: (d := kube.get("clefdecision", DECISION, NS)) and is_ready(d) and d, "Ready", timeout=START_S
        )
    except pytest.fail.Exception as exc:
        shown = [
            kube.run(*args, check=False).stdout
            for args in (
                ("get", "clefdecision", DECISION, f"--namespace={NS}", "-o", "jsonpath={.status}"),
                ("get", "pods", f"--namespace={NS}", "-o", "wide"),
                ("get", "events", f"--namespace={NS}", "--sort-by=.lastTimestamp"),
                ("logs", f"--namespace={NS}", f"--selector=serving.kserve.io/inferenceservice={ISVC}", "--tail=40"),
            )
        ]
        pytest.fail(f"{exc}\n" + "\n".join(shown))


@pytest.fixture(scope="module")
def url(kube: Kube, decision: dict[str, Any]) -> str:
    """The InferenceService's status.url."""
    found: str = kube.get("inferenceservice", ISVC, NS)["status"]["url"]
    return found


def in_namespace(cluster: Cluster, job: dict[str, Any]) -> Any:
    """tests/cluster/in_namespace.py run by ``python -m clef_cluster exec`` with ``job``; its JSON result."""
    done = subprocess.run(
        [
            sys.executable, "-m", "clef_cluster", "--dir", str(cluster.folder), "exec", "--",
            sys.executable, str(Path(__file__).with_name("in_namespace.py")),
        ],
        input=json.dumps(job), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def through_cluster(cluster: Cluster, url: str, *requests: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = in_namespace(cluster, {"mode": "http", "url": url, "requests": list(requests)})
    return result


@pytest.fixture(scope="module")
def local(release: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m predictor`` here on the same release with the pod's arguments (``--engine=auto``); its URL."""
    server = start_predictor(
        tmp_path_factory.mktemp("local-predictor"), f"--model-dir={release}", "--engine=auto", "--max-model-len=4096"
    )
    try:
        yield server.url
    finally:
        stop(server, timeout=120)


def locally(url: str, *requests: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.Client(base_url=url, timeout=120) as client:
        answers = []
        for request in requests:
            response = client.request(
                request.get("method", "POST"), request["path"], json=request.get("json"),
                content=request.get("content"), headers=request.get("headers"),
            )  # fmt: skip
            answers.append({"status": response.status_code, "body": response.json()})
        return answers


def parse_time(text: str) -> datetime.datetime:
    """An RFC 3339 time as the API server and ``kubectl logs --timestamps`` write it (nanoseconds cut to micro)."""
    whole, _, fraction = text.removesuffix("Z").partition(".")
    return datetime.datetime.fromisoformat(f"{whole}.{(fraction or '0')[:6]:0<6}+00:00")


def predictor_pod(kube: Kube) -> dict[str, Any]:
    (pod,) = [p for p in pods_of(kube, ISVC, NS) if not p["metadata"].get("deletionTimestamp")]
    return pod


def test_the_operator_runs_as_a_pod_of_its_image(kube: Kube, chart: dict[str, Any]) -> None:
    """The chart's Deployment: the operator image on the real node, the chart's ServiceAccount, Ready through its
    readiness probe, liveness probe in place."""
    assert chart["spec"]["nodeName"] == node.NAME
    assert chart["spec"]["serviceAccountName"] == RELEASE
    (container,) = chart["spec"]["containers"]
    assert container["image"].startswith("localhost/clef-serving/clef-operator:")
    assert container["readinessProbe"]["httpGet"]["path"] == container["livenessProbe"]["httpGet"]["path"]
    assert is_ready(chart)
    logs = kube.run("logs", chart["metadata"]["name"], f"--namespace={SYSTEM_NS}").stdout
    assert "Traceback" not in logs, logs[-3000:]


def test_the_decision_serves_from_a_predictor_pod_on_the_real_node(kube: Kube, decision: dict[str, Any]) -> None:
    (pool,) = pool_status(decision).values()
    assert pool["name"] == "real-pool" and pool["ready"] and pool["inferenceService"] == ISVC
    pod = predictor_pod(kube)
    assert pod["spec"]["nodeName"] == node.NAME
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_NAME]
    assert container["image"].startswith("localhost/clef-serving/clef-predictor-cpu:")
    assert "--engine=auto" in container["args"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
    assert MODELS_CLAIM in claims  # pvc://: KServe mounts the claim, no storage initializer
    assert not pod["spec"].get("initContainers")
    logs = kube.run(
        "logs", pod["metadata"]["name"], f"--namespace={NS}", f"--container={CONTAINER_NAME}", "--timestamps"
    ).stdout
    assert "engine: transformers" in logs, logs[-3000:]  # what --engine=auto picks in the CPU image
    # Ready only after the warm-up: the kubelet's readiness (the warm-up-gated model endpoint) turned True after the
    # predictor logged the end of its warm-up.
    (warmed,) = [line.split(" ", 1)[0] for line in logs.splitlines() if "warm-up finished" in line]
    ready_since = condition(pod, "Ready")["lastTransitionTime"]
    assert parse_time(ready_since) >= parse_time(warmed).replace(microsecond=0), (warmed, ready_since)


def test_a_system_one_answer_through_the_url_equals_the_local_one(e2e_cluster: Cluster, url: str, local: str) -> None:
    assert url == f"http://{ISVC}-predictor.{NS}.svc.cluster.local"  # the predictor Service (clef_cluster.kserve)
    request = {"path": "/v1/systemone", "json": REQUEST}
    (remote,) = through_cluster(e2e_cluster, url, request)
    (here,) = locally(local, request)
    assert remote["status"] == here["status"] == 200, remote
    assert without_timing(remote["body"]) == without_timing(here["body"])


def test_the_typesafe_sdk_through_the_url(e2e_cluster: Cluster, url: str, local: str) -> None:
    remote = in_namespace(e2e_cluster, {"mode": "sdk", "url": url, "model": MODEL})
    here = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("in_namespace.py"))],
        input=json.dumps({"mode": "sdk", "url": local, "model": MODEL}), capture_output=True, text=True, check=True,
        timeout=300,
    )  # fmt: skip
    assert remote == json.loads(here.stdout)
    assert remote["model"] == MODEL and remote["topic"] in {"billing", "bug"}


BAD_REQUESTS = [
    {
        "path": "/v1/systemone",
        "content": '{"model": "clef-flash", "state": ',
        "headers": {"content-type": "application/json"},
    },
    {"path": "/v1/systemone", "json": {**REQUEST, "questions": {"urgent": {"type": "nope"}}}},
    {"path": "/v1/systemone", "json": {**REQUEST, "model": "other"}},
    {"path": "/v1/systemone", "json": {"model": MODEL, "state": {}}},
]


def test_bad_input_gets_the_same_4xx_through_the_cluster(e2e_cluster: Cluster, url: str, local: str) -> None:
    remote = through_cluster(e2e_cluster, url, *BAD_REQUESTS)
    here = locally(local, *BAD_REQUESTS)
    assert [r["status"] for r in remote] == [h["status"] for h in here]
    assert all(400 <= r["status"] < 500 for r in remote), remote
    strip = ("request_id", "id")
    assert [without_ids(r["body"], strip) for r in remote] == [without_ids(h["body"], strip) for h in here]


def without_ids(body: Any, keys: tuple[str, ...]) -> Any:
    """A JSON body less the per-request ids, at any depth."""
    if isinstance(body, dict):
        return {k: without_ids(v, keys) for k, v in body.items() if k not in keys}
    if isinstance(body, list):
        return [without_ids(v, keys) for v in body]
    return body


def test_kubectl_logs_show_the_predictors_json_lines(e2e_cluster: Cluster, kube: Kube, url: str) -> None:
    through_cluster(
        e2e_cluster, url, {"path": "/v1/systemone", "json": REQUEST, "headers": {"x-request-id": "logged-1"}}
    )
    pod = predictor_pod(kube)["metadata"]["name"]

    def logged() -> dict[str, Any] | None:
        lines = kube.run("logs", pod, f"--namespace={NS}", f"--container={CONTAINER_NAME}").stdout.splitlines()
        for line in lines:
            if line.startswith("{") and "logged-1" in line:
                return dict(json.loads(line))
        return None

    entry = eventually(logged, "the request's JSON log line")
    assert entry.get("status") == 200, entry


def test_a_killed_container_is_restarted_and_traffic_resumes(e2e_cluster: Cluster, kube: Kube, url: str) -> None:
    pod = predictor_pod(kube)
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == CONTAINER_NAME]
    container_id = status["containerID"].removeprefix("containerd://")
    e2e_cluster.node.ctr("tasks", "kill", "--signal=SIGKILL", container_id)

    def restarted() -> dict[str, Any] | None:
        now = kube.get("pod", pod["metadata"]["name"], NS)
        (again,) = [s for s in now["status"]["containerStatuses"] if s["name"] == CONTAINER_NAME]
        return now if again["restartCount"] == status["restartCount"] + 1 and is_ready(now) else None

    eventually(restarted, "the kubelet to restart the container and the pod to be Ready", timeout=START_S)
    (answer,) = through_cluster(e2e_cluster, url, {"path": "/v1/systemone", "json": REQUEST})
    assert answer["status"] == 200, answer


def test_deleting_the_pod_under_load_gives_503_or_answers(
    e2e_cluster: Cluster, kube: Kube, url: str, tmp_path: Path
) -> None:
    """Two clients for 30 s while the pod is deleted: every answer is a 200 (the predictor answers during its
    shutdown delay, while the endpoints go) or a 503 with Retry-After (its drain timeout's answer); a connection may
    be refused while the Service has no ready pod (nothing was sent), never broken after a request was sent."""
    old = predictor_pod(kube)["metadata"]["name"]
    job = tmp_path / "load.json"
    job.write_text(json.dumps({"mode": "load", "url": url, "request": REQUEST, "clients": 2, "seconds": 30}))
    with job.open() as stdin:
        load = subprocess.Popen(
            [
                sys.executable, "-m", "clef_cluster", "--dir", str(e2e_cluster.folder), "exec", "--",
                sys.executable, str(Path(__file__).with_name("in_namespace.py")),
            ],
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    time.sleep(5)
    kube.run("delete", "pod", old, f"--namespace={NS}", "--wait=false")
    out, err = load.communicate(timeout=240)
    assert load.returncode == 0, err[-3000:]
    outcomes = json.loads(out)
    print(f"\nunder deletion: {summary(outcomes)}")
    answered = [o for o in outcomes if "status" in o]
    assert any(o["status"] == 200 for o in answered), outcomes
    wrong = [o for o in answered if o["status"] != 200 and not (o["status"] == 503 and o["retry_after"])]
    broken = [o for o in outcomes if o.get("sent")]
    assert wrong == [] and broken == [], (wrong, broken)
    wait_decision_ready(kube)
    assert predictor_pod(kube)["metadata"]["name"] != old


def summary(outcomes: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        key = str(outcome.get("status") or outcome.get("error"))
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_with_api_keys_a_request_without_the_key_gets_401(e2e_cluster: Cluster, kube: Kube, url: str) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NS},
            "stringData": {"keys": f"{API_KEY}\n"},
        }
    )
    before = predictor_pod(kube)["metadata"]["name"]
    patch = {"spec": {"predictor": {"apiKeySecret": {"name": SECRET}}}}
    kube.run("patch", "clefdecision", DECISION, f"--namespace={NS}", "--type=merge", f"--patch={json.dumps(patch)}")
    eventually(lambda: predictor_pod_named_other_than(kube, before), "the keyed predictor pod", timeout=START_S)
    wait_decision_ready(kube)
    without, wrong, keyed = through_cluster(
        e2e_cluster, url,
        {"path": "/v1/systemone", "json": REQUEST},
        {"path": "/v1/systemone", "json": REQUEST, "headers": {"authorization": "Bearer not-the-key"}},
        {"path": "/v1/systemone", "json": REQUEST, "headers": {"authorization": f"Bearer {API_KEY}"}},
    )  # fmt: skip
    assert (without["status"], wrong["status"], keyed["status"]) == (401, 401, 200), (without, wrong)


def predictor_pod_named_other_than(kube: Kube, name: str) -> bool:
    pods = [p for p in pods_of(kube, ISVC, NS) if not p["metadata"].get("deletionTimestamp")]
    return len(pods) == 1 and pods[0]["metadata"]["name"] != name and is_ready(pods[0])


def test_the_decision_is_ready_only_when_every_replica_is(kube: Kube, url: str) -> None:
    """Two replicas on a node with one GPU: the second pod cannot be placed, so KServe's Deployment is not Available
    (the operator's Recreate strategy: no replica may be missing) and neither the pool nor the ClefDecision is Ready;
    back to one replica, Ready again."""
    patch = {"spec": {"replicas": 2}}
    kube.run("patch", "clefdecision", DECISION, f"--namespace={NS}", "--type=merge", f"--patch={json.dumps(patch)}")
    deployment = f"{ISVC}-predictor"
    eventually(
        lambda: (kube.get("deployment", deployment, NS) or {}).get("status", {}).get("replicas") == 2,
        "KServe's Deployment to have two replicas",
    )
    eventually(lambda: len(pods_of(kube, ISVC, NS)) == 2, "the second predictor pod")
    time.sleep(20)  # the operator's status follows within seconds; give it time to go wrong
    decision = kube.get("clefdecision", DECISION, NS)
    assert condition(decision, "Ready")["status"] == "False", decision["status"]
    (pool,) = pool_status(decision).values()
    assert not pool["ready"]
    ready = [p for p in pods_of(kube, ISVC, NS) if is_ready(p)]
    assert len(ready) == 1  # one replica serves all along: Ready is about every wanted replica
    kube.run("patch", "clefdecision", DECISION, f"--namespace={NS}", "--type=merge", '--patch={"spec":{"replicas":1}}')
    wait_decision_ready(kube)


def test_deleting_the_decision_and_uninstalling_remove_every_pod(kube: Kube, url: str) -> None:
    kube.run("delete", "clefdecision", DECISION, f"--namespace={NS}", "--wait=true", "--timeout=120s")
    eventually(lambda: kube.get("pods", namespace=NS) == [], "the predictor pods to be gone", timeout=180)
    kube.helm("uninstall", RELEASE, f"--namespace={SYSTEM_NS}", "--wait", "--timeout=3m")
    eventually(lambda: kube.get("pods", namespace=SYSTEM_NS) == [], "the operator pod to be gone", timeout=180)
    left = [p["metadata"]["name"] for p in kube.get("pods") if p["metadata"]["namespace"] != "kube-system"]
    assert left == []
