"""The patched attention: exactness against full attention, that memory really reaches it, locality, bounds."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.attention import AttentionContext
from tiny import VOCAB, random_ids, tiny_backbone

ROPE = ("llama", "qwen2", "mistral")


@pytest.mark.parametrize("family", ROPE)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_xl_with_memory_covering_the_document_equals_full_attention(family, impl):
    base = tiny_backbone(family)
    base.set_attn_implementation(impl)
    ids = random_ids(2, 5 * 8 + 3)
    with torch.no_grad():
        ref = base(input_ids=ids).logits
    model = ha.wrap_with_memory(base, "transformer_xl", segment_length=8, memory_size=64).eval()
    assert base.config._attn_implementation == f"hmt_memory_{impl}"
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
def test_memory_reaches_every_memory_layer_of_every_segment(family, monkeypatch):
    contexts = []
    original = AttentionContext.attend

    def spy(self, call):
        contexts.append(self)
        return original(self, call)

    monkeypatch.setattr(AttentionContext, "attend", spy)
    model = ha.wrap_with_memory(tiny_backbone(family), "transformer_xl", segment_length=8, memory_size=8).eval()
    ids = random_ids(1, 4 * 8)
    with torch.no_grad():
        with_memory = model(input_ids=ids).logits
        with model.disable_memory():
            without = model(input_ids=ids).logits
    layers = model.adapter.num_layers
    assert len(contexts) == 4 * layers and len({id(c) for c in contexts}) == 4
    assert (with_memory[:, 8:] - without[:, 8:]).abs().max() > 1e-5
    torch.testing.assert_close(with_memory[:, :8], without[:, :8])  # segment 0 has no memory yet


def test_layers_below_the_first_memory_layer_see_exactly_the_vanilla_inputs():
    model = ha.wrap_with_memory(
        tiny_backbone("llama"), "transformer_xl", segment_length=8, memory_size=8, memory_layers=[1]
    )
    inputs = []
    model.adapter.body_module.layers[1].register_forward_pre_hook(
        lambda m, a, kw: inputs.append(a[0] if a else kw["hidden_states"]), with_kwargs=True
    )
    ids = random_ids(1, 16)
    with torch.no_grad():
        model(input_ids=ids)
        with model.disable_memory():
            model(input_ids=ids)
    torch.testing.assert_close(
        inputs[1], inputs[3], atol=0, rtol=0
    )  # segment 1, layer 1 input: memory only acts inside


def test_kv_memory_stays_at_memory_size_over_a_thousand_segments():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "transformer_xl", segment_length=8, memory_size=20).eval()
    state = model.init_memory(1)
    shapes = set()
    with torch.no_grad():
        for chunk in range(100):
            _, state = model.step(random_ids(1, 80, seed=chunk), state)
            shapes.add(tuple((k, tuple(v.shape)) for k, v in sorted(state.tensors.items())))
    assert state.segments_seen == 1000 and len(shapes) == 1
    assert int(state.tensors["valid"].sum()) == 20 and int(state.tensors["seen"]) == 8000
    assert state.tensors["pos"][0].tolist() == list(range(7980, 8000))


def test_stored_keys_are_the_pre_rope_keys_of_the_last_tokens():
    base = tiny_backbone("llama")
    model = ha.wrap_with_memory(base, "transformer_xl", segment_length=8, memory_size=8, memory_layers=[0]).eval()
    ids = random_ids(1, 16)
    with torch.no_grad():
        _, state = model.step(ids)
        attn = base.model.layers[0].self_attn
        hidden = base.model.layers[0].input_layernorm(base.model.embed_tokens(ids[:, 8:]))
        k = attn.k_proj(hidden).view(1, 8, -1, attn.head_dim).transpose(1, 2)
    torch.testing.assert_close(state.tensors["k.0"], k, atol=1e-6, rtol=1e-5)


def test_memory_layers_out_of_range_and_recurrent_backbones_are_errors():
    with pytest.raises(ValueError, match=r"`memory_layers` must lie in \[0, 1\] for this 2-layer backbone, got \[5\]"):
        ha.wrap_with_memory(tiny_backbone("llama"), "transformer_xl", segment_length=8, memory_layers=[0, 5])
    with pytest.raises(ValueError, match=r"`memory_layers` entries must be in \[0, inf\], got \[-1\]"):
        ha.UniMemConfig(memory_layers=(-1,))
    with pytest.raises(NotImplementedError, match="'transformer_xl' injects memory into attention layers.*'mamba'"):
        ha.wrap_with_memory(tiny_backbone("mamba"), "transformer_xl", segment_length=8)


def test_wrapping_leaves_the_users_attention_choice_in_charge_without_memory():
    base = tiny_backbone("llama")
    ids = random_ids(2, 12)
    with torch.no_grad():
        ref = base(input_ids=ids).logits
        ha.wrap_with_memory(base, "transformer_xl", segment_length=8)
        torch.testing.assert_close(base(input_ids=ids).logits, ref, atol=0, rtol=0)
    assert ids.max() < VOCAB
