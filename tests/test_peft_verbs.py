"""peft's and transformers' own verbs on memory models (docs/training.md, "peft's verbs"): `merge_and_unload` keeps the
memory, peft wrapping a MemoryModel is refused naming the order, a merged peft backbone is not saved as an empty LoRA,
a saved folder is refused by plain transformers / peft loading with an error naming AutoMemoryModelForCausalLM, the
parameter counts are peft's, and resizing the token embeddings goes to the backbone."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from peft import AutoPeftModelForCausalLM, LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, pipeline

import hmt_adapters as ha
from tiny import random_ids, tiny_backbone

HMT = dict(segment_length=8, sensory_length=2, memory_window=4)
HINT = "AutoMemoryModelForCausalLM"


def lora_memory_model(base: torch.nn.Module | None = None) -> ha.MemoryModel:
    base = base if base is not None else tiny_backbone("llama")
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = ha.wrap_with_memory(get_peft_model(base, lora), "hmt", **HMT).eval()
    with torch.no_grad():
        for p in model.memory_parameters():
            p.add_(0.1 * torch.randn_like(p))  # memory weights that differ from a fresh model's
    return model


def logits(model: ha.MemoryModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_merge_and_unload_keeps_the_memory_and_saves_a_memory_only_adapter(tmp_path):
    model = lora_memory_model()
    ids = random_ids(2, 27, seed=1)
    before = logits(model, ids)
    merged = model.merge_and_unload()
    assert isinstance(merged, ha.MemoryModel) and not isinstance(merged.base_model, PeftModel)
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(logits(merged, ids), before, atol=1e-5, rtol=1e-5)
    merged.save_pretrained(tmp_path / "adapter")
    assert sorted(os.listdir(tmp_path / "adapter")) == [
        "config.json",
        "memory_adapter.safetensors",
        "memory_config.json",
    ]
    assert json.loads((tmp_path / "adapter" / "memory_config.json").read_text())["base_model_name_or_path"] is None
    merged.base_model.save_pretrained(tmp_path / "base")
    merged_base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reloaded = ha.MemoryModel.from_pretrained(merged_base, tmp_path / "adapter")
    torch.testing.assert_close(logits(reloaded, ids), before, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no peft adapter to merge"):
        merged.merge_and_unload()


def test_saving_after_peft_merged_the_backbone_is_refused_not_an_empty_lora(tmp_path):
    model = lora_memory_model()
    model.base_model.merge_and_unload()
    with pytest.raises(ValueError, match=r"model = model.merge_and_unload\(\)"):
        model.save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


@pytest.mark.parametrize("task_type", [None, "CAUSAL_LM"])
def test_get_peft_model_on_a_memory_model_is_refused_naming_the_order(task_type):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **HMT)
    with pytest.raises(TypeError, match=r"wrap_with_memory\(get_peft_model\(base, peft_config\)"):
        get_peft_model(model, LoraConfig(target_modules=["q_proj"], task_type=task_type))
    with pytest.raises(TypeError, match=r"wrap_with_memory\(get_peft_model\(base, peft_config\)"):
        ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **HMT).add_adapter(LoraConfig(target_modules=["q_proj"]))


@pytest.fixture
def saved(tmp_path):
    """A local base folder, and adapters saved from a model on it: with LoRA (`lora`) and memory only (`memory`)."""
    tiny_backbone("llama").save_pretrained(tmp_path / "base")
    base = lambda: AutoModelForCausalLM.from_pretrained(tmp_path / "base")  # noqa: E731
    lora = lora_memory_model(base())
    lora.save_pretrained(tmp_path / "lora")
    memory = ha.wrap_with_memory(base(), "hmt", **HMT)
    memory.save_pretrained(tmp_path / "memory")
    return tmp_path, base, lora


def test_plain_transformers_and_peft_loading_refuse_the_folder_naming_the_memory_loader(saved):
    tmp_path, base, lora = saved
    for folder in ("lora", "memory"):
        with pytest.raises(ValueError, match=HINT):
            AutoModelForCausalLM.from_pretrained(tmp_path / folder)
        with pytest.raises(ValueError, match=HINT):
            pipeline("text-generation", model=str(tmp_path / folder))
    with pytest.raises(KeyError, match=HINT):
        PeftModel.from_pretrained(base(), tmp_path / "lora")
    with pytest.raises(KeyError, match=HINT):
        AutoPeftModelForCausalLM.from_pretrained(tmp_path / "lora")
    # ... while this package loads it, LoRA and memory, exactly
    ids = random_ids(2, 21, seed=4)
    reloaded = ha.AutoMemoryModelForCausalLM.from_pretrained(tmp_path / "lora")
    torch.testing.assert_close(logits(reloaded, ids), logits(lora, ids), atol=0, rtol=0)
    assert any("lora_" in n for n, _ in reloaded.named_parameters())


def test_a_format_1_folder_with_a_plain_peft_config_still_loads(tmp_path):
    """Adapters saved before the guard (format 1: plain `adapter_config.json`, no `config.json`) load unchanged."""
    model = lora_memory_model()
    model.save_pretrained(tmp_path)
    peft_config = json.loads((tmp_path / "adapter_config.json").read_text())
    peft_config["peft_type"] = peft_config.pop("hmt_adapters_peft_type")
    (tmp_path / "adapter_config.json").write_text(json.dumps(peft_config))
    memory_config = json.loads((tmp_path / "memory_config.json").read_text())
    (tmp_path / "memory_config.json").write_text(json.dumps({**memory_config, "format_version": 1}))
    os.remove(tmp_path / "config.json")
    ids = random_ids(2, 19, seed=2)
    reloaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path)
    torch.testing.assert_close(logits(reloaded, ids), logits(model, ids), atol=0, rtol=0)


def test_trainable_parameter_counts_are_peft_s_with_the_memory_added(capsys):
    """`get_nb_trainable_parameters` / `print_trainable_parameters` as peft reports them, over the whole model: the
    LoRA weights peft counts plus the memory's."""
    model = lora_memory_model()
    lora_trainable, backbone_total = model.backbone.get_nb_trainable_parameters()
    memory = sum(p.numel() for p in model.memory_parameters())
    assert memory > 0
    trainable, total = model.get_nb_trainable_parameters()
    assert (trainable, total) == (
        lora_trainable + memory,
        backbone_total + sum(p.numel() for p in model.memory.parameters()),
    )
    model.print_trainable_parameters()
    assert f"trainable params: {trainable:,d} || all params: {total:,d}" in capsys.readouterr().out


def test_resize_token_embeddings_grows_the_backbone_and_keeps_the_old_tokens_logits():
    """New tokens (a tokenizer with added special tokens) through the memory model: the backbone's embeddings and LM
    head grow, the old tokens' logits are unchanged, a frozen backbone stays frozen, the new ids are read."""
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **HMT).eval()
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = random_ids(2, 27, seed=2)
    before = logits(model, ids)
    embeddings = model.resize_token_embeddings(vocab + 4)
    assert embeddings.weight.shape[0] == vocab + 4 and model.config.vocab_size == vocab + 4
    assert not embeddings.weight.requires_grad and not model.get_output_embeddings().weight.requires_grad
    after = logits(model, ids)
    assert after.shape[-1] == vocab + 4 and torch.equal(after[..., :vocab], before)
    assert logits(model, torch.full((1, 9), vocab + 3)).shape == (1, 9, vocab + 4)


def test_saving_after_resizing_says_the_added_rows_are_not_in_the_adapter(tmp_path):
    """The rows `resize_token_embeddings` adds are the backbone's: `save_pretrained` warns that the adapter does not
    hold them (a reload onto a base resized again would read other values for the new tokens); without a resize,
    no such warning."""
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **HMT)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.save_pretrained(tmp_path / "plain")
    assert not [w for w in seen if "resize_token_embeddings" in str(w.message)]
    vocab = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(vocab + 2)
    model.resize_token_embeddings(vocab + 4)
    with pytest.warns(UserWarning, match=rf"grew from {vocab} to {vocab + 4} rows"):
        model.save_pretrained(tmp_path / "resized")
