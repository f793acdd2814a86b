"""Misuse gets a clear, early error: states of another model, wrong state files, empty batches, wrapping twice,
bidirectional backbones; and labels with no target give nan as in transformers."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForMaskedLM, BertLMHeadModel, T5Config, T5ForConditionalGeneration
from transformers.loss.loss_utils import ForCausalLMLoss

import hmt_adapters as ha
from tiny import random_ids, tiny_backbone

RMT = dict(segment_length=8, num_memory_tokens=2)


# ---- states ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "other, difference",
    [
        (
            lambda: ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=16, num_memory_tokens=2),
            r"segment_length 8 \(state\) vs 16 \(model\)",
        ),
        (
            lambda: ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8, num_memory_tokens=3),
            r"num_memory_tokens 2 \(state\) vs 3 \(model\)",
        ),
        (
            lambda: ha.wrap_with_memory(tiny_backbone("qwen2"), "rmt", **RMT),
            r"base_model_architecture 'LlamaForCausalLM' \(state\) vs 'Qwen2ForCausalLM' \(model\)",
        ),
        (lambda: ha.wrap_with_memory(tiny_backbone("opt"), "rmt", **RMT), r"embed_dim 32 \(state\) vs 16 \(model\)"),
    ],
)
def test_a_state_of_another_config_or_backbone_is_refused_naming_the_difference(other, difference, tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT)
    _, state = model.step(random_ids(1, 5), model.init_memory(1))
    state.save(tmp_path / "state.safetensors")
    for candidate in (state, ha.MemoryState.load(tmp_path / "state.safetensors")):
        with pytest.raises(ValueError, match=f"made by another 'rmt' model: .*{difference}"):
            other().step(random_ids(1, 3), candidate)
    _, again = model.step(random_ids(1, 3), ha.MemoryState.load(tmp_path / "state.safetensors"))
    assert again.segments_seen == 1


def test_a_state_survives_the_runtime_switches(tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT)
    state = model.init_memory(1)
    model.activation_checkpointing_enable()
    out, _ = model.step(random_ids(1, 9), state)
    assert out.logits.shape == (1, 9, 96)


def test_loading_a_file_that_is_not_a_state_says_what_it_is(tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT)
    model.save_pretrained(tmp_path / "adapter")
    with pytest.raises(ValueError, match="is the weights of a 'rmt' memory adapter .*MemoryModel.from_pretrained"):
        ha.MemoryState.load(tmp_path / "adapter" / "memory_adapter.safetensors")
    save_file({"base_model.model.q.lora_A.weight": torch.zeros(2, 2)}, tmp_path / "adapter_model.safetensors")
    with pytest.raises(ValueError, match="is peft LoRA adapter weights, not a memory state"):
        ha.MemoryState.load(tmp_path / "adapter_model.safetensors")
    save_file({"a": torch.zeros(1)}, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match=r"a safetensors file of 1 tensor\(s\) \(a\) without memory-state metadata"):
        ha.MemoryState.load(tmp_path / "other.safetensors")
    (tmp_path / "random.bin").write_bytes(b"\x13\x00garbage")
    with pytest.raises(ValueError, match="is not a safetensors file .*MemoryState.save"):
        ha.MemoryState.load(tmp_path / "random.bin")
    with pytest.raises(FileNotFoundError, match="No memory state file"):
        ha.MemoryState.load(tmp_path / "missing.safetensors")


# ---- inputs ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 8), (2, 0), (0, 0)])
def test_an_empty_batch_is_a_clear_error(shape):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT)
    ids = torch.zeros(shape, dtype=torch.long)
    for call in (
        lambda: model(input_ids=ids),
        lambda: model.step(ids),
        lambda: model.generate(input_ids=ids, max_new_tokens=1),
    ):
        with pytest.raises(
            ValueError,
            match=rf"\[batch, length >= 1\] tensor of token ids with batch >= 1, got \({shape[0]}, "
            rf"{shape[1]}\)",
        ):
            call()


@pytest.mark.parametrize(
    "given, words",
    [
        (dict(inputs_embeds=True), ["['inputs_embeds']", "Pass `input_ids`"]),
        (dict(position_ids=True), ["['position_ids']", "It takes input_ids, attention_mask"]),
        (dict(output_hidden_states=True), ["['output_hidden_states']", "model.hidden_states(input_ids"]),
        (dict(token_type_ids=True, output_attentions=True), ["['output_attentions', 'token_type_ids']"]),
    ],
)
def test_hf_arguments_a_memory_model_does_not_take_are_refused_by_name(given, words):
    """`inputs_embeds`, `position_ids` and the other arguments of an HF causal LM are refused naming them and what
    the model takes instead; None (HF's "not given") and False (no extra output) pass as they are."""
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT).eval()
    ids = random_ids(2, 20)
    values = {name: model.get_input_embeddings()(ids) if name == "inputs_embeds" else ids for name in given}
    for call in (lambda: model(input_ids=ids, **values), lambda: model(**values)):
        with pytest.raises(ValueError) as err:
            call()
        assert all(w in str(err.value) for w in words), str(err.value)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        passed = model(input_ids=ids, inputs_embeds=None, position_ids=None, output_attentions=False).logits
    assert torch.equal(plain, passed)


def test_generate_refuses_inputs_embeds_by_name():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT).eval()
    embeds = model.get_input_embeddings()(random_ids(1, 5))
    with pytest.raises(ValueError, match=r"MemoryModel.generate does not take \['inputs_embeds'\]"):
        model.generate(inputs_embeds=embeds, max_new_tokens=2, pad_token_id=0)


def test_labels_without_any_target_give_nan_as_transformers_does():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT)
    ids = random_ids(2, 12)
    labels = torch.full_like(ids, -100)
    out = model(input_ids=ids, labels=labels)
    reference = ForCausalLMLoss(out.logits, labels, vocab_size=96)
    assert torch.isnan(reference) and torch.isnan(out.loss)
    summed = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(5))
    reference = ForCausalLMLoss(out.logits, labels, vocab_size=96, num_items_in_batch=torch.tensor(5))
    assert summed.loss.item() == reference.item() == 0.0


# ---- what can be wrapped --------------------------------------------------------------------------------------------


def test_wrapping_a_memory_model_again_is_refused_at_wrap_time(tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT)
    with pytest.raises(TypeError, match=r"already a MemoryModel \('rmt'\); wrap its backbone"):
        ha.wrap_with_memory(model, "hmt", segment_length=8)
    with pytest.raises(TypeError, match="already a MemoryModel"):
        ha.MemoryModel(model, ha.RMTConfig(segment_length=8))
    model.save_pretrained(tmp_path)
    with pytest.raises(TypeError, match="already a MemoryModel"):
        ha.MemoryModel.from_pretrained(model, str(tmp_path))


BERT = dict(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)


def test_bidirectional_and_encoder_decoder_models_are_refused_naming_why():
    with pytest.raises(
        ValueError,
        match=r"BertForMaskedLM is not a causal LM: .*leak the future \(bert's causal LM is "
        r"BertLMHeadModel",
    ):
        ha.wrap_with_memory(BertForMaskedLM(BertConfig(**BERT)), "rmt", **RMT)
    with pytest.raises(
        ValueError,
        match="BertLMHeadModel \\(bert\\) runs as a bidirectional encoder because config.is_decoder is False",
    ):
        ha.wrap_with_memory(BertLMHeadModel(BertConfig(**BERT)), "rmt", **RMT)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4))
    with pytest.raises(ValueError, match="T5ForConditionalGeneration is an encoder-decoder model"):
        ha.wrap_with_memory(t5, "rmt", **RMT)


def test_a_bert_decoder_is_causal_and_wraps():
    model = ha.wrap_with_memory(BertLMHeadModel(BertConfig(is_decoder=True, **BERT)), "rmt", **RMT).eval()
    ids = random_ids(1, 12)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 96
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits[:, :-1], model(input_ids=changed).logits[:, :-1])


def unsigned(state: ha.MemoryState) -> ha.MemoryState:
    """`state` without the signature of the model that made it, saved and loaded back (as a hand-edited file)."""
    state.extras.pop("made_for")
    return state


@pytest.mark.parametrize(
    "made_by, other, difference",
    [
        (
            ("rmt", RMT),
            ("rmt", dict(segment_length=8, num_memory_tokens=3)),
            r"'memory' per-stream shape \(2, 32\) \(state\) vs \(3, 32\) \(model\)",
        ),
        (
            ("transformer_xl", dict(segment_length=8, memory_size=16)),
            ("transformer_xl", dict(segment_length=8, memory_size=24)),
            r"'k.1' per-stream shape \(2, 16, 8\) \(state\)",
        ),
        (
            ("hmt", dict(segment_length=8, sensory_length=2, memory_window=4)),
            ("rmt", RMT),
            r"tensor 'cache' only in the state; .*tensor 'memory' only in the model",
        ),
    ],
)
def test_an_unsigned_state_of_another_method_or_config_is_refused_by_its_tensors(made_by, other, difference, tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), made_by[0], **made_by[1])
    _, state = model.step(random_ids(1, 27))
    unsigned(state).save(tmp_path / "state.safetensors")
    loaded = ha.MemoryState.load(tmp_path / "state.safetensors")
    loaded.method = other[0]  # a file edited to name the other model's method
    with pytest.raises(ValueError, match=f"carries no signature .* checked by its tensors.*{difference}"):
        ha.wrap_with_memory(tiny_backbone("llama"), other[0], **other[1]).step(random_ids(1, 9), loaded)


def test_an_unsigned_state_that_fits_continues_as_the_signed_one(tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", **RMT).eval()
    _, state = model.step(random_ids(1, 27))
    unsigned(state.clone()).save(tmp_path / "state.safetensors")
    with torch.no_grad():
        expected, _ = model.step(random_ids(1, 9, seed=3), state)
        got, _ = model.step(random_ids(1, 9, seed=3), ha.MemoryState.load(tmp_path / "state.safetensors"))
    torch.testing.assert_close(got.logits, expected.logits, atol=0, rtol=0)
