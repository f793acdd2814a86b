"""MELODI: the invariants that tiny random models can check (fp32, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.attention import MEMORY_KWARG, AttentionCall
from hmt_adapters.method import Segment
from hmt_adapters.methods.melodi.mixers import average_pool, mix, pass_summaries
from tiny import random_ids, tiny_backbone

W, S, L, Q = 8, 4, 2, 3


def melodi(family: str = "llama", layers: int = 2, seed: int = 0, **overrides) -> ha.MemoryModel:
    kwargs = dict(segment_length=W, summary_length=S, long_term_length=L, long_term_windows=Q, **overrides)
    return ha.wrap_with_memory(tiny_backbone(family, seed, num_hidden_layers=layers), "melodi", **kwargs)


def perturb(model: ha.MemoryModel, *names: str) -> None:
    """Add noise to the memory parameters whose names start with one of `names` (all when none are given)."""
    with torch.no_grad():
        for name, p in model.memory.named_parameters():
            if not names or name.startswith(names):
                p.add_(torch.randn_like(p))


def closed_state(model: ha.MemoryModel, ids: torch.Tensor, mask: torch.Tensor | None = None) -> dict:
    """The state after every window of `ids`, the ragged last one included (what `forward` folds in)."""
    mask = torch.ones_like(ids) if mask is None else mask
    return model.runtime.run(ids, mask, None, model.init_memory(ids.shape[0]), keep_logits=False).state.tensors


@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
def test_first_window_equals_the_backbone_for_any_memory_weights(family):
    model = melodi(family).eval()
    perturb(model)
    ids = random_ids(2, W)
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids=ids).logits, model.base_model(input_ids=ids).logits, atol=1e-5, rtol=1e-4
        )


def test_context_tokens_never_see_their_windows_summary_tokens():
    model = melodi().eval()
    ids = random_ids(1, 3 * W)
    with torch.no_grad():
        before = model(input_ids=ids).logits
        perturb(model, "summary_embeddings", "mixer_up")  # change only what summary slots carry up the layers
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after[:, :W], before[:, :W], atol=0, rtol=0)
    assert (after[:, W:] - before[:, W:]).abs().max() > 1e-4  # ... which later windows do read


def test_wrapping_leaves_the_backbone_alone_outside_memory_calls():
    base = tiny_backbone("llama")
    ids = random_ids(2, 2 * W + 3)
    with torch.no_grad():
        ref = base(input_ids=ids).logits
        model = melodi()
        model.base_model.load_state_dict(base.state_dict())
        perturb(model)
        torch.testing.assert_close(model.base_model(input_ids=ids).logits, ref, atol=1e-5, rtol=1e-4)
        with model.disable_memory():
            out = model(input_ids=ids).logits
    for s in range(0, ids.shape[1], W):
        with torch.no_grad():
            torch.testing.assert_close(
                out[:, s : s + W], base(input_ids=ids[:, s : s + W]).logits, atol=1e-5, rtol=1e-4
            )


def test_a_copy_and_a_second_wrapper_of_the_same_backbone_run_their_own_mixers():
    model = melodi().eval()
    perturb(model)
    ids = random_ids(1, 3 * W)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        torch.testing.assert_close(copy.deepcopy(model)(input_ids=ids).logits, ref, atol=0, rtol=0)
        other = ha.wrap_with_memory(model.base_model, "melodi", segment_length=W, summary_length=S, long_term_length=L)
        perturb(other)
        assert (other(input_ids=ids).logits - ref).abs().max() > 1e-4
        torch.testing.assert_close(model(input_ids=ids).logits, ref, atol=0, rtol=0)


def test_mixers_act_only_on_whole_windows_of_this_methods_calls():
    model = melodi().eval()
    perturb(model)
    ids = random_ids(2, W)
    segment = Segment(ids, torch.ones_like(ids), 0, model.adapter.embed(ids))
    layout = model.memory.prepare(segment, model.init_memory(2).tensors, None)
    with torch.no_grad():  # the tokens without their summary slots (as an open window is decoded)
        hidden = model.adapter.body(segment.embeds, segment.mask, **{MEMORY_KWARG: layout.attention})
        plain = model.adapter.body(segment.embeds, segment.mask)
    torch.testing.assert_close(hidden, plain, atol=0, rtol=0)
    assert not layout.attention.short_term and layout.attention.long_term is None


def test_both_memories_reach_attention_in_every_later_window(monkeypatch):
    prefixes = []
    original = AttentionCall.run_with_prefix

    def spy(self, mem_k, mem_v, mem_visible=None):
        prefixes.append((self.layer, mem_k.shape[2]))
        return original(self, mem_k, mem_v, mem_visible)

    monkeypatch.setattr(AttentionCall, "run_with_prefix", spy)
    model = melodi(layers=4).eval()
    perturb(model)
    ids = random_ids(1, 3 * W)
    with torch.no_grad():
        _, state = model.step(ids[:, : 2 * W])
        assert prefixes == [(layer, S) for layer in range(4)]  # window 1 has no prefix; window 2 one per layer
        base = model.step(ids[:, 2 * W :], state)[0].logits
        no_short = dict(state.tensors, **{f"z.{i}": torch.zeros_like(state.tensors[f"z.{i}"]) for i in range(4)})
        no_long = dict(
            state.tensors,
            **{"k.2": torch.zeros_like(state.tensors["k.2"]), "v.2": torch.rand_like(state.tensors["v.2"])},
        )
        for tensors in (no_short, no_long):
            changed = model.step(ids[:, 2 * W :], ha.MemoryState("melodi", tensors, state.segments_seen))[0].logits
            assert (changed - base).abs().max() > 1e-4


def test_default_layers_scale_with_depth_and_the_top_memory_layer_sends_nothing_up():
    model = melodi(layers=4)
    assert model.memory.short_term_layers == (0, 1, 2, 3) and model.memory.long_term_layer == 2
    assert sorted(model.memory.mixer_up) == ["0", "1", "2"]
    assert sorted(model.memory.mixer_memory) == ["0", "1", "2", "3"]
    chosen = melodi(layers=4, short_term_layers=[0, 2], long_term_layer=3)
    assert sorted(chosen.memory.mixer_up) == ["0", "2"] and chosen.memory.long_term_layer == 3


@pytest.mark.parametrize(
    "overrides,short,up,long",
    [(dict(), 4, 3, True), (dict(use_long_term=False), 4, 3, False), (dict(use_short_term=False), 0, 0, True)],
)
def test_added_parameter_count_matches_the_formula(overrides, short, up, long):
    model = melodi(family="opt", layers=4, **overrides)
    d, heads = model.adapter.embed_dim, model.adapter.num_heads
    assert d == 16  # OPT: U0 lives in word_embed_proj_dim, the mixers act on hidden states of any width
    expected = S * d + (W + S) * S * (short + up) + ((W + S) * L + heads if long else 0)
    assert sum(p.numel() for p in model.memory_parameters()) == expected


def test_gradients_reach_the_mixers_the_gate_and_the_summary_embeddings():
    model = melodi(layers=4)
    ids = random_ids(2, 4 * W)
    model(input_ids=ids, labels=ids).loss.backward()
    names = [n for n, _ in model.memory.named_parameters()]
    assert {"gate", "mixer_long_term", "summary_embeddings", "mixer_up.0", "mixer_memory.3"} <= set(names)
    for name, p in model.memory.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        if name.startswith("mixer"):
            assert p.grad[:, :W].abs().sum() > 0  # the context columns learn too, not only the identity block


def test_bptt_depth_is_the_stop_gradient_between_windows():
    ids = torch.cat([torch.arange(W), 40 + random_ids(1, 3 * W, vocab=50)[0]])[None]  # ids < 8 only in window 1
    labels = torch.full_like(ids, -100)
    labels[:, -W:] = ids[:, -W:]
    grads = {}
    for depth in (None, 1):
        model = ha.wrap_with_memory(
            tiny_backbone("llama"),
            "melodi",
            segment_length=W,
            summary_length=S,
            long_term_length=L,
            bptt_depth=depth,
            freeze_backbone=False,
        )
        model(input_ids=ids, labels=labels).loss.backward()
        grads[depth] = model.adapter.model.get_input_embeddings().weight.grad[:W].abs().sum()
    assert grads[None] > 0 and grads[1] == 0


def test_long_term_store_is_a_bounded_fifo_of_whole_windows():
    model = melodi().eval()
    state, shapes = model.init_memory(1), set()
    with torch.no_grad():
        for window in range(1, 41):
            old = state.tensors
            _, state = model.step(random_ids(1, W, seed=window), state)
            new = state.tensors
            shapes.add(tuple((k, tuple(v.shape)) for k, v in sorted(new.items())))
            assert int(new["valid"].sum()) == L * min(window, Q)
            torch.testing.assert_close(new["k.1"][:, :, :-L], old["k.1"][:, :, L:])  # oldest window out, rest kept
    assert len(shapes) == 1 and new["k.1"].shape[2] == L * Q
    assert new["z.0"].shape == new["z.1"].shape == (1, S, model.adapter.config.hidden_size)


def test_short_term_only_has_no_store_and_long_term_only_leaves_lower_layers_vanilla():
    short = melodi(layers=4, use_long_term=False)
    state = short.init_memory(1).tensors
    assert "valid" not in state and not hasattr(short.memory, "gate") and len(short.memory.mixer_memory) == 4
    long = melodi(layers=4, use_short_term=False).eval()
    perturb(long)
    assert sorted(long.init_memory(1).tensors) == ["k.2", "pos", "seen", "v.2", "valid"]
    inputs = []
    for layer in (2, 3):
        long.adapter.decoder_layers[layer].register_forward_pre_hook(
            lambda m, a, kw: inputs.append(a[0] if a else kw["hidden_states"]), with_kwargs=True
        )
    ids = random_ids(1, 2 * W)
    with torch.no_grad():
        long(input_ids=ids)
        with long.disable_memory():
            long(input_ids=ids)
    # window 2: layer 2 (long-term) gets vanilla token inputs, layer 3 gets what the long-term read changed
    torch.testing.assert_close(inputs[2][:, :W], inputs[6], atol=1e-6, rtol=1e-5)  # other lengths, other blocking
    assert (inputs[3][:, :W] - inputs[7]).abs().max() > 1e-5


def test_a_closed_gate_is_the_short_term_only_model():
    ids = random_ids(2, 4 * W)
    full = melodi().eval()
    perturb(full)
    with torch.no_grad():
        full.memory.gate.fill_(-60.0)  # alpha = sigmoid(-60) ~ 1e-26
    short = melodi(use_long_term=False).eval()
    short.memory.load_state_dict({k: v for k, v in full.memory.state_dict().items() if k in short.memory.state_dict()})
    with torch.no_grad():
        torch.testing.assert_close(full(input_ids=ids).logits, short(input_ids=ids).logits, atol=1e-5, rtol=1e-4)


def test_ragged_and_padded_windows_use_zero_weight_columns():
    weight = torch.randn(3, W + S)
    hidden = torch.randn(2, 5 + S, 6)
    padded = torch.cat([hidden[:, :5], torch.randn(2, W - 5, 6), hidden[:, 5:]], dim=1)
    mask = torch.ones(2, W)
    mask[:, 5:] = 0
    torch.testing.assert_close(mix(weight, hidden, torch.ones(2, 5)), mix(weight, padded, mask))
    model = melodi().eval()
    perturb(model)
    ids = random_ids(2, 2 * W + 3)
    pad_mask = torch.ones_like(ids)
    pad_mask[1, 2 * W + 1 :] = 0  # row 1 ends two tokens earlier: right padding in the ragged last window
    with torch.no_grad():
        batch = closed_state(model, ids, pad_mask)
        alone = closed_state(model, ids[1:, : 2 * W + 1])
    for name, value in alone.items():
        torch.testing.assert_close(batch[name][1:], value, atol=1e-5, rtol=1e-4)


def test_mixer_inits_pass_summaries_through_and_pool_the_window():
    assert torch.equal(pass_summaries(S, W)[:, W:], torch.eye(S)) and pass_summaries(S, W)[:, :W].abs().sum() == 0
    pool = average_pool(L, W, S)
    torch.testing.assert_close(pool.sum(1), torch.ones(L))
    assert pool[:, W:].abs().sum() == 0 and pool[0, : W // 2].eq(2 / W).all() and pool[1, W // 2 : W].eq(2 / W).all()
    assert (average_pool(5, 3, 1)[:, :3] > 0).sum(1).tolist() == [1] * 5  # more outputs than slots: none empty


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    ids = random_ids(2, 3 * W + 2)
    results = []
    for checkpointing in (False, True):
        model = melodi(gradient_checkpointing=checkpointing)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.memory.named_parameters()}))
    torch.testing.assert_close(results[1][0], results[0][0])
    for name, grad in results[1][1].items():
        torch.testing.assert_close(grad, results[0][1][name], atol=1e-6, rtol=1e-5)


def test_bad_layers_and_settings_are_clear_errors():
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\] for this 2-layer backbone, got \[2, 5\]"):
        melodi(short_term_layers=[0, 5], long_term_layer=2)
    with pytest.raises(ValueError, match="At least one of `use_short_term` and `use_long_term`"):
        ha.MelodiConfig(use_short_term=False, use_long_term=False)
    with pytest.raises(ValueError, match=r"`gate_init` must lie strictly between 0 and 1.*got 1.0"):
        ha.MelodiConfig(gate_init=1.0)
    with pytest.raises(NotImplementedError, match="'melodi' injects memory into attention layers.*'rwkv'"):
        ha.wrap_with_memory(tiny_backbone("rwkv"), "melodi", segment_length=W)
    config = ha.MelodiConfig(segment_length=512)
    assert config.summary_tokens == 128 and config.long_term_tokens == 64
