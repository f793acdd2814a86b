"""tools/version_matrix.py builds the package it tests from a copy of the working tree whose transformers range has
no ceiling: with the ceiling kept, the release above the tested range (the one `--refresh-lock` exists to try) could
never install."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

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


def test_the_range_is_rewritten_in_the_one_transformers_requirement_or_not_at_all():
    text = '[project]\ndependencies = ["torch>=2.6", "transformers>=5.17.0,<5.25", "peft>=0.18.0"]\n'
    assert version_matrix.with_transformers_range(text, ">=5.17.0,<5.26") == text.replace("<5.25", "<5.26")
    with pytest.raises(ValueError, match="one `transformers>=...` requirement; found 0"):
        version_matrix.with_transformers_range(text.replace("transformers", "tokenizers"), ">=1")
