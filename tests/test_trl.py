"""TRL on a `MemoryModel` (docs/training.md, "TRL"): `SFTTrainer`'s fused LM head reads hidden states with memory and
equals `forward`; memory and LoRA train and save with no subclass; `peft_config` and padding-free batches are refused
with the order that works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from trl import SFTConfig, SFTTrainer
from trl.trainer.utils import add_fused_lm_head

import hmt_adapters as ha
from tiny import random_ids, tiny_llama, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
METHODS = {
    "hmt": dict(segment_length=8, sensory_length=2, memory_window=4),
    "transformer_xl": dict(segment_length=8, memory_size=16),
}


def memory_model(method: str, lora: bool = True) -> ha.MemoryModel:
    base = tiny_llama(len(tiny_tokenizer()))
    if lora:
        base = get_peft_model(
            base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        )
    return ha.wrap_with_memory(base, method, **METHODS[method])


@pytest.mark.parametrize("method", sorted(METHODS))
def test_fused_lm_head_equals_forward_with_memory(method):
    """TRL's fused head (the loss `SFTTrainer` trains on) equals the memory model's own loss, per-token
    log-probabilities and gradients, on a right-padded batch spanning several segments."""
    model = memory_model(method)
    ids = random_ids(2, 29, seed=3, vocab=300)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    fused = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    fused.loss.backward()
    torch.testing.assert_close(fused.loss, out.loss, atol=1e-6, rtol=1e-6)
    logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None].clamp(min=0))[..., 0]
    target = labels[:, 1:] != -100
    torch.testing.assert_close(fused.log_probs[target], logp[target].detach(), atol=1e-5, rtol=1e-5)
    assert torch.equal(fused.label_mask, target)
    for name, grad in grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, atol=1e-6, rtol=1e-5)
    assert any("lora_" in n for n in grads)
    assert any(n.startswith("memory.") for n in grads) == (method == "hmt")  # Transformer-XL has no memory weights
    # the non-fused call TRL makes for metrics (`use_cache=False`) is the plain forward
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, use_cache=False).logits, out.logits)


def test_example_trains_memory_and_lora_with_sft_trainer_and_reloads(tmp_path):
    """`examples/trl_sft.py --tiny`: SFTTrainer updates every memory and LoRA weight, `save_model` writes both, and
    the folder reloads to the trained model's logits exactly."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "trl_sft.py"),
            "--tiny",
            "--max-steps",
            "2",
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["memory_updated"] and report["lora_updated"]
    assert report["reloaded_max_abs_logit_gap"] == 0.0
    files = set(os.listdir(tmp_path / "out"))
    expected = {"memory_config.json", "memory_adapter.safetensors", "adapter_config.json", "adapter_model.safetensors"}
    assert expected <= files


def sft_config(out, **kw) -> SFTConfig:
    return SFTConfig(
        str(out),
        max_steps=1,
        per_device_train_batch_size=2,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        **kw,
    )


def test_sft_peft_config_on_a_memory_model_is_refused_naming_the_order(tmp_path):
    model = memory_model("hmt", lora=False)
    data = Dataset.from_dict({"text": ["the passkey is 42"] * 4})
    with pytest.raises(TypeError, match=r"wrap_with_memory\(get_peft_model\(base, peft_config\)"):
        SFTTrainer(
            model=model,
            args=sft_config(tmp_path),
            train_dataset=data,
            processing_class=tiny_tokenizer(),
            peft_config=LoraConfig(target_modules=["q_proj"]),
        )


def test_sft_padding_free_batches_are_refused(tmp_path):
    """Padding-free batches pack documents into one row with `position_ids`: memory would carry one into the next."""
    model = memory_model("hmt", lora=False)
    data = Dataset.from_dict({"text": ["the passkey is 42 and the door is red"] * 4})
    trainer = SFTTrainer(
        model=model,
        args=sft_config(tmp_path, padding_free=True, max_length=None),
        train_dataset=data,
        processing_class=tiny_tokenizer(),
    )
    with pytest.raises(ValueError, match="position_ids.*padding_free"):
        trainer.train()
