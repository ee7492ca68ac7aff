"""Which package may import which: the pure core stays pure, tooling stays out of serving, bench out of tests."""

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


def test_the_checker_sees_a_crossing(tmp_path: Path) -> None:
    """The AST walk finds imports at any depth (a boundary test that sees nothing proves nothing)."""
    source = tmp_path / "example.py"
    source.write_text("def f():\n    from tests.records import x\n    import clef_operator.kube\n")
    assert [module for module, _ in imports(source)] == ["tests.records", "clef_operator.kube"]
