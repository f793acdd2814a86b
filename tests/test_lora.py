"""LoRA on the backbone with the memory parameters: per-architecture targets, save/reload, memory-saving switches."""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.training import add_lora, lora_target_modules
from tiny import family_backbone, random_ids, tiny_backbone

HMT = dict(segment_length=8, sensory_length=2, memory_window=4)
SWITCHES = [
    dict(),
    dict(offload_activations=True),
    dict(gradient_checkpointing=True),
    dict(offload_activations=True, gradient_checkpointing=True),
]


def lora_hmt(seed: int = 0, **kw) -> ha.MemoryModel:
    torch.manual_seed(seed)
    return ha.wrap_with_memory(add_lora(tiny_backbone("llama", seed), dropout=0.0), "hmt", **{**HMT, **kw})


def test_targets_come_from_peft_per_architecture_and_unknown_ones_are_a_clear_error():
    assert lora_target_modules(tiny_backbone("llama")) == ["q_proj", "v_proj"]
    assert lora_target_modules(tiny_backbone("gpt2")) == ["c_attn"]
    # an architecture newer than peft's table gets peft's Llama default where its attention has those projections
    assert lora_target_modules(family_backbone("gpt_oss")) == ["q_proj", "v_proj"]
    with pytest.raises(ValueError, match="no default LoRA target modules for model type 'mamba'.*in_proj"):
        lora_target_modules(tiny_backbone("mamba"))
    with pytest.raises(ValueError, match="already carries peft adapters"):
        add_lora(add_lora(tiny_backbone("llama")))


def test_lora_and_memory_train_together_and_reload_from_one_directory(tmp_path):
    model = lora_hmt()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in trainable) and any(n.startswith("memory.") for n in trainable)
    assert all("lora_" in n or n.startswith("memory.") for n in trainable)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.1)  # LoRA B starts at zero: make the adapter matter
    model.save_pretrained(tmp_path)
    assert {"adapter_config.json", "adapter_model.safetensors", "memory_adapter.safetensors"} <= set(
        os.listdir(tmp_path)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # peft's read of a deprecated transformers property stays quiet
        add_lora(tiny_backbone("llama"))
        reloaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path)).eval()
    ids = random_ids(2, 30)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits, atol=1e-6, rtol=1e-5
        )


def test_memory_saving_switches_give_the_same_lora_and_memory_gradients():
    ids = random_ids(2, 4 * 8 + 3)
    results = []
    for switches in SWITCHES:
        model = lora_hmt(**switches)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.1)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        assert any("lora_A" in n and g.abs().sum() > 0 for n, g in grads.items())
        results.append((loss.detach(), grads))
    ref_loss, ref_grads = results[0]
    for loss, grads in results[1:]:
        torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], atol=1e-6, rtol=1e-5)


QUERY_PROJECTIONS = {"llama": ["q_proj"], "phi3": ["qkv_proj"], "gpt_neox": ["query_key_value"]}


@pytest.mark.parametrize("family", sorted(QUERY_PROJECTIONS))  # q_proj, fused qkv_proj, per-head query_key_value
def test_trams_selects_with_the_query_lora_applies_as_the_merged_model_does(family):
    """TRAMS scores memory keys with W_q (its metric); under LoRA that is the base weight plus the adapter's delta."""
    trams = dict(segment_length=8, memory_size=16, select_size=8)
    lora = add_lora(family_backbone(family), rank=2, dropout=0.0, target_modules=QUERY_PROJECTIONS[family])
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)  # peft starts B at zero (no delta): make the delta real
    merged = ha.wrap_with_memory(copy.deepcopy(lora).merge_and_unload(), "trams", **trams).eval()
    model = ha.wrap_with_memory(lora, "trams", **trams).eval()
    ids = random_ids(2, 40)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, merged(input_ids=ids).logits, atol=2e-5, rtol=1e-4)
