"""Adapter files: what is written, what loads, what fails, and the Hub upload (intercepted, no network)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from huggingface_hub import HfApi
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

import hmt_adapters as ha
from tiny import random_ids, tiny_backbone

CFG = dict(segment_length=8, sensory_length=2, memory_window=3, retrieval_dim=8)


def trained(model: ha.MemoryModel) -> ha.MemoryModel:
    with torch.no_grad():
        for p in model.memory_parameters():
            p.add_(torch.randn_like(p))
    return model.eval()


def test_only_the_adapter_is_written(tmp_path):
    model = trained(ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **CFG))
    model.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["memory_adapter.safetensors", "memory_config.json"]
    weights = load_file(tmp_path / "memory_adapter.safetensors")
    assert sorted(weights) == ["memory_init", "retrieval.key.weight", "retrieval.query.weight", "summary_prompt"]
    config = json.loads((tmp_path / "memory_config.json").read_text())
    assert config["method"] == "hmt" and config["embed_dim"] == 32 and config["base_model_type"] == "llama"


def test_loading_onto_a_backbone_of_another_width_is_a_clear_error(tmp_path):
    trained(ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **CFG)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"another hidden size \(saved for embedding width 32, this backbone has 16\)"):
        ha.MemoryModel.from_pretrained(tiny_backbone("opt"), str(tmp_path))


def test_corrupted_and_missing_files_are_clear_errors(tmp_path):
    trained(ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)).save_pretrained(tmp_path)
    (tmp_path / "memory_adapter.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="not a readable safetensors file.*corrupted"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    os.remove(tmp_path / "memory_adapter.safetensors")
    with pytest.raises(FileNotFoundError, match="has no memory_adapter.safetensors"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="has no memory_config.json"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(empty))


def test_an_adapter_of_another_method_with_foreign_weights_is_refused(tmp_path):
    trained(ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **CFG)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "memory_config.json").read_text())
    (tmp_path / "memory_config.json").write_text(json.dumps({"method": "rmt", "segment_length": config["segment_length"]}))
    with pytest.raises(ValueError, match="holds weights .*'retrieval.key.weight'.* that rmt does not have"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))


def test_lora_and_memory_adapters_are_saved_and_restored_together(tmp_path):
    base = get_peft_model(tiny_backbone("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model = ha.wrap_with_memory(base, "hmt", **CFG)
    lora = [n for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    assert lora, "LoRA weights must stay trainable next to the memory parameters"
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(tmp_path)
    assert {"adapter_config.json", "adapter_model.safetensors", "memory_adapter.safetensors"} <= set(os.listdir(tmp_path))
    assert "model.safetensors" not in os.listdir(tmp_path)
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path)).eval()
    ids = random_ids(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=1e-5)


def test_lora_weights_load_into_a_backbone_that_already_has_lora(tmp_path):
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    model = ha.wrap_with_memory(get_peft_model(tiny_backbone("llama"), lora), "rmt", segment_length=8)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    model.eval().save_pretrained(tmp_path)
    fresh = get_peft_model(tiny_backbone("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    loaded = ha.MemoryModel.from_pretrained(fresh, str(tmp_path)).eval()
    ids = random_ids(1, 20)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=1e-5)
    other = get_peft_model(tiny_backbone("llama"), LoraConfig(r=4, target_modules=["k_proj"]))
    with pytest.raises(ValueError, match="do not fit the LoRA layers"):
        ha.MemoryModel.from_pretrained(other, str(tmp_path))


def test_push_to_hub_uploads_the_adapter_and_a_model_card(monkeypatch):
    sent = {}

    def fake_create_repo(self, repo_id, **kwargs):
        sent["created"] = repo_id

    def fake_upload_folder(self, *, repo_id, folder_path, commit_message, **kwargs):
        sent["repo_id"] = repo_id
        sent["files"] = sorted(os.listdir(folder_path))
        sent["card"] = open(os.path.join(folder_path, "README.md")).read()
        sent["config"] = json.load(open(os.path.join(folder_path, "memory_config.json")))
        sent["message"] = commit_message
        return "commit-url"

    monkeypatch.setattr(HfApi, "create_repo", fake_create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", fake_upload_folder)
    base = tiny_backbone("llama")
    base.config._name_or_path = "HuggingFaceTB/SmolLM2-135M"
    model = ha.wrap_with_memory(base, "hmt", **CFG)
    assert model.push_to_hub("me/smol-hmt") == "commit-url"
    assert sent["created"] == sent["repo_id"] == "me/smol-hmt"
    assert sent["files"] == ["README.md", "memory_adapter.safetensors", "memory_config.json"]
    card = sent["card"]
    assert "library_name: hmt-adapters" in card and "base_model: HuggingFaceTB/SmolLM2-135M" in card
    assert "- hmt" in card and "| `sensory_length` | `2` |" in card and "| `memory_window` | `3` |" in card
    assert 'MemoryModel.from_pretrained(base, "me/smol-hmt")' in card
    assert sent["config"]["method"] == "hmt"
