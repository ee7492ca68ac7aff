"""What users install: the built wheels and sdists, installed outside the source tree, work.

The test environment installs both distributions in editable mode, which makes every module of the source tree
importable and so hides a module left out of a wheel. Here each distribution is built (sdist, then the wheel from
that sdist, as ``python -m build`` does), installed into a fresh virtual environment, and run from a working
directory outside the repository:

- clef-serving: dependencies come from the test environment (its site-packages is added as a plain path, so the
  editable installs' import hooks are not); the wheel's install answers a System One request on the demo release
  (``python -m predictor``), and the sdist's install holds exactly the wheel's modules.
- clef-serving-operator: its dependencies are resolved for real into the fresh environment, which proves the
  distribution pulls in nothing of the model stack; torch is neither installed nor imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from clef_tools.local_server import NotReady, free_port, http_ok, start_and_wait, stop_process

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = {"clef-serving": REPO, "clef-serving-operator": REPO / "operator"}
# Source packages per distribution, as they must appear in its wheel (every module).
PACKAGES = {
    "clef-serving": [REPO / name for name in ("clef_head", "clef_plugin", "predictor", "clef_tools")],
    "clef-serving-operator": [REPO / "operator" / name for name in ("clef_operator", "clef_contract")],
}
STARTUP_TIMEOUT_S = 600.0


def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert found is not None, "uv is not installed (scripts/bootstrap.sh installs it)"
    return found


def _uv_env() -> dict[str, str]:
    # Machine-wide uv configuration (local indexes, constraints) must not change what gets installed.
    return {**os.environ, "UV_NO_CONFIG": "1"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """``{distribution: {"wheel": path, "sdist": path}}``, built from a copy of the sources."""
    out = tmp_path_factory.mktemp("dist")
    artifacts: dict[str, dict[str, Path]] = {}
    for name, source in DISTRIBUTIONS.items():
        target = out / name
        done = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(target), str(source)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        (wheel,) = target.glob("*.whl")
        (sdist,) = target.glob("*.tar.gz")
        artifacts[name] = {"wheel": wheel, "sdist": sdist}
    return artifacts


def _modules(packages: list[Path]) -> set[str]:
    """Every Python module of the source packages, as a path relative to the package's parent."""
    return {
        str(path.relative_to(package.parent))
        for package in packages
        for path in package.rglob("*.py")
        if "__pycache__" not in path.parts
    }


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_wheel_and_sdist_hold_every_module(built: dict[str, dict[str, Path]], name: str) -> None:
    expected = _modules(PACKAGES[name])
    assert "predictor/engines/vllm.py" in expected or name != "clef-serving"
    with zipfile.ZipFile(built[name]["wheel"]) as wheel:
        in_wheel = {entry for entry in wheel.namelist() if entry.endswith(".py")}
    assert expected == in_wheel, f"missing {sorted(expected - in_wheel)}, unexpected {sorted(in_wheel - expected)}"
    with tarfile.open(built[name]["sdist"]) as sdist:
        in_sdist = {member.split("/", 1)[1] for member in sdist.getnames() if member.endswith(".py")}
    assert expected <= in_sdist, f"missing from the sdist: {sorted(expected - in_sdist)}"
    assert not any(member.split("/")[0] in ("tests", "bench", "operator") for member in in_wheel)


def _fresh_venv(path: Path, reuse_site_packages: bool) -> Path:
    """A new virtual environment; optionally seeing the test environment's packages (without their hooks)."""
    venv.EnvBuilder(with_pip=False).create(path)
    python = path / "bin" / "python"
    if reuse_site_packages:
        purelib = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        # A plain path line: the directory is importable, but its .pth files (the editable installs' import
        # hooks) are not executed.
        (Path(purelib) / "test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _install(python: Path, artifact: Path, *, with_dependencies: bool) -> None:
    command = [_uv(), "pip", "install", "--python", str(python), str(artifact)]
    if not with_dependencies:
        command[3:3] = ["--no-deps", "--no-build-isolation"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=_uv_env(), check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[Path]:
    """A working directory outside the repository."""
    work = tmp_path / "work"
    work.mkdir()
    assert REPO not in work.parents
    yield work


def _clean_env(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "XDG_CACHE_HOME": str(home / "cache"), "VLLM_CACHE_ROOT": str(home / "vllm-cache")}


def _installed_modules(python: Path, distribution: str) -> set[str]:
    """The Python modules an installed distribution put into site-packages (from its RECORD)."""
    purelib = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (record,) = purelib.glob(f"{distribution.replace('-', '_')}-*.dist-info/RECORD")
    return {line.split(",")[0] for line in record.read_text().splitlines() if line.split(",")[0].endswith(".py")}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_predictor_answers_a_request(
    built: dict[str, dict[str, Path]], tmp_path: Path, elsewhere: Path, kind: str
) -> None:
    """Each artifact installs outside the source tree; the wheel's install serves a request. The sdist installs by
    building a wheel from itself, as the served wheel was built: it must install exactly the wheel's modules."""
    python = _fresh_venv(tmp_path / "venv", reuse_site_packages=True)
    _install(python, built["clef-serving"][kind], with_dependencies=False)
    env = _clean_env(tmp_path)

    where = subprocess.run(
        [
            python,
            "-c",
            "import json, sys, predictor.engines, clef_tools.tiny; "
            "print(json.dumps([predictor.engines.__file__, sys.path]))",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    module_file, path = json.loads(where.stdout)
    assert Path(module_file).is_relative_to(tmp_path / "venv"), module_file
    assert not any(entry and Path(entry).resolve() in (REPO, REPO / "operator") for entry in path), path
    with zipfile.ZipFile(built["clef-serving"]["wheel"]) as wheel:
        in_wheel = {entry for entry in wheel.namelist() if entry.endswith(".py")}
    assert _installed_modules(python, "clef-serving") == in_wheel
    if kind == "sdist":
        return

    port = free_port()
    log = tmp_path / "predictor.log"
    body = json.loads((REPO / "scripts" / "demo_request.json").read_text())
    with log.open("wb") as log_file:
        try:
            server = start_and_wait(
                [
                    python,
                    "-m",
                    "predictor",
                    "--engine",
                    "transformers",
                    "--http_port",
                    str(port),
                    "--enable_grpc",
                    "false",
                ],
                lambda: http_ok(f"http://127.0.0.1:{port}/v1/models/clef-flash"),
                STARTUP_TIMEOUT_S,
                interval=0.5,
                what="the installed predictor",
                cwd=elsewhere,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        except NotReady as exc:
            pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-5000:]}")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            answer = client.post("/v1/systemone", json=body)
        assert answer.status_code == 200, answer.text
        assert set(answer.json()["answers"]) == set(body["questions"])
    finally:
        stop_process(server, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_operator_needs_no_model_stack(
    built: dict[str, dict[str, Path]], tmp_path: Path, elsewhere: Path, kind: str
) -> None:
    python = _fresh_venv(tmp_path / "venv", reuse_site_packages=False)
    _install(python, built["clef-serving-operator"][kind], with_dependencies=True)
    env = _clean_env(tmp_path)

    help_text = subprocess.run(
        [python, "-m", "clef_operator", "--help"], cwd=elsewhere, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "--all-namespaces" in help_text
    probe = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util, json, sys\n"
            "import clef_operator.handlers, clef_contract.predictor\n"
            "print(json.dumps({'installed': [m for m in ('torch', 'transformers', 'vllm', 'kserve', 'clef_head')"
            " if importlib.util.find_spec(m)], 'imported': [m for m in ('torch', 'transformers') if m in sys.modules],"
            " 'from': clef_operator.handlers.__file__}))",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(probe.stdout)
    assert seen == {"installed": [], "imported": [], "from": seen["from"]}
    assert Path(seen["from"]).is_relative_to(tmp_path / "venv")
