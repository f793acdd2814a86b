"""benchmarks/recall_probe.py: the probe reads the attention a memory layer puts on the key."""

from __future__ import annotations

import torch

import hmt_adapters as ha
from hmt_adapters.tasks import RecallTask
from recall_probe import key_positions, probe_unimem
from tiny import VOCAB, tiny_backbone

L = 8


def test_recall_probe_measures_the_attention_full_attention_puts_on_the_key():
    """The benchmark's probe (values replaced by a key indicator) reads exactly the attention weights on the key:
    for XL covering the document they equal the full-attention backbone's own attention probabilities."""

    task, gap = RecallTask(segment_length=L, num_digits=4, vocab_size=VOCAB), 2
    full = tiny_backbone("llama")
    full.set_attn_implementation("eager")
    xl = ha.wrap_with_memory(tiny_backbone("llama"), "transformer_xl", segment_length=L, memory_size=4 * L)
    probed = probe_unimem(xl, task, gap, batch_size=8)
    batch = task.sample(8, gap, torch.Generator().manual_seed(1234))
    with torch.no_grad():
        attentions = full(input_ids=batch["input_ids"], output_attentions=True).attentions  # [B, H, T, T] per layer
    length, keys = batch["input_ids"].shape[1], key_positions(batch, task)
    answer = torch.arange(length - task.num_digits - 1, length - 1)
    for layer, probs in enumerate(attentions):
        on_key = probs[:, :, answer].gather(-1, keys[:, None, None, :].expand(-1, probs.shape[1], len(answer), -1))
        assert probed[layer]["stored"] == 1.0 and probed[layer]["read"] == 1.0
        assert abs(probed[layer]["mass_mean"] - float(on_key.sum(-1).mean())) < 1e-5
