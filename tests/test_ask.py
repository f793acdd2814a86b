"""`ask`: questions about one long document in one call, equal to generating from the whole prompt."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.backbones.pretrained import smollm2_tokenizer
from tiny import tiny_backbone

CONTEXT = " ".join(f"Line {i}: the tide came in at {i % 7} o'clock and the gulls were counted." for i in range(40))
QUESTIONS = ["When did the tide come in on line 3?", "How many gulls were there?"]


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    base = tiny_backbone("llama", vocab_size=len(tokenizer), max_position_embeddings=256).eval()
    return ha.wrap_with_memory(
        base, "infllm", segment_length=16, window=64, sink_tokens=8, block_size=8, topk_blocks=2, representative_keys=2
    ).eval()


def test_answers_equal_generate_on_context_then_question(model, tokenizer):
    answers = ha.ask(model, CONTEXT, QUESTIONS, tokenizer, max_new_tokens=6)
    context = tokenizer(CONTEXT)["input_ids"]
    assert len(context) > 300  # many segments, sinks and blocks in memory
    for text, answer in zip(QUESTIONS, answers):
        ids = torch.tensor([context + tokenizer("\n" + text, add_special_tokens=False)["input_ids"]])
        whole = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        assert answer == tokenizer.decode(whole[0, ids.shape[1] :], skip_special_tokens=True).strip()
    assert ha.ask(model, CONTEXT, QUESTIONS[1], tokenizer, max_new_tokens=6) == answers[1]  # one str -> one str


def test_tokenizer_comes_from_the_model_and_bad_calls_say_what_is_allowed(model, tokenizer):
    with pytest.raises(ValueError, match="needs a tokenizer"):
        ha.ask(model, CONTEXT, "Why?")
    model.tokenizer = tokenizer
    try:
        assert isinstance(ha.ask(model, CONTEXT, "Why?", max_new_tokens=2), str)
    finally:
        model.tokenizer = None
    with pytest.raises(ValueError, match="non-empty str"):
        ha.ask(model, CONTEXT, [], tokenizer)
    with pytest.raises(ValueError, match="num_return_sequences"):
        ha.ask(model, CONTEXT, "Why?", tokenizer, num_return_sequences=2)
    with pytest.raises(TypeError, match="must be a MemoryModel"):
        ha.ask(model.base_model, CONTEXT, "Why?", tokenizer)
