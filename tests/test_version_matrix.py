"""tools/version_matrix.py builds the package it tests from a copy of the working tree whose transformers range has
no ceiling: with the ceiling kept, the release above the tested range (the one `--refresh-lock` exists to try) could
never install."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("version_matrix", ROOT / "tools" / "version_matrix.py")
version_matrix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(version_matrix)


def test_the_tested_copy_drops_only_the_transformers_ceiling(tmp_path):
    copy = version_matrix.uncapped_source(tmp_path / "source")
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    theirs = tomllib.loads((copy / "pyproject.toml").read_text())["project"]
    pinned = [d for d in ours["dependencies"] if d.startswith("transformers")]
    assert len(pinned) == 1 and "<" in pinned[0]  # the tested range has a ceiling here
    floor = pinned[0].split(",")[0]
    assert theirs["dependencies"] == [floor if d == pinned[0] else d for d in ours["dependencies"]]
    assert {k: v for k, v in theirs.items() if k != "dependencies"} == {
        k: v for k, v in ours.items() if k != "dependencies"
    }
    assert (copy / "hmt_adapters" / "__init__.py").read_bytes() == (ROOT / "hmt_adapters" / "__init__.py").read_bytes()
    assert not (copy / ".venv").exists() and not (copy / ".git").exists()
