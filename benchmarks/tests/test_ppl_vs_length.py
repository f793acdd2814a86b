"""benchmarks/ppl_vs_length.py: `--memory-disabled` reads an adapter's own backbone on each segment alone, so what
its memory adds is measured against the same fine-tuned weights; `--split train` reads a document trained on."""

from __future__ import annotations

import torch

import hmt_adapters as ha
from hmt_adapters.training import token_nll
from ppl_vs_length import corpus_passages, memory_disabled_nll
from tiny import tiny_backbone, tiny_tokenizer


def test_memory_disabled_is_the_adapters_backbone_on_each_segment_alone():
    ids = torch.randint(0, 96, (70,))
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=16, sensory_length=4).eval()
    alone = ha.wrap_with_memory(model.base_model, "rmt", segment_length=16, num_memory_tokens=0).eval()
    with_memory = token_nll(model, ids)
    disabled = memory_disabled_nll(model, ids)
    torch.testing.assert_close(disabled, token_nll(alone, ids))
    assert (disabled - with_memory).abs().max() > 1e-3  # with memory on, the segments read each other
    torch.testing.assert_close(token_nll(model, ids), with_memory)  # and it is on again afterwards


def test_split_train_reads_a_training_novel_and_test_the_held_out_one():
    """`--split train` reads the longest document the adapters were trained on, `test` (the default) the held-out
    one: different books, each the passage asked for."""
    tokenizer = tiny_tokenizer()
    ((held_title, held_start, held),) = corpus_passages("austen", tokenizer, 64, 1, [0])
    ((seen_title, seen_start, seen),) = corpus_passages("austen", tokenizer, 64, 1, [1], split="train")
    assert held_title == "Persuasion" and held_start == 0 and held.numel() == 64
    assert seen_title != held_title and seen_start == 64 and seen.numel() == 64
