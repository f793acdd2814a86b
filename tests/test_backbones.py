"""Backbone adapters: sizes, the embedding width memory lives in, per-layer K/V and query access."""

from __future__ import annotations

import pytest
import torch

from hmt_adapters.attention import AttentionContext
from hmt_adapters.backbones import get_backbone_adapter
from hmt_adapters.runtime import MEMORY_KWARG
import hmt_adapters as ha
from tiny import ATTENTION_FAMILIES, FAMILIES, random_ids, tiny_backbone


@pytest.mark.parametrize("family", FAMILIES)
def test_body_output_is_what_the_lm_head_reads(family):
    base = tiny_backbone(family).eval()
    adapter = get_backbone_adapter(base)
    ids = random_ids(2, 7)
    with torch.no_grad():
        hidden = adapter.body(adapter.embed(ids), torch.ones_like(ids))
        torch.testing.assert_close(adapter.logits(hidden), base(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    assert hidden.shape[-1] == adapter.embed_dim == base.get_input_embeddings().weight.shape[1]


@pytest.mark.parametrize("family", ATTENTION_FAMILIES)
def test_layer_kv_and_query_match_what_the_attention_computes(family):
    base = tiny_backbone(family).eval()
    model = ha.wrap_with_memory(base, "transformer_xl", segment_length=8)  # switches to the recording attention
    adapter = model.adapter
    layer = adapter.num_layers - 1
    inputs = []
    adapter.decoder_layers[layer].register_forward_pre_hook(
        lambda m, a, kw: inputs.append(a[0] if a else kw["hidden_states"]), with_kwargs=True
    )
    context = AttentionContext(record_layers=frozenset([layer]), rotary=adapter.rotary)
    ids = random_ids(2, 6)
    with torch.no_grad():
        adapter.body(adapter.embed(ids), torch.ones_like(ids), **{MEMORY_KWARG: context})
        k, v = adapter.layer_kv(layer, inputs[0])
    torch.testing.assert_close(k, context.records[layer][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(v, context.records[layer][1], atol=1e-5, rtol=1e-4)
    w_q, b_q, _ = adapter.layer_query(layer)
    assert w_q.shape == (adapter.num_heads * adapter.head_dim, inputs[0].shape[-1])
    assert b_q is None or b_q.shape == (adapter.num_heads * adapter.head_dim,)
