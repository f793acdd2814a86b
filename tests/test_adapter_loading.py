"""Loading and saving adapters as peft does: eval mode by default, the base left alone, atomic saves, recorded base
facts and format version checked on load, other peft adapter types, and the one-line auto loader."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from peft import IA3Config, LoHaConfig, LoraConfig, PromptTuningConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, pipeline

import hmt_adapters as ha
from hmt_adapters.backbones import pretrained
from hmt_adapters.backbones.pretrained import smollm2_tokenizer
from hmt_adapters.config import RUNTIME_SWITCHES, MemoryConfig
from hmt_adapters.data import WindowCollator
from hmt_adapters.saving import adapter_io
from test_hub import hub_cache
from tiny import random_ids, tiny_backbone, tiny_llama, tiny_tokenizer

HMT = dict(segment_length=8, sensory_length=2, memory_window=3, retrieval_dim=8)
SHIPPED = Path(__file__).resolve().parents[1] / "examples" / "adapters"


def perturbed(model: ha.MemoryModel, scale: float = 0.1) -> ha.MemoryModel:
    """`model` with its trainable weights moved off their initial values (LoRA B starts at zero)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn_like(p))
    return model


def lora_hmt(dropout: float = 0.1) -> ha.MemoryModel:
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=dropout)
    return perturbed(ha.wrap_with_memory(get_peft_model(tiny_backbone("llama"), lora), "hmt", **HMT))


# ---- eval mode by default, is_trainable ---------------------------------------------------------------------------


def test_a_loaded_adapter_is_in_eval_mode_and_frozen_so_repeated_forwards_agree(tmp_path):
    lora_hmt(dropout=0.5).save_pretrained(tmp_path)
    model = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    assert not model.training and not any(m.training for m in model.modules())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == []
    ids = random_ids(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, model(input_ids=ids).logits, atol=0, rtol=0)


def test_is_trainable_gives_trainable_memory_and_lora_in_train_mode(tmp_path):
    lora_hmt().save_pretrained(tmp_path)
    model = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path), is_trainable=True)
    assert model.training
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any(n.startswith("memory.") for n in trainable) and any("lora_" in n for n in trainable)
    assert all(n.startswith("memory.") or "lora_" in n for n in trainable)
    ids = random_ids(2, 20)
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


# ---- the base passed in ---------------------------------------------------------------------------------------------


def test_loading_a_lora_adapter_leaves_the_base_passed_in_unchanged_unless_inplace(tmp_path):
    lora_hmt().save_pretrained(tmp_path)
    base = tiny_backbone("llama")
    ids = random_ids(1, 12)
    with torch.no_grad():
        before = base(input_ids=ids).logits
    snapshot = {k: v.clone() for k, v in base.state_dict().items()}
    model = ha.MemoryModel.from_pretrained(base, str(tmp_path))
    assert any("lora_" in n for n, _ in model.named_parameters())
    assert not any("lora_" in n for n, _ in base.named_modules()) and set(base.state_dict()) == set(snapshot)
    with torch.no_grad():
        torch.testing.assert_close(base(input_ids=ids).logits, before, atol=0, rtol=0)
    in_place = ha.MemoryModel.from_pretrained(base, str(tmp_path), inplace=True)
    assert unwrap(in_place.backbone) is base and any("lora_" in n for n, _ in base.named_modules())


def unwrap(model):
    return model.get_base_model()


# ---- atomic saves, stale files --------------------------------------------------------------------------------------


def test_a_save_that_fails_mid_write_leaves_the_previous_save_intact(tmp_path, monkeypatch):
    target = tmp_path / "adapter"
    lora_hmt().save_pretrained(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(MemoryConfig, "to_json_string", fail)  # the config is written after every weight file
    with pytest.raises(OSError, match="disk full"):
        perturbed(lora_hmt()).save_pretrained(target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no temporary folder left behind


def test_a_new_save_removes_lora_files_of_an_earlier_save(tmp_path):
    lora_hmt().save_pretrained(tmp_path)
    plain = perturbed(ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **HMT)).eval()
    plain.save_pretrained(tmp_path)
    assert not {"adapter_config.json", "adapter_model.safetensors"} & set(os.listdir(tmp_path))
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    assert not any("lora_" in n for n, _ in loaded.named_parameters())
    ids = random_ids(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-6, rtol=1e-5)


def test_saving_into_a_folder_keeps_files_that_are_not_the_adapters(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8).save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [
        "config.json",
        "memory_adapter.safetensors",
        "memory_config.json",
        "tokenizer.json",
    ]


# ---- recorded base facts, format version, required fields -----------------------------------------------------------


def test_the_config_records_the_base_model_and_the_format_version(tmp_path):
    base = tiny_backbone("llama")
    base.config._name_or_path = "org/tiny-llama"
    ha.wrap_with_memory(base, "rmt", segment_length=8).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "memory_config.json").read_text())
    assert {
        k: config[k]
        for k in (
            "format_version",
            "base_model_name_or_path",
            "base_model_architecture",
            "base_model_type",
            "embed_dim",
            "hidden_size",
            "num_hidden_layers",
            "vocab_size",
        )
    } == {
        "format_version": adapter_io.FORMAT_VERSION,
        "base_model_name_or_path": "org/tiny-llama",
        "base_model_architecture": "LlamaForCausalLM",
        "base_model_type": "llama",
        "embed_dim": 32,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "vocab_size": 96,
    }


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(vocab_size=128), r"vocab_size 96 \(adapter\) vs 128 \(given base\)"),
        (dict(num_hidden_layers=3), r"num_hidden_layers 2 \(adapter\) vs 3 \(given base\)"),
    ],
)
def test_an_adapter_is_refused_by_a_base_of_another_vocabulary_or_depth(tmp_path, change, message):
    ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=message):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama", **change), str(tmp_path))


def test_an_adapter_is_refused_by_another_architecture_of_the_same_width(tmp_path):
    ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"base_model_architecture 'LlamaForCausalLM' \(adapter\) vs 'Qwen2ForCausalLM'"
    ):
        ha.MemoryModel.from_pretrained(tiny_backbone("qwen2"), str(tmp_path))


def edit_config(folder: Path, **changes) -> None:
    path = folder / "memory_config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def test_a_config_missing_a_field_or_of_a_newer_format_is_an_error(tmp_path):
    ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=16).save_pretrained(tmp_path)
    edit_config(tmp_path, segment_length=None)
    with pytest.raises(ValueError, match=r"lacks the required field\(s\) \['segment_length'\] of RMTConfig"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path), segment_length=16)
    assert loaded.memory_config.segment_length == 16
    edit_config(tmp_path, segment_length=16, format_version=99)
    with pytest.raises(ValueError, match="format version 99, but hmt-adapters .* reads formats 0 to 2: .*upgrade"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))


def test_a_file_written_before_a_field_was_added_loads_with_the_behaviour_it_had(tmp_path):
    """`keep_question_blocks`, `block_positions`, `match_score`, `match_in_view`, `match_neighbours`, `max_window` and
    `match_min_ratio` came after InfLLM files existed (metadata `"absent"`): a file without them loads with `False` /
    `"window"` / `"attention"` / `False` / `"after"` / `None` / `None`, the behaviour of the package that wrote it
    (whatever today's default: `"ordered"`, `"tokens"`, `"both"` and 512 now); a missing field that is not marked is
    still refused."""
    config = ha.InfLLMConfig.paper(segment_length=16, block_size=8, representative_keys=2, keep_question_blocks=True)
    model = ha.wrap_with_memory(tiny_backbone("llama"), config)
    model.save_pretrained(tmp_path)
    absent = {
        "keep_question_blocks": False,
        "block_positions": "window",
        "match_score": "attention",
        "match_in_view": False,
        "match_neighbours": "after",
        "max_window": None,
        "match_min_ratio": None,
    }
    assert ha.InfLLMConfig.absent_values() == absent
    edit_config(tmp_path, keep_question_blocks=None)
    assert (
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path)).memory_config.keep_question_blocks
        is False
    )
    edit_config(tmp_path, topk_blocks=None)
    with pytest.raises(ValueError, match=r"lacks the required field\(s\) \['topk_blocks'\] of InfLLMConfig"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))


# ---- other peft adapter types ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "peft_config, marker",
    [
        (IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]), "ia3_l"),
        (LoHaConfig(r=4, target_modules=["q_proj", "v_proj"]), "hada_"),
    ],
)
def test_non_lora_peft_adapters_train_and_save_with_the_memory(tmp_path, peft_config, marker):
    model = ha.wrap_with_memory(
        get_peft_model(tiny_backbone("llama"), peft_config), "rmt", segment_length=8, num_memory_tokens=2
    )
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any(marker in n for n in trainable) and all(marker in n or n.startswith("memory.") for n in trainable)
    ids = random_ids(2, 20)
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if marker in n]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    perturbed(model).eval().save_pretrained(tmp_path)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(tmp_path))
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=1e-5)


def test_prompt_learning_peft_adapters_are_refused_at_wrap_time():
    prompt = get_peft_model(tiny_backbone("llama"), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    with pytest.raises(NotImplementedError, match="PROMPT_TUNING .*prompt learning.*use a tuner adapter"):
        ha.wrap_with_memory(prompt, "rmt", segment_length=8)


# ---- the one-line loader --------------------------------------------------------------------------------------------


def test_the_auto_loader_builds_the_recorded_base_and_adds_the_adapter(tmp_path):
    base = tiny_backbone("llama")
    base.save_pretrained(tmp_path / "base")
    reloaded_base = LlamaForCausalLM.from_pretrained(tmp_path / "base")  # records its folder as _name_or_path
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    model = perturbed(ha.wrap_with_memory(get_peft_model(reloaded_base, lora), "hmt", **HMT)).eval()
    model.save_pretrained(tmp_path / "adapter")
    loaded = ha.AutoMemoryModelForCausalLM.from_pretrained(str(tmp_path / "adapter"))
    assert isinstance(loaded, ha.MemoryModel) and not loaded.training
    ids = random_ids(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=1e-5)
    edit_config(tmp_path / "adapter", base_model_name_or_path="/nowhere/base")
    with pytest.raises(FileNotFoundError, match="base model '/nowhere/base' is neither a local directory"):
        ha.AutoMemoryModelForCausalLM.from_pretrained(str(tmp_path / "adapter"))


def test_the_auto_loader_takes_adapter_and_base_from_the_hub_cache_offline(tmp_path):
    tiny_backbone("llama").save_pretrained(tmp_path / "base")
    base = LlamaForCausalLM.from_pretrained(tmp_path / "base")
    base.config._name_or_path = "org/tiny-base"
    model = perturbed(ha.wrap_with_memory(base, "rmt", segment_length=8, num_memory_tokens=2)).eval()
    model.save_pretrained(tmp_path / "adapter")
    cache = hub_cache(tmp_path / "hub", "org/tiny-base", tmp_path / "base")
    hub_cache(tmp_path / "hub", "org/rmt-adapter", tmp_path / "adapter", sha="b" * 40)
    loaded = ha.AutoMemoryModelForCausalLM.from_pretrained("org/rmt-adapter", cache_dir=cache, local_files_only=True)
    ids = random_ids(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=1e-5)


def smollm2_shaped(dtype=None, **kwargs) -> LlamaForCausalLM:
    """A zero-weight model of SmolLM2-135M's exact shape (the real one is dequantised from the GGUF in ~20 s)."""
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    return model


@pytest.mark.parametrize("name", ["smollm2-hmt", "smollm2-baseline"])
def test_the_shipped_adapters_load_in_one_line_on_the_smollm2_backbone(monkeypatch, name):
    built, tokenizer = [], tiny_tokenizer()
    monkeypatch.setitem(
        pretrained.KNOWN_BASES,
        pretrained.SMOLLM2_NAME,
        (lambda dtype, **kw: built.append(dtype) or smollm2_shaped(), "smollm2()[0]"),
    )
    monkeypatch.setitem(pretrained.KNOWN_TOKENIZERS, pretrained.SMOLLM2_NAME, lambda: tokenizer)
    model = ha.AutoMemoryModelForCausalLM.from_pretrained(str(SHIPPED / name))
    assert built == [None] and not model.training
    assert model.tokenizer is tokenizer  # the base's tokenizer comes with the model
    saved = load_file(SHIPPED / name / "memory_adapter.safetensors")
    torch.testing.assert_close(dict(model.memory.state_dict()), saved, atol=0, rtol=0)
    lora = load_file(SHIPPED / name / "adapter_model.safetensors")
    loaded_lora = {n for n, _ in model.backbone.named_parameters() if "lora_" in n}
    assert len(loaded_lora) == len(lora) > 0


def test_the_shipped_adapter_configs_are_complete_for_this_version():
    for folder in sorted(SHIPPED.iterdir()):
        config, meta = adapter_io.read_adapter_config(str(folder), {}, str(folder))
        assert meta["format_version"] == adapter_io.FORMAT_VERSION
        assert meta["base_model_name_or_path"] == pretrained.SMOLLM2_NAME
        assert (meta["base_model_architecture"], meta["embed_dim"], meta["vocab_size"]) == (
            "LlamaForCausalLM",
            576,
            49152,
        )
        # the ones written before the runtime switches were left out of the file load, with the switches off
        recorded = json.loads((folder / "memory_config.json").read_text())
        assert all(recorded[k] is False for k in RUNTIME_SWITCHES if k in recorded)
        assert not any(getattr(config, k) for k in RUNTIME_SWITCHES)


def test_runtime_switches_are_not_saved_and_a_file_that_records_them_loads(tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=8, offload_activations=True)
    model.gradient_checkpointing_enable()
    model.save_pretrained(tmp_path)
    assert not set(RUNTIME_SWITCHES) & set(json.loads((tmp_path / "memory_config.json").read_text()))
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    assert not loaded.is_activation_checkpointing and not loaded.memory_config.offload_activations
    # the format of earlier saves (format 2 with both switches recorded): loads, the recorded switches are ignored
    edit_config(tmp_path, gradient_checkpointing=True, offload_activations=True)
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path))
    assert not loaded.is_activation_checkpointing and not loaded.memory_config.offload_activations
    assert loaded.loading_info["missing_keys"] == []
    # as loading options the switches apply, and change no weight
    loaded = ha.MemoryModel.from_pretrained(
        tiny_backbone("llama"), str(tmp_path), is_trainable=True, gradient_checkpointing=True, offload_activations=True
    )
    assert loaded.is_activation_checkpointing and loaded.memory_config.offload_activations
    ids = random_ids(2, 20)
    with torch.no_grad():
        assert torch.allclose(loaded.eval()(input_ids=ids).logits, model.eval()(input_ids=ids).logits, atol=1e-5)


def test_loading_copies_nothing_when_the_adapter_has_no_peft_part(tmp_path):
    ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8).save_pretrained(tmp_path / "sub")
    base = tiny_backbone("llama")
    assert ha.MemoryModel.from_pretrained(base, str(tmp_path), subfolder="sub").backbone is base
    with pytest.raises(FileNotFoundError, match="has no subfolder 'other'"):
        ha.MemoryModel.from_pretrained(base, str(tmp_path), subfolder="other")


# ---- the tokenizer --------------------------------------------------------------------------------------------------


def tiny_pair(tmp_path: Path) -> tuple[ha.MemoryModel, object]:
    """An RMT model on a tiny Llama saved to (and reloaded from) `tmp_path / "base"`, and the tokenizer of its
    vocabulary; the base folder holds no tokenizer."""
    tokenizer = tiny_tokenizer()
    tiny_llama(len(tokenizer)).save_pretrained(tmp_path / "base")
    base = LlamaForCausalLM.from_pretrained(tmp_path / "base")  # records its folder as _name_or_path
    return perturbed(ha.wrap_with_memory(base, "rmt", segment_length=8, num_memory_tokens=2)).eval(), tokenizer


def test_an_adapter_saved_with_its_tokenizer_gives_it_to_every_loader_and_to_a_pipeline(tmp_path, capfd):
    model, tokenizer = tiny_pair(tmp_path)
    assert model.tokenizer is None
    model.save_pretrained(tmp_path / "adapter", tokenizer=tokenizer)
    assert {"tokenizer_config.json", "tokenizer.json"} <= set(os.listdir(tmp_path / "adapter"))
    text = "Alice moved the apple to the kitchen"
    expected = tokenizer(text).input_ids
    capfd.readouterr()
    assert AutoTokenizer.from_pretrained(tmp_path / "adapter")(text).input_ids == expected  # as for a peft folder
    assert "to instantiate a model of type" not in capfd.readouterr().err  # the guard config.json stays quiet
    on_base = ha.MemoryModel.from_pretrained(tiny_llama(len(tokenizer)), tmp_path / "adapter")
    assert on_base.tokenizer(text).input_ids == expected
    loaded = ha.AutoMemoryModelForCausalLM.from_pretrained(tmp_path / "adapter")
    assert loaded.tokenizer(text).input_ids == expected
    generator = pipeline("text-generation", model=loaded, tokenizer=loaded.tokenizer)
    got = generator(text, max_new_tokens=6, do_sample=False, return_full_text=False)[0]["generated_text"]
    ids = torch.tensor([expected])
    new = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=0)[0, ids.shape[1] :]
    assert got == tokenizer.decode(new)
    loaded.save_pretrained(tmp_path / "again")  # re-saving keeps the tokenizer it was loaded with
    assert AutoTokenizer.from_pretrained(tmp_path / "again")(text).input_ids == expected


def test_the_auto_loader_gives_the_base_models_tokenizer_when_the_adapter_has_none(tmp_path, caplog):
    model, tokenizer = tiny_pair(tmp_path)
    model.save_pretrained(tmp_path / "adapter")
    with caplog.at_level("WARNING", logger="hmt_adapters.auto"):
        assert ha.AutoMemoryModelForCausalLM.from_pretrained(tmp_path / "adapter").tokenizer is None
    assert f"No tokenizer for the base model {str(tmp_path / 'base')!r}" in caplog.text
    tokenizer.save_pretrained(tmp_path / "base")
    loaded = ha.AutoMemoryModelForCausalLM.from_pretrained(tmp_path / "adapter")
    assert loaded.tokenizer("the kitchen").input_ids == tokenizer("the kitchen").input_ids
    assert pretrained.KNOWN_TOKENIZERS[pretrained.SMOLLM2_NAME] is smollm2_tokenizer  # the shipped adapters' base


def test_a_save_with_a_tokenizer_replaces_the_tokenizer_files_of_an_earlier_one(tmp_path):
    model, tokenizer = tiny_pair(tmp_path)
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "vocab.txt").write_text("another tokenizer's vocabulary\n")
    model.save_pretrained(tmp_path / "adapter")  # no tokenizer: files already there are kept
    assert (tmp_path / "adapter" / "vocab.txt").exists()
    model.save_pretrained(tmp_path / "adapter", tokenizer=tokenizer)
    assert not (tmp_path / "adapter" / "vocab.txt").exists()
    with pytest.raises(TypeError, match="`tokenizer` must be a tokenizer with `save_pretrained` .* got str"):
        model.save_pretrained(tmp_path / "adapter", tokenizer="gpt2")


# ---- errors that name the real cause --------------------------------------------------------------------------------


def test_a_weights_file_of_another_method_is_named_as_such(tmp_path):
    ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8, num_memory_tokens=2).save_pretrained(
        tmp_path / "rmt"
    )
    ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **HMT).save_pretrained(tmp_path / "hmt")
    shutil.copy(tmp_path / "hmt" / "memory_adapter.safetensors", tmp_path / "rmt" / "memory_adapter.safetensors")
    with pytest.raises(
        ValueError,
        match=r"holds the weights of a 'hmt' memory adapter, but memory_config.json in "
        r"the same folder is for 'rmt': the folder mixes the files of two adapters",
    ):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path / "rmt")


def test_a_shape_changing_override_or_config_is_blamed_not_the_backbone_width(tmp_path):
    ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8, num_memory_tokens=2).save_pretrained(tmp_path)
    message = r"shape \(2, 32\) but this model needs \(3, 32\): the override\(s\) num_memory_tokens=3 \(saved: 2\)"
    with pytest.raises(ValueError, match=message) as err:
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path, num_memory_tokens=3)
    assert "width" not in str(err.value)
    edit_config(tmp_path, num_memory_tokens=3)
    with pytest.raises(ValueError, match="memory_config.json and memory_adapter.safetensors come from different"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path)


def test_a_stage_2_hmt_adapter_loaded_without_retrieval_names_the_override(tmp_path):
    ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **HMT, use_retrieval=True).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"holds trained weights \[.*'retrieval\..*\] that hmt does not build with "
        r"the override\(s\) use_retrieval=False \(saved: True\): loading would drop",
    ):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path, use_retrieval=False)
    assert ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path).memory_config.use_retrieval


def test_an_offline_base_that_is_not_cached_is_named(tmp_path):
    base = tiny_backbone("llama")
    base.config._name_or_path = "org/base-not-in-the-cache"
    ha.wrap_with_memory(base, "rmt", segment_length=8).save_pretrained(tmp_path / "adapter")
    with pytest.raises(
        OSError,
        match=r"The adapter's base model 'org/base-not-in-the-cache' \(`base_model_name_or_"
        r"path` in its memory_config.json\) could not be loaded from the Hub or",
    ):
        ha.AutoMemoryModelForCausalLM.from_pretrained(
            tmp_path / "adapter", cache_dir=tmp_path / "empty-cache", local_files_only=True
        )


def test_training_a_model_loaded_for_inference_says_to_pass_is_trainable(tmp_path):
    lora_hmt().save_pretrained(tmp_path / "adapter")
    model = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path / "adapter")
    data = Dataset.from_dict({"input_ids": random_ids(4, 24).tolist()})
    args = TrainingArguments(
        str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=2,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=WindowCollator())
    with pytest.raises(RuntimeError, match=r"loaded for inference .* Load it with `is_trainable=True` to train it"):
        trainer.train()
    ids = random_ids(2, 20)
    with torch.no_grad():  # a loss without training still works, in train mode too
        assert torch.isfinite(model(input_ids=ids, labels=ids).loss)
    model.eval()
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)
    trainable = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path / "adapter", is_trainable=True)
    Trainer(model=trainable, args=args, train_dataset=data, data_collator=WindowCollator()).train()
