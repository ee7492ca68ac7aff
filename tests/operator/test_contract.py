"""clef_contract: the predictor container's one definition, importable without any dependency."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from clef_contract import container as c
from clef_contract.predictor import API_KEY_FILE, LIVENESS_PATH, readiness_path

CONTRACT = Path(__file__).resolve().parents[2] / "operator" / "clef_contract"


def test_standard_library_only() -> None:
    for source in sorted(CONTRACT.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            )
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "clef_contract", f"{source.name} imports {name}"


def test_placeholders_pass_through_unchanged() -> None:
    """The chart generator calls the contract with Helm/KServe placeholders; they must come out as given."""
    container = c.predictor_container(
        image="IMG",
        model_name="{{.Name}}",
        dp="{{ $rt.gpus }}",
        max_model_len="N",
        resources={"requests": {"cpu": "1"}},
    )
    assert "--model-name={{.Name}}" in container["args"] and "--dp={{ $rt.gpus }}" in container["args"]
    assert container["readinessProbe"]["httpGet"]["path"] == readiness_path("{{.Name}}")
    assert container["livenessProbe"]["httpGet"]["path"] == LIVENESS_PATH


def test_every_flag_the_contract_sets_is_managed() -> None:
    args = c.predictor_args(model_name="m", dp="1", max_model_len="8", api_key_file=True, grpc=True)
    # the gRPC flags are managed in both spellings: extra arguments cannot serve gRPC on an undeclared port
    assert set(c.MANAGED_FLAGS) - {arg.split("=", 1)[0] for arg in args} == {"--enable-grpc", "--grpc-port"}
    assert f"--api-key-file={API_KEY_FILE}" in args


def test_grpc_is_served_and_its_port_declared_only_when_enabled() -> None:
    plain = c.predictor_container(image="i", model_name="m", dp="1", max_model_len="8", resources={})
    assert [port["name"] for port in plain["ports"]] == ["http"]
    assert not any("grpc" in arg for arg in plain["args"])
    served = c.predictor_container(image="i", model_name="m", dp="1", max_model_len="8", resources={}, grpc=True)
    assert served["ports"][1] == {"name": "grpc", "containerPort": c.GRPC_PORT, "protocol": "TCP"}
    assert {"--enable_grpc=true", f"--grpc_port={c.GRPC_PORT}"} <= set(served["args"])


def test_results_share_nothing_with_the_inputs() -> None:
    resources = {"requests": {"cpu": "1"}}
    cache = {"persistentVolumeClaim": {"claimName": "c"}}
    container = c.predictor_container(image="i", model_name="m", dp="1", max_model_len="8", resources=resources)
    volumes = c.predictor_volumes(compile_cache=cache)
    container["resources"]["requests"]["cpu"] = "2"
    volumes[1]["persistentVolumeClaim"]["claimName"] = "other"
    assert resources == {"requests": {"cpu": "1"}} and cache == {"persistentVolumeClaim": {"claimName": "c"}}


def test_every_mount_has_its_volume() -> None:
    mounts = {m["name"] for m in c.predictor_volume_mounts(api_key_file=True)}
    volumes = {v["name"] for v in c.predictor_volumes(compile_cache={"emptyDir": {}}, api_key_secret=("s", "k"))}
    assert mounts == volumes
