"""Which package may import which: the pure core stays pure, tooling stays out of serving, bench out of tests,
and inside the predictor each layer imports only the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = {
    "clef_head": REPO / "clef_head",
    "clef_plugin": REPO / "clef_plugin",
    "predictor": REPO / "predictor",
    "clef_tools": REPO / "clef_tools",
    "clef_operator": REPO / "operator" / "clef_operator",
    "clef_contract": REPO / "operator" / "clef_contract",
    "bench": REPO / "bench",
}
OURS = (*FOLDERS, "tests")
# What each package may import of ours; anything else of ours is a boundary crossed.
ALLOWED = {
    "clef_head": set(),
    "clef_plugin": {"clef_head"},
    "predictor": {"clef_head", "clef_plugin", "clef_tools"},
    "clef_tools": {"clef_head"},
    "clef_operator": {"clef_contract"},
    "clef_contract": set(),
    "bench": {"clef_head", "clef_plugin", "predictor", "clef_tools", "clef_contract"},
}
# The serving path reaches release tooling through one function only: the demo release's builder.
TOOLING_GATEWAY = (REPO / "predictor" / "demo.py", "clef_tools.tiny", {"build_tiny_release"})
# The predictor's layers, lowest first: each sub-package may import its own layer and those below it only.
# The entry points (the modules directly in predictor/: CLIs, their configuration, the demo, the KServe model) sit
# on top.
LAYERS = ("core", "engines", "serving", "http")
ENTRY_POINTS = {"__init__", "__main__", "cli", "config", "systemone_cli", "demo", "model"}
# Tooling's libraries that the serving package must not import (they live in the bench extra).
TOOLING_ONLY = {"aiohttp"}


def imports(path: Path) -> list[tuple[str, set[str]]]:
    """(module, names) of every absolute import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, set()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, {alias.name for alias in node.names}))
    return found


@pytest.mark.parametrize("package", sorted(FOLDERS))
def test_package_imports_only_what_it_may(package: str) -> None:
    crossed = []
    for path in sorted(FOLDERS[package].rglob("*.py")):
        for module, names in imports(path):
            top = module.split(".")[0]
            if top in OURS and top != package and top not in ALLOWED[package]:
                crossed.append(f"{path.relative_to(REPO)} imports {module}")
            if package == "predictor" and top == "clef_tools":
                gateway, allowed_module, allowed_names = TOOLING_GATEWAY
                if path != gateway or module != allowed_module or not names <= allowed_names:
                    crossed.append(f"{path.relative_to(REPO)} imports {module} {sorted(names)}")
    assert not crossed, crossed


def layer_of(path: Path) -> str:
    """The layer of a module under predictor/: its sub-package, or ``entry`` for a module directly in it."""
    parts = path.relative_to(REPO / "predictor").parts
    if len(parts) == 1:
        assert path.stem in ENTRY_POINTS, f"{path.relative_to(REPO)} is in no layer: move it into one of {LAYERS}"
        return "entry"
    assert parts[0] in LAYERS, f"{path.relative_to(REPO)}: predictor/{parts[0]}/ is not a layer of {LAYERS}"
    return parts[0]


def predictor_modules(module: str, names: set[str]) -> list[str]:
    """The predictor modules an import reaches (``from predictor import cli`` reaches ``predictor.cli``)."""
    if module == "predictor":
        return [f"predictor.{name}" for name in names]
    return [module] if module.startswith("predictor.") else []


def test_predictor_layers_import_downwards_only() -> None:
    """core <- engines <- serving <- http <- entry points: no layer imports one above it (the pipeline knows no
    HTTP, engines know no pipeline), and every module sits in a layer."""
    crossed = []
    for path in sorted((REPO / "predictor").rglob("*.py")):
        layer = layer_of(path)
        if layer == "entry":
            continue
        allowed = set(LAYERS[: LAYERS.index(layer) + 1])
        for module, names in imports(path):
            for target in predictor_modules(module, names):
                target_layer = target.split(".")[1]
                if target_layer not in allowed:
                    crossed.append(f"{path.relative_to(REPO)} ({layer}) imports {target}")
    assert not crossed, crossed


def test_serving_package_imports_no_tooling_library() -> None:
    """The load tool and its HTTP client live in bench/ (the bench extra), not in what a server installs."""
    found = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in sorted((REPO / "predictor").rglob("*.py"))
        for module, _ in imports(path)
        if module.split(".")[0] in TOOLING_ONLY
    ]
    assert not found, found


def test_the_layer_rule_sees_a_crossing() -> None:
    """The layer check reads both import forms and places modules by folder."""
    assert predictor_modules("predictor", {"cli"}) == ["predictor.cli"]
    assert predictor_modules("predictor.http.errors", {"ApiError"}) == ["predictor.http.errors"]
    assert layer_of(REPO / "predictor" / "serving" / "service.py") == "serving"
    assert layer_of(REPO / "predictor" / "model.py") == "entry"


def test_the_checker_sees_a_crossing(tmp_path: Path) -> None:
    """The AST walk finds imports at any depth (a boundary test that sees nothing proves nothing)."""
    source = tmp_path / "example.py"
    source.write_text("def f():\n    from tests.records import x\n    import clef_operator.kube\n")
    assert [module for module, _ in imports(source)] == ["tests.records", "clef_operator.kube"]
