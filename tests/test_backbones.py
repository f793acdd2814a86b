"""Backbone adapters: sizes, the embedding width memory lives in, per-layer K/V and query access, on every family
whose attention takes memory; Transformer-XL exactness on every RoPE family."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.attention import MEMORY_KWARG, AttentionContext
from hmt_adapters.backbones import base as base_module
from hmt_adapters.backbones import family as fam
from hmt_adapters.backbones import get_backbone_adapter
from tiny import FAMILY_NAMES, FAMILY_VOCAB, HYBRID_ATTENTION_LAYERS, REFUSED, family_backbone

ATTENTION = tuple(f for f in FAMILY_NAMES if f not in REFUSED)
# RoPE families whose whole state is attention (an SSM restarts every segment: no full read to compare with)
NOT_ALL_ATTENTION = ("falcon_h1", *HYBRID_ATTENTION_LAYERS)
ROPE_FULL = tuple(f for f in ATTENTION if f not in ("opt", "gpt2", "gpt_bigcode", *NOT_ALL_ATTENTION))


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, FAMILY_VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_body_output_is_what_the_lm_head_reads(family):
    base = family_backbone(family)
    adapter = get_backbone_adapter(base)
    ids = random_ids(2, 7)
    with torch.no_grad():
        hidden = adapter.body(adapter.embed(ids), torch.ones_like(ids))
        torch.testing.assert_close(adapter.logits(hidden), base(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    assert hidden.shape[-1] == adapter.embed_dim == base.get_input_embeddings().weight.shape[1]


@pytest.mark.parametrize("family", ATTENTION)
def test_layer_kv_and_query_match_what_the_attention_computes(family):
    layer = HYBRID_ATTENTION_LAYERS.get(family, [1])[0]  # the last layer (an attention layer in every hybrid here)
    model = ha.wrap_with_memory(family_backbone(family), "transformer_xl", segment_length=8, memory_layers=[layer])
    adapter = model.adapter
    inputs = []
    adapter.decoder_layers[layer].register_forward_pre_hook(
        lambda m, a, kw: inputs.append(a[0] if a else kw["hidden_states"]), with_kwargs=True
    )
    context = AttentionContext(record_layers=frozenset([layer]), rotary=adapter.rotary)
    ids = random_ids(2, 6)
    with torch.no_grad():
        adapter.body(adapter.embed(ids), torch.ones_like(ids), **{MEMORY_KWARG: context})
        k, v = adapter.layer_kv(layer, inputs[0])
    heads, width = adapter.layer_kv_shape(layer)  # the family's, or the layer's own (Gemma 4's full attention)
    assert k.shape == (2, heads, 6, width)
    torch.testing.assert_close(k, context.records[layer][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(v, context.records[layer][1], atol=1e-5, rtol=1e-4)
    w_q, b_q, _ = adapter.layer_query(layer)
    assert w_q.shape == (adapter.num_heads * width, inputs[0].shape[-1])
    assert b_q is None or b_q.shape == (adapter.num_heads * width,)


@pytest.mark.parametrize("family", ROPE_FULL)
def test_xl_with_memory_covering_the_document_equals_the_bare_backbone(family):
    """Partial rotary, QK-norm, GQA, per-layer-type RoPE, MoE, scaled logits: memory keys re-rotated at their true
    distance give exactly full attention (sliding windows widened to the document: this checks positions)."""
    base = family_backbone(family, sliding_window=64)
    ids = random_ids(2, 3 * 8 + 3)
    with torch.no_grad():
        ref = base(input_ids=ids).logits
    model = ha.wrap_with_memory(base, "transformer_xl", segment_length=8, memory_size=64).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref, atol=2e-5, rtol=1e-4)


def gemma2_kernels() -> list[str]:
    """eager always; sdpa where the installed transformers still runs Gemma2 on it (it drops the soft-cap there)."""
    try:
        family_backbone("gemma2").set_attn_implementation("sdpa")
    except ValueError:  # transformers >= 5.24 refuses sdpa for Gemma2
        return ["eager"]
    return ["eager", "sdpa"]


@pytest.mark.parametrize("kernel", gemma2_kernels())
def test_soft_capped_attention_caps_memory_logits_as_the_family_does(kernel):
    """Gemma2 soft-caps attention logits where its kernel does (eager; sdpa ignores the cap): a top-k read covering
    the memory (explicit joint softmax) equals Transformer-XL's prefix through the family's own attention."""
    ids = random_ids(2, 4 * 8 + 5)
    common = dict(segment_length=8, memory_size=20, memory_layers=[0, 1], positions="pos0")
    logits = []
    for method, extra in (("transformer_xl", {}), ("memorizing_transformer", dict(topk=20))):
        base = family_backbone("gemma2", attn_logit_softcapping=2.0)
        base.set_attn_implementation(kernel)
        with torch.no_grad():
            for layer in base.model.layers:  # attention logits of order 10: the cap bites
                layer.self_attn.q_proj.weight.mul_(30.0)
        model = ha.wrap_with_memory(base, method, **common, **extra).eval()
        with torch.no_grad():
            logits.append(model(input_ids=ids).logits)
    torch.testing.assert_close(logits[1], logits[0], atol=2e-5, rtol=1e-4)


def test_sink_logits_join_memory_reads_as_the_family_adds_them():
    """GPT-OSS adds a learned sink logit per head to its softmax (`s_aux`): a top-k read covering the memory (one
    explicit joint softmax, `joint_attention`) equals Transformer-XL's prefix through the family's own kernel, and
    both differ from the same read without the sinks (so the sinks are not dropped on either path)."""
    ids = random_ids(2, 4 * 8 + 5)
    common = dict(segment_length=8, memory_size=20, memory_layers=[0, 1], positions="pos0")
    logits = []
    for method, extra, scale in (
        ("transformer_xl", {}, 1.0),
        ("memorizing_transformer", dict(topk=20), 1.0),
        ("memorizing_transformer", dict(topk=20), 0.0),
    ):
        base = family_backbone("gpt_oss")
        with torch.no_grad():
            for layer in base.model.layers:
                layer.self_attn.sinks.copy_(torch.linspace(-2.0, 3.0, layer.self_attn.sinks.numel()) * scale)
        model = ha.wrap_with_memory(base, method, **common, **extra).eval()
        with torch.no_grad():
            logits.append(model(input_ids=ids).logits)
    torch.testing.assert_close(logits[1], logits[0], atol=2e-5, rtol=1e-4)
    assert (logits[2] - logits[0]).abs().max() > 1e-3


def test_a_kernel_keyword_memory_does_not_apply_is_refused_by_name(monkeypatch):
    """Memory reads honour the keywords of `attention.KERNEL_KWARGS`; a family whose attention hands its kernel any
    other (here Gemma2's soft-cap, as if memory did not apply it) is refused at wrap time, naming it."""
    monkeypatch.setattr(base_module, "KERNEL_KWARGS", base_module.KERNEL_KWARGS - {"softcap"})
    base = family_backbone("gemma2")
    with pytest.raises(NotImplementedError, match=r"hands its kernel \['softcap'\]"):
        ha.wrap_with_memory(base, "transformer_xl", segment_length=8, memory_size=12)
    assert base.config._attn_implementation == family_backbone("gemma2").config._attn_implementation  # as given


class _QuerySpy(AttentionContext):
    """Records each layer's queries, un-rotated with the call's own RoPE."""

    queries: dict

    def attend(self, call):
        self.queries = {**getattr(self, "queries", {}), call.layer: self.pre_rope(call, call.query)}
        return call.run()


QUERY_LAYOUTS = ["llama", "phi3", "gpt_neox", "gpt_bigcode", "gptj", "codegen", "glm", "falcon"]


@pytest.mark.parametrize("family", [f for f in QUERY_LAYOUTS if f not in REFUSED])  # GPT-J/CodeGen: 5.24, Falcon: 5.25
def test_the_query_projection_is_the_one_the_attention_applies(family):
    """TRAMS scores memory with `layer_query`'s `W_q` and pre-attention norm: on families whose queries are a plain
    projection, `W_q norm(h) + b_q` is the query the attention receives (fused `qkv_proj` rows as [q; k; v] in Phi-3,
    per model-parallel block as [q; v; k] in CodeGen; per head in GPT-NeoX; per key/value group in Falcon)."""
    model = ha.wrap_with_memory(family_backbone(family), "transformer_xl", segment_length=8, memory_layers=[1])
    adapter = model.adapter
    inputs = []
    adapter.decoder_layers[1].register_forward_pre_hook(
        lambda m, a, kw: inputs.append(a[0] if a else kw["hidden_states"]), with_kwargs=True
    )
    context = _QuerySpy(rotary=adapter.rotary)
    ids = random_ids(2, 6)
    with torch.no_grad():
        adapter.body(adapter.embed(ids), torch.ones_like(ids), **{MEMORY_KWARG: context})
        w_q, b_q, _ = adapter.layer_query(1)
        normed = fam.attention_norm(adapter.decoder_layers[1])(inputs[0])
        query = normed @ w_q.T + (0 if b_q is None else b_q)
    B, T = ids.shape
    expected = query.view(B, T, adapter.num_heads, adapter.head_dim).transpose(1, 2)
    torch.testing.assert_close(context.queries[1], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_next"])
def test_a_gated_query_projection_gives_the_query_rows_of_each_head(family):
    """Qwen3.5 and Qwen3-Next project each head's query and its output gate together (`q_proj` rows per head as
    [q_h ; gate_h], then QK-norm): `layer_query`'s `W_q` is the query half, as the attention splits it."""
    model = ha.wrap_with_memory(family_backbone(family), "trams", segment_length=8, memory_size=16, memory_layers=[1])
    adapter = model.adapter
    attn = adapter.attention_module(1)
    h = torch.randn(2, 6, adapter.config.hidden_size)
    with torch.no_grad():
        w_q, b_q, _ = adapter.layer_query(1)
        theirs = attn.q_proj(h).view(2, 6, adapter.num_heads, 2 * adapter.head_dim)[..., : adapter.head_dim]
        ours = (h @ w_q.T + (0 if b_q is None else b_q)).view(2, 6, adapter.num_heads, adapter.head_dim)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


class _Attention(torch.nn.Module):
    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        self.got = kwargs.get(MEMORY_KWARG)
        return x


class _Layer(torch.nn.Module):
    """Passes no keyword on to its attention (StableLM's layers; Falcon's from transformers 5.25)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn, self.gradient_checkpointing = _Attention(), False

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.attn(x)


class _Body(torch.nn.Module):
    """Passes no keyword on to its layers (Falcon's body from transformers 5.25)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(), _Layer()])

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_the_memory_keyword_reaches_attention_past_a_body_and_layers_that_drop_keywords():
    body = _Body()
    for layer in body.layers:  # as `_memory_kwarg_refusal` bridges them: layer to attention, then body to layer
        fam.bridge_memory_kwarg(layer, layer.attn, MEMORY_KWARG)
        fam.pass_memory_kwarg(body, layer, MEMORY_KWARG)
    x = torch.ones(1, 2)
    body(x, **{MEMORY_KWARG: "memory"})
    assert [layer.attn.got for layer in body.layers] == ["memory", "memory"]
    body(x)  # a call without memory is handed none: nothing is kept from the call before
    assert [layer.attn.got for layer in body.layers] == [None, None]
    body.train()
    body.layers[1].gradient_checkpointing = True  # transformers' per-layer recomputation would read a later memory
    with pytest.raises(RuntimeError, match=r"_Layer is checkpointed by transformers.*a later segment's memory"):
        body(x, **{MEMORY_KWARG: "memory"})
    body(x)  # nothing to hand over: nothing to refuse
    with torch.no_grad():  # no recomputation without gradients
        body(x, **{MEMORY_KWARG: "memory"})
    assert [layer.attn.got for layer in body.layers] == ["memory", "memory"]
