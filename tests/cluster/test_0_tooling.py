"""The cluster tooling's own facts, checked without a cluster: the fake pools carry the labels the operator
reads, the certificates chain to the CA, a recorded process is never confused with a later one, the node's
FROM-scratch images are valid OCI archives, and no two of its modules import each other."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from clef_cluster import __main__ as cli
from clef_cluster import adapter, keda, kwok, nodes, oci, pki, pod_targets
from clef_cluster.pod_targets import PATH, PORT, SCRAPE
from clef_cluster.processes import start, stop
from clef_operator.constants import GPU_RESOURCE, POOL_LABEL_KEYS
from clef_operator.pools import GPU_LABELS, evaluate_pool, group_into_pools, summarize_node
from clef_operator.spec import PREDICTOR_GAUGES, parse_spec
from tests.cluster.helpers import FP8_POOLS, TOO_OLD_POOLS
from tests.cluster.kube import EXAMPLE


def test_fake_pools_are_what_the_operator_reads() -> None:
    summaries = [summarize_node(node) for node in nodes.all_nodes()]
    gpu_nodes = [s for s in summaries if s is not None]
    assert len(gpu_nodes) == sum(p.nodes for p in nodes.GPU_POOLS)  # the system pool has no GPU
    for pool in nodes.GPU_POOLS:
        assert pool.label_key in POOL_LABEL_KEYS
        assert set(pool.gfd_labels()) >= set(GPU_LABELS)
        assert pool.node(0)["status"]["capacity"][GPU_RESOURCE] == str(pool.gpus)
    spec = parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    pools, unpooled = group_into_pools(gpu_nodes, spec.nodePools.labelKey)
    decisions = {pool.name: evaluate_pool(pool, spec) for pool in pools}
    assert unpooled == []
    assert {name for name, d in decisions.items() if d.eligible} == FP8_POOLS
    assert {name for name, d in decisions.items() if not d.eligible} == TOO_OLD_POOLS


def test_kwok_runs_its_default_pod_stages_and_a_kubelets_status_sync() -> None:
    """kwok's own default pod stages, read from its module, and the stage that makes a pod Ready again."""
    names = [stage["metadata"]["name"] for stage in kwok.pod_stages()]
    assert names == ["pod-ready", "pod-complete", "pod-delete", kwok.READY_AGAIN["metadata"]["name"]]


def test_certificates_chain_to_the_authority(tmp_path: Path) -> None:
    authority = pki.Authority.create(tmp_path)
    serving = authority.serving("server", ("127.0.0.1", "localhost"))
    client = pki.Authority.load(tmp_path).client("user", "jane", ("team",))
    ca = x509.load_pem_x509_certificate(authority.cert.read_bytes())
    certs = {pair: x509.load_pem_x509_certificate(pair.cert.read_bytes()) for pair in (serving, client)}
    for cert in certs.values():
        cert.verify_directly_issued_by(ca)  # raises when the signature or issuer does not match
    names = certs[serving].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert certs[client].subject.rfc4514_string() == "CN=jane,O=team"
    assert oct(serving.key.stat().st_mode & 0o777) == "0o600"


def test_stop_ends_the_recorded_process_only(tmp_path: Path) -> None:
    process = start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)
    assert process.alive()
    stop(process, grace=5)
    assert not process.alive()
    stop(process)  # already gone: nothing to do, nothing signalled
    reused = type(process)(process.name, process.pid, process.started + 1, process.log)
    assert not reused.alive()  # same pid, another start time: not ours


def test_scratch_image_archive_is_a_content_addressed_oci_layout(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF not really")
    image = oci.ScratchImage("localhost/clef-cluster/tool:1", binary, ("/tool", "serve"), "65534:65534")
    archive = image.write(tmp_path / "image.tar")
    assert archive.read_bytes() == image.write(tmp_path / "again.tar").read_bytes()  # reproducible
    with tarfile.open(archive) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    for name, blob in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(blobs["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == image.reference
    manifest = json.loads(blobs[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    config = json.loads(blobs[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"]["Entrypoint"] == ["/tool", "serve"] and config["config"]["User"] == "65534:65534"
    (layer,) = manifest["layers"]
    with tarfile.open(fileobj=io.BytesIO(blobs[f"blobs/sha256/{layer['digest'].split(':')[1]}"])) as tar:
        (member,) = tar.getmembers()
        assert member.name == "tool" and member.mode == 0o755
        assert tar.extractfile(member).read() == binary.read_bytes()  # type: ignore[union-attr]


def clef_cluster_imports() -> dict[str, set[str]]:
    """Each clef_cluster module's imports of its sibling modules (those for type checking only included)."""
    folder = Path(__file__).resolve().parents[2] / "clef_cluster"
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        found = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "clef_cluster":
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("clef_cluster."):
                found.add(str(node.module).split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("clef_cluster.")}
    return graph


def test_clef_cluster_modules_import_no_circle() -> None:
    graph = clef_cluster_imports()
    assert graph["cluster"] >= {"kserve", "node"}  # the reading sees both import forms

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(
            module == target or (module not in seen and reaches(module, target, seen | {module}))
            for module in graph.get(start, set())
        )

    circles = sorted(module for module in graph if reaches(module, module, {module}))
    assert not circles, f"modules that import themselves through others: {circles}"


def test_pod_targets_keep_the_running_annotated_pods_as_prometheus_example_does() -> None:
    def pod(name: str, phase: str = "Running", ip: str | None = "10.244.1.5", **annotations: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
            "status": {"phase": phase, **({"podIP": ip} if ip else {})},
        }

    scraped = {SCRAPE: "true", PORT: "8080"}
    groups = pod_targets.targets(
        [
            pod("b", **scraped, **{PATH: "/stats"}),
            pod("a", **scraped),
            pod("not-annotated"),
            pod("off", **{**scraped, SCRAPE: "false"}),
            pod("pending", phase="Pending", **scraped),
            pod("no-ip", ip=None, **scraped),
            pod("no-port", **{SCRAPE: "true"}),
        ]
    )
    assert groups == [
        {"targets": ["10.244.1.5:8080"], "labels": {"namespace": "ml", "pod": "a", "__metrics_path__": "/metrics"}},
        {"targets": ["10.244.1.5:8080"], "labels": {"namespace": "ml", "pod": "b", "__metrics_path__": "/stats"}},
    ]


def test_the_adapters_rule_covers_every_predictor_gauge_while_ready_and_both_api_versions() -> None:
    (rule,) = adapter.config()["rules"]
    assert all(gauge in rule["seriesQuery"] for gauge in PREDICTOR_GAUGES)
    assert "clef_ready{<<.LabelMatchers>>} == 1" in rule["metricsQuery"]
    objects = adapter.objects("10.243.7.1", 4443, "Q0E=")
    services = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "APIService"}
    assert set(services) == {"v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io"}
    assert (
        services["v1beta2.custom.metrics.k8s.io"]["versionPriority"]
        > services["v1beta1.custom.metrics.k8s.io"]["versionPriority"]
    )
    (endpoints,) = [o for o in objects if o["kind"] == "EndpointSlice"]
    assert endpoints["endpoints"][0]["addresses"] == ["10.243.7.1"] and endpoints["ports"][0]["port"] == 4443


def test_kedas_bindings_name_its_host_user_instead_of_its_service_account(tmp_path: Path) -> None:
    """KEDA's binding subjects as its manifests write them (its ServiceAccount; the HorizontalPodAutoscaler
    controller's): the first becomes the user KEDA's host processes authenticate as, the other stays."""
    hpa = {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}
    for index, name in enumerate(keda.RBAC_FILES):
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"binding-{index}"},
            "subjects": [dict(keda.SERVICE_ACCOUNT), hpa],
        }
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(yaml.safe_dump_all([binding, {"kind": "ClusterRole", "metadata": {"name": "r"}}]))
    objects = keda.rbac(tmp_path)
    assert objects[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": keda.NAMESPACE}}
    bindings = [o for o in objects if "subjects" in o]
    assert len(bindings) == len(keda.RBAC_FILES) and len(objects) == 1 + 2 * len(keda.RBAC_FILES)
    user = {"kind": "User", "name": keda.USER, "apiGroup": "rbac.authorization.k8s.io"}
    assert all(b["subjects"] == [user, hpa] for b in bindings)


def test_kedas_grpc_link_is_mutual_tls_from_the_cluster_ca(tmp_path: Path) -> None:
    """The operator's folder: a server certificate for 127.0.0.1; the metrics server's: a client certificate; both
    signed by the cluster CA, which each folder's ca.crt is."""
    authority = pki.Authority.create(tmp_path / "pki")
    server, client = keda.write_grpc_certs(tmp_path / "keda", authority)
    ca = x509.load_pem_x509_certificate(authority.cert.read_bytes())
    for folder, usage in ((server, ExtendedKeyUsageOID.SERVER_AUTH), (client, ExtendedKeyUsageOID.CLIENT_AUTH)):
        assert (folder / "ca.crt").read_bytes() == authority.cert.read_bytes()
        cert = x509.load_pem_x509_certificate((folder / "tls.crt").read_bytes())
        cert.verify_directly_issued_by(ca)
        assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [usage]
        assert (folder / "tls.key").stat().st_mode & 0o077 == 0
    names = x509.load_pem_x509_certificate((server / "tls.crt").read_bytes()).extensions
    addresses = names.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
    assert "127.0.0.1" in {str(a) for a in addresses}


def test_kedas_listeners_and_registration() -> None:
    """The operator listens on 127.0.0.1 only; the metrics server on the host's end of the node's link, registered
    for external.metrics.k8s.io at that address."""
    args = keda.operator_args(grpc_port=1, probe_port=2, metrics_port=3, grpc_certs=Path("/c"))
    listeners = {a.split("=", 1)[1] for a in args if "-bind-address=" in a}
    assert listeners == {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
    objects = keda.objects("10.243.7.1", 4443, "Q0E=")
    (service,) = [o for o in objects if o["kind"] == "APIService"]
    assert service["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert service["spec"]["service"] == {"name": keda.METRICS_SERVER, "namespace": keda.NAMESPACE, "port": 443}
    (endpoints,) = [o for o in objects if o["kind"] == "EndpointSlice"]
    assert endpoints["endpoints"][0]["addresses"] == ["10.243.7.1"] and endpoints["ports"][0]["port"] == 4443


def test_options_after_the_command_are_read_and_stray_arguments_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``up --keda`` as the docs write it (the option after the command) starts KEDA; ``build --keda`` builds it;
    an argument a command does not take is an error, not silently dropped."""
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(cli.building, "build", lambda **kw: calls.append(("cluster", kw)) or Path("bin"))
    monkeypatch.setattr(cli.adapter, "build", lambda: calls.append(("adapter", None)) or Path("adapter"))
    monkeypatch.setattr(cli.keda, "build", lambda: calls.append(("keda", None)) or {})
    monkeypatch.setattr(cli, "up", lambda folder, **kw: calls.append(("up", kw)) or pytest.fail("stop here"))
    assert cli.main(["build", "--keda"]) == 0
    assert [name for name, _ in calls] == ["cluster", "adapter", "keda"]
    with pytest.raises(pytest.fail.Exception):
        cli.main(["up", "--keda", "--dir", "/nonexistent"])
    assert calls[-1] == ("up", {"with_kserve": True, "with_nodes": True, "with_node": True, "with_metrics": False,
                                "with_keda": True})  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        cli.main(["up", "keda"])
    assert refused.value.code == 2 and "up takes no arguments" in capsys.readouterr().err
