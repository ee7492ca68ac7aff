"""The Helm chart: lint, values schema, rendered objects, labels, operator pod hardening, RBAC scoping."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
from typing import Any

import pytest
import yaml

from clef_contract.container import DEFAULT_REQUESTS, predictor_container, predictor_volumes
from clef_operator.spec import CACHE_VOLUME_SOURCES
from tests.deploy.chart import ALL_ON_VALUES, CHART, NAMESPACE, RELEASE, REPO, run_helm
from tests.deploy.conftest import Render

STANDARD_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
)
CLUSTER_SCOPED = {
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterServingRuntime",
    "ClusterKopfPeering",
}
CRDS = {
    ("CustomResourceDefinition", "clefdecisions.clef-serving.io", None),
    ("CustomResourceDefinition", "clusterkopfpeerings.kopf.dev", None),
    ("CustomResourceDefinition", "kopfpeerings.kopf.dev", None),
}


def kinds_and_names(objects: list[dict[str, Any]]) -> set[tuple[str, str, str | None]]:
    """(kind, name, namespace) of each object."""
    return {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects}


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The only object of a kind."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["defaults", "all-on"])
def test_helm_lint_strict(values: list) -> None:
    args = ["lint", "--strict", str(CHART)] + [arg for path in values for arg in ("--values", str(path))]
    done = run_helm(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["operator.replicas=two"], "/operator/replicas"),
        (["operator.imageTag=1"], "additional properties 'imageTag' not allowed"),
        (["servingRuntime.kind=InferenceService"], "/servingRuntime/kind"),
        (["operator.watchNamespaces={Team_A}"], "/operator/watchNamespaces/0"),
        (["servingRuntime.gpus=0"], "/servingRuntime/gpus"),
        (["operator.replicas=2", "peering.enabled=false"], "needs peering.enabled=true"),
        (["serviceAccount.create=false"], "serviceAccount.name is required"),
        (["servingRuntime.compileCache.configMap.name=c"], "invalid propertyName 'configMap'"),
        (
            ["servingRuntime.compileCache.emptyDir.medium=", "servingRuntime.compileCache.hostPath.path=/x"],
            "/servingRuntime/compileCache",
        ),
        (["operator.extraArgs={--standalone}"], "/operator/extraArgs/0"),
        (["operator.extraArgs={--peering=other}"], "/operator/extraArgs/0"),
        (["operator.hostPathCachePrefixes={/}"], "/operator/hostPathCachePrefixes/0"),
        (["networkPolicy.enabled=true"], "needs networkPolicy.namespaces"),
    ],
)
def test_bad_values_are_refused_naming_the_field(sets: list[str], message: str) -> None:
    args = ["template", RELEASE, str(CHART)] + [arg for item in sets for arg in ("--set", item)]
    done = run_helm(*args)
    assert done.returncode != 0, f"helm accepted {sets}"
    assert message in done.stderr, done.stderr


def test_default_release_objects(rendered_default: list[dict[str, Any]]) -> None:
    assert kinds_and_names(rendered_default) == CRDS | {
        ("ClusterKopfPeering", "clef-operator", None),
        ("ServiceAccount", "clef-serving", NAMESPACE),
        ("ClusterRole", "clef-serving-operator-cluster", None),
        ("ClusterRoleBinding", "clef-serving-operator-cluster", None),
        ("ClusterRole", "clef-serving-view", None),
        ("ClusterRole", "clef-serving-edit", None),
        ("Deployment", "clef-serving-operator", NAMESPACE),
    }


def test_all_on_release_objects(rendered_all_on: list[dict[str, Any]]) -> None:
    assert kinds_and_names(rendered_all_on) == CRDS | {
        ("KopfPeering", "clef-peers", "team-a"),
        ("KopfPeering", "clef-peers", "team-b"),
        ("ServiceAccount", "clef-operator-sa", NAMESPACE),
        ("ClusterRole", "clef-serving-all-on-operator-cluster", None),
        ("ClusterRoleBinding", "clef-serving-all-on-operator-cluster", None),
        ("Role", "clef-serving-all-on-operator", "team-a"),
        ("RoleBinding", "clef-serving-all-on-operator", "team-a"),
        ("Role", "clef-serving-all-on-operator", "team-b"),
        ("RoleBinding", "clef-serving-all-on-operator", "team-b"),
        ("Deployment", "clef-serving-all-on-operator", NAMESPACE),
        ("ServingRuntime", "clef-runtime", NAMESPACE),
        ("ClusterRole", "clef-serving-all-on-view", None),
        ("ClusterRole", "clef-serving-all-on-edit", None),
        ("NetworkPolicy", "clef-serving-all-on-predictors", "team-a"),
        ("NetworkPolicy", "clef-serving-all-on-predictors", "team-b"),
    }


def test_cluster_serving_runtime_is_cluster_scoped(render: Render) -> None:
    runtime = one(render(sets=["servingRuntime.enabled=true"]), "ClusterServingRuntime")
    assert runtime["metadata"]["name"] == "clef-serving-predictor"
    assert "namespace" not in runtime["metadata"]
    assert runtime["spec"]["volumes"][1] == {"name": "compile-cache", "emptyDir": {}}  # the default


@pytest.mark.parametrize("fixture", ["rendered_default", "rendered_all_on"])
def test_scoping_and_standard_labels(fixture: str, request: pytest.FixtureRequest) -> None:
    for obj in request.getfixturevalue(fixture):
        meta = obj["metadata"]
        where = f"{obj['kind']} {meta['name']}"
        assert ("namespace" in meta) == (obj["kind"] not in CLUSTER_SCOPED), where
        if obj["kind"] == "CustomResourceDefinition":
            continue  # crds/ is not templated: helm installs it as written
        labels = meta.get("labels", {})
        assert [key for key in STANDARD_LABELS if key not in labels] == [], where
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_operator_pod_is_hardened_and_probed(rendered_default: list[dict[str, Any]]) -> None:
    pod = one(rendered_default, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] >= 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    (port,) = [p for p in container["ports"] if p["name"] == probe["port"]]
    assert f"--liveness-port={port['containerPort']}" in container["args"]
    assert container["readinessProbe"]["httpGet"] == probe  # Ready once kopf serves its probes
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_operator_args_follow_namespace_scoping(
    rendered_default: list[dict[str, Any]], rendered_all_on: list[dict[str, Any]]
) -> None:
    default = one(rendered_default, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert default["args"] == [
        "--all-namespaces",
        "--liveness-port=8080",
        "--default-backend=auto",
        "--storage-initializer-image=kserve/storage-initializer:v0.20.0",
        "--peering=clef-operator",
    ]
    assert one(rendered_default, "Deployment")["spec"]["strategy"] == {"type": "RollingUpdate"}
    all_on = one(rendered_all_on, "Deployment")
    args = all_on["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == [
        "--namespace=team-a",
        "--namespace=team-b",
        "--liveness-port=9090",
        "--default-backend=deployment",
        "--storage-initializer-image=registry.example.com/kserve/storage-initializer:v0.20.0",
        "--peering=clef-peers",
        "--allow-host-path-prefix=/var/cache/clef",
        "--verbose",
    ]
    assert all_on["spec"]["replicas"] == 2


def test_standalone_operator_is_replaced_not_rolled(render: Render) -> None:
    objects = render(sets=["peering.enabled=false"])
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--standalone"
    assert not [o for o in objects if o["kind"].endswith("KopfPeering")]


def test_operator_gets_the_predictor_image(rendered_default: list[dict[str, Any]]) -> None:
    container = one(rendered_default, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["CLEF_PREDICTOR_IMAGE"] == "ghcr.io/clef-serving/clef-predictor:0.1.0"
    assert container["image"] == "ghcr.io/clef-serving/clef-operator:0.1.0"


def test_bindings_name_the_operator_service_account(rendered_all_on: list[dict[str, Any]]) -> None:
    account = one(rendered_all_on, "ServiceAccount")["metadata"]["name"]
    deployment = one(rendered_all_on, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account
    roles = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in rendered_all_on}
    bindings = [o for o in rendered_all_on if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == 3
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        assert (ref["kind"], ref["name"], namespace) in roles, ref


def test_existing_service_account_without_rbac(render: Render) -> None:
    objects = render(sets=["serviceAccount.create=false", "serviceAccount.name=platform-sa", "rbac.create=false"])
    assert {o["kind"] for o in objects} == {"CustomResourceDefinition", "ClusterKopfPeering", "Deployment"}
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-sa"


def test_serving_runtime_runs_the_predictor_contract(rendered_all_on: list[dict[str, Any]]) -> None:
    """The runtime's container and volumes are the contract's (the operator's), with the chart's values."""
    runtime = one(rendered_all_on, "ServingRuntime")
    values = yaml.safe_load(ALL_ON_VALUES.read_text())["servingRuntime"]
    gpus = str(values["gpus"])
    resources = {part: {**values["resources"][part], "nvidia.com/gpu": gpus} for part in ("requests", "limits")}
    expected = predictor_container(
        image="registry.example.com/clef/clef-predictor:0.1.0-test",
        model_name="{{.Name}}",
        dp=gpus,
        max_model_len=str(values["maxModelLen"]),
        resources=resources,
        extra_args=values["extraArgs"],
        grpc=values["grpc"],
    )
    assert runtime["spec"]["containers"] == [expected]
    assert runtime["spec"]["volumes"] == predictor_volumes(compile_cache=values["compileCache"])
    assert runtime["spec"]["supportedModelFormats"] == [{"name": "clef", "version": "1", "autoSelect": False}]


def test_serving_runtime_default_requests_are_the_operators() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["servingRuntime"]["resources"]["requests"] == DEFAULT_REQUESTS


def test_serving_runtime_template_is_generated_from_the_contract() -> None:
    """templates/servingruntime.yaml is what scripts/render_servingruntime.py writes (never edited by hand)."""
    script = REPO / "scripts" / "render_servingruntime.py"
    spec = importlib.util.spec_from_file_location("render_servingruntime", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    template = CHART / "templates" / "servingruntime.yaml"
    assert template.read_text() == module.render(), (
        "the ServingRuntime template is stale: run `.venv/bin/python scripts/render_servingruntime.py`"
    )


def test_pod_labels_are_not_repeated(rendered_all_on: list[dict[str, Any]]) -> None:
    """Each label key appears once in the operator's pod template (helm would keep the last silently)."""
    text = run_helm(
        "template", RELEASE, str(CHART), "--values", str(ALL_ON_VALUES), "--show-only", "templates/deployment.yaml"
    ).stdout
    template_labels = text.split("template:", 1)[1].split("spec:", 1)[0]
    keys = [line.split(":", 1)[0].strip() for line in template_labels.splitlines() if line.startswith(" " * 8)]
    assert len(keys) == len(set(keys)), keys
    pod = one(rendered_all_on, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = one(rendered_all_on, "Deployment")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod.items()


def test_aggregated_roles_and_network_policy(rendered_all_on: list[dict[str, Any]]) -> None:
    roles = {o["metadata"]["name"]: o for o in rendered_all_on if o["kind"] == "ClusterRole"}
    view, edit = roles["clef-serving-all-on-view"], roles["clef-serving-all-on-edit"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {"get", "list", "watch"} == set(view["rules"][0]["verbs"])
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    policy = next(o for o in rendered_all_on if o["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "clef-predictor"}}
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-system"}}}]


def render_notes(tmp_path: pathlib.Path, values: list[pathlib.Path]) -> str:
    """NOTES.txt as `helm install` would print it (helm renders it only against a live cluster).

    A copy of the chart wraps NOTES.txt in a named template and a ConfigMap that `helm template` renders.
    """
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = chart / "templates" / "NOTES.txt"
    (chart / "templates" / "_notes.tpl").write_text('{{- define "notes" -}}\n' + notes.read_text() + "{{- end }}\n")
    notes.unlink()
    (chart / "templates" / "notes-check.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: |\n    {{- include "notes" . | nindent 4 }}\n'
    )
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, "--show-only", "templates/notes-check.yaml"]
    done = run_helm(*args, *[arg for path in values for arg in ("--values", str(path))])
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["data"]["notes"]


def test_notes_describe_the_release(tmp_path: pathlib.Path) -> None:
    default = render_notes(tmp_path / "default", [])
    assert 'installed as release "clef-serving" in namespace "clef-system"' in default
    assert "every namespace" in default
    assert "kubectl -n clef-system get deploy clef-serving-operator" in default
    assert "ServingRuntime" not in default
    all_on = render_notes(tmp_path / "all-on", [ALL_ON_VALUES])
    assert "these namespaces: team-a, team-b" in all_on
    assert 'ServingRuntime "clef-runtime"' in all_on
    # KServe only for the kserve backend; the example applied into a namespace, after its claims.
    assert "KServe's CRDs (InferenceService) are needed only for the kserve backend" in default
    assert "kubectl apply -n ml-serving -f manifests/examples/clefdecision.yaml" in default
    assert "clef-models, clef-compile-cache" in default
    assert "kubectl apply -n team-a -f manifests/examples/clefdecision.yaml" in all_on
    assert "It needs no KServe: operator.defaultBackend is deployment" in all_on


def test_chart_and_operator_accept_the_same_cache_volume_sources() -> None:
    """values.schema.json's compileCache enum and the operator's CACHE_VOLUME_SOURCES are one list."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["servingRuntime"]["properties"]["compileCache"]["propertyNames"]["enum"]
    assert enum == list(CACHE_VOLUME_SOURCES)


def test_the_grafana_dashboard_is_an_optional_configmap_for_the_sidecar(
    render: Render, rendered_default: list[dict[str, Any]]
) -> None:
    assert not [obj for obj in rendered_default if obj["kind"] == "ConfigMap"]  # off by default
    rendered = render(sets=["grafanaDashboard.enabled=true", "grafanaDashboard.namespace=monitoring"])
    config_map = one(rendered, "ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "clef-predictors.json").read_text())
    assert json.loads(config_map["data"]["clef-predictors.json"]) == shipped


def test_the_dashboard_queries_name_the_predictors_own_metrics() -> None:
    """Every metric a panel queries is one the predictor exports (a histogram's by its _bucket series)."""
    import re

    from prometheus_client import REGISTRY

    import predictor.core.metrics  # noqa: F401  (registers the predictor's metrics)

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    exported = {family.name + suffix for family in REGISTRY.collect() for suffix in suffixes.get(family.type, ("",))}
    dashboard = json.loads((CHART / "dashboards" / "clef-predictors.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    named = {name for expr in exprs for name in re.findall(r"\bclef_[a-z_]+\b", expr)}
    assert named and named <= exported, named - exported
