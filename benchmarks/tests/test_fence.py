"""The fence between the library and its lab (benchmarks/README.md): the lab's scripts import the library's public
modules only and none of the library's tests; the library's tests import nothing of the lab."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
LIBRARY_TESTS = sorted((ROOT / "tests").glob("*.py"))
# what a user or a method author imports (docs/architecture.md, "Public modules"); submodules of these count too
PUBLIC_PACKAGES = ("backbones", "data", "evaluation", "training", "tasks", "compat", "method", "memory", "methods")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def is_public(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "hmt_adapters" and (len(parts) == 1 or parts[1] in PUBLIC_PACKAGES)


def test_the_fence_sees_every_script_and_test():
    assert len(SCRIPTS) > 15 and len(LIBRARY_TESTS) > 40
    assert not is_public("hmt_adapters.runtime.offload") and is_public("hmt_adapters.evaluation.records")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_script_imports_public_library_modules_only(script):
    inner = {m for m in imported_modules(script) if m.split(".")[0] == "hmt_adapters" and not is_public(m)}
    assert not inner, f"{script.name} imports library internals {sorted(inner)}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_script_imports_none_of_the_library_tests(script):
    helpers = {p.stem for p in LIBRARY_TESTS}
    assert not imported_modules(script) & helpers
    assert '"tests"' not in script.read_text()  # no sys.path entry into tests/


@pytest.mark.parametrize("test_file", LIBRARY_TESTS, ids=lambda p: p.name)
def test_the_library_tests_never_name_the_lab(test_file):
    lab = {p.stem for p in SCRIPTS}
    assert not imported_modules(test_file) & lab
    assert "benchmarks" not in test_file.read_text()
