"""Generation with memory through HF `generate`: consistency with `forward`, the cache, sampling, batches, state."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
import torch
from transformers import pipeline
from transformers.generation.streamers import BaseStreamer
from transformers.utils import logging as hf_logging

import hmt_adapters as ha
from cases import METHOD_CASES, SEGMENT, cases, token_causal, wrap
from hmt_adapters.compat import output_cache
from tiny import MAX_POSITIONS, VOCAB, random_ids, tiny_llama, tiny_tokenizer

GREEDY = dict(do_sample=False, pad_token_id=0)


@contextlib.contextmanager
def transformers_logs_to_caplog() -> Iterator[None]:
    """transformers' log records reach pytest's `caplog` (its logger does not propagate by default)."""
    hf_logging.enable_propagation()
    try:
        yield
    finally:
        hf_logging.disable_propagation()


def no_eos(n: int) -> dict:
    return dict(max_new_tokens=n, min_new_tokens=n, **GREEDY)


@pytest.mark.parametrize("method,family", cases())
def test_greedy_generation_is_the_argmax_of_forward_across_segment_boundaries(method, family):
    model = wrap(method, family, **token_causal(method)).eval()
    for prompt in (2 * SEGMENT - 1, 2 * SEGMENT, 2 * SEGMENT + 1):
        ids = random_ids(2, prompt, seed=prompt)
        out = model.generate(
            input_ids=ids, **no_eos(2 * SEGMENT + 3), output_logits=True, return_dict_in_generate=True
        )
        with torch.no_grad():
            teacher = model(input_ids=out.sequences[:, :-1]).logits[:, prompt - 1 :]
        steps = torch.stack(out.logits, dim=1)
        torch.testing.assert_close(steps, teacher, atol=3e-4, rtol=1e-3)  # cached decode vs whole segments: fp32 noise
        eos = model.generation_config.eos_token_id
        if eos is not None:
            teacher[..., eos] = -torch.inf  # min_new_tokens masks eos
        assert torch.equal(out.sequences[:, prompt:], teacher.argmax(-1))
    uncached = model.generate(input_ids=ids, **no_eos(SEGMENT + 2), use_cache=False)
    assert torch.equal(uncached, out.sequences[:, : uncached.shape[1]])


@pytest.mark.parametrize("method", ["hmt", "rmt", "transformer_xl", "melodi"])
def test_decoding_inside_a_segment_extends_its_cache_instead_of_reading_it_again(method, monkeypatch):
    model = wrap(method, "llama").eval()
    plans = []
    plan = model.memory.plan
    monkeypatch.setattr(
        model.memory, "plan", lambda segments, state: plans.append(len(segments)) or plan(segments, state)
    )

    def plans_for(new_tokens: int) -> int:
        plans.clear()
        model.generate(input_ids=random_ids(1, 2 * SEGMENT), **no_eos(new_tokens))
        return sum(plans)

    assert plans_for(2) == plans_for(SEGMENT)  # tokens decoded inside the open segment never re-plan it


@pytest.mark.parametrize("method", list(METHOD_CASES))
def test_a_decoded_segment_closes_from_what_its_steps_kept_where_the_method_writes_from_that(method, monkeypatch):
    """K/V methods close from their records, HMT, RMT, UniMix and MELODI from their steps' hidden states (MELODI: each
    layer's token outputs) and records with the write slots or summaries run through the cache, ARMT from each
    layer's outputs its steps kept; InfLLM reads the segment again (its writes use read notes)."""
    model = wrap(method, "llama").eval()
    runs = []
    run = model.runtime.run
    monkeypatch.setattr(model.runtime, "run", lambda *args, **kwargs: runs.append(1) or run(*args, **kwargs))

    def runs_for(new_tokens: int) -> int:
        runs.clear()
        model.generate(input_ids=random_ids(1, 2 * SEGMENT), **no_eos(new_tokens))
        return len(runs)

    closing = runs_for(SEGMENT + 2) - runs_for(2)  # the decoded third segment fills up and closes
    kept = model.memory.writes_from_records or model.memory.writes_from_window
    assert closing == (0 if kept else 1)
    assert model.memory.writes_from_records == (
        method in ("transformer_xl", "trams", "memorizing_transformer", "elastic")
    )
    assert kept == (method != "infllm")


@pytest.mark.parametrize("method,reader", [("trams", "read_trams"), ("transformer_xl", "read_all")])
def test_decoding_inside_a_segment_reads_query_free_memory_once(method, reader, monkeypatch):
    import hmt_adapters.methods.unimem.method as unimem

    model = wrap(method, "llama").eval()
    reads = []
    original = getattr(unimem, reader)
    monkeypatch.setattr(unimem, reader, lambda *args: reads.append(1) or original(*args))
    ids = random_ids(1, 2 * SEGMENT)
    model.generate(input_ids=ids, **no_eos(SEGMENT - 1))  # the third segment is decoded token by token, not closed
    assert len(reads) == 3 * len(model.memory.layers)  # each of the three segments once per memory layer


@pytest.mark.parametrize("family", ["llama", "mamba"])
def test_sampling_options_and_seeds_are_honoured(family):
    model = wrap("hmt", family).eval()
    ids = random_ids(1, 11)
    sample = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3, pad_token_id=0)
    torch.manual_seed(3)
    a = model.generate(input_ids=ids, max_new_tokens=12, min_new_tokens=12, **sample)
    torch.manual_seed(3)
    b = model.generate(input_ids=ids, max_new_tokens=12, min_new_tokens=12, use_cache=False, **sample)
    torch.manual_seed(4)
    c = model.generate(input_ids=ids, max_new_tokens=12, min_new_tokens=12, **sample)
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = model.generate(input_ids=ids, **no_eos(12))
    penalised = model.generate(input_ids=ids, repetition_penalty=5.0, **no_eos(12))
    assert not torch.equal(greedy, penalised)
    new = penalised[0, 11:].tolist()
    assert len(set(new)) == len(new)  # a strong repetition penalty never repeats a generated token here


def test_generation_stops_at_eos_and_streams_every_token():
    model = wrap("hmt", "llama").eval()
    ids = random_ids(2, 9)
    free = model.generate(input_ids=ids, **no_eos(10))
    eos = int(free[0, 9 + 3])  # the 4th token row 0 generates
    tokens = []

    class Collect(BaseStreamer):
        def put(self, value):
            tokens.append(value.clone())

        def end(self):
            tokens.append(None)

    out = model.generate(
        input_ids=ids, max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=0, streamer=Collect()
    )
    row0 = out[0, 9:].tolist()
    assert eos in row0 and all(t == 0 for t in row0[row0.index(eos) + 1 :])
    assert tokens[-1] is None and torch.equal(torch.cat([t.view(2, -1) for t in tokens[1:-1]], dim=1), out[:, 9:])


@pytest.mark.parametrize(
    "method,family",
    [("hmt", "llama"), ("rmt", "opt"), ("transformer_xl", "llama"), ("hmt", "mamba"), ("melodi", "llama")],
)
def test_left_padded_batches_generate_what_each_row_generates_alone(method, family):
    model = wrap(method, family).eval()
    long, short = random_ids(1, 2 * SEGMENT + 3, seed=1), random_ids(1, SEGMENT + 3, seed=2)
    pad = long.shape[1] - short.shape[1]
    batch = torch.cat([long, torch.cat([torch.zeros(1, pad, dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0  # whole segments of padding keep row 1's segment boundaries
    out = model.generate(input_ids=batch, attention_mask=mask, **no_eos(2 * SEGMENT))
    alone_long = model.generate(input_ids=long, **no_eos(2 * SEGMENT))
    alone_short = model.generate(input_ids=short, **no_eos(2 * SEGMENT))
    assert torch.equal(out[0], alone_long[0]) and torch.equal(out[1, pad:], alone_short[0])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_prompts_far_beyond_the_backbone_positions_generate(family):
    model = wrap("hmt", family).eval()
    ids = random_ids(1, 20 * MAX_POSITIONS)
    out = model.generate(input_ids=ids, **no_eos(3 * SEGMENT))
    assert out.shape == (1, ids.shape[1] + 3 * SEGMENT) and int(out.max()) < VOCAB


@pytest.mark.parametrize(
    "method", ["hmt", "rmt", "transformer_xl", "trams", "memorizing_transformer", "elastic", "unimix", "melodi"]
)
def test_state_after_generation_equals_the_state_forward_builds(method):
    """Decoded segments close from what their steps kept (`writes_from_window`, `writes_from_records`) into the state
    reading them whole gives; memory parameters moved off their initial values (MELODI's mixers start by passing the
    summaries through, which would hide the tokens' part of its closing)."""
    model = wrap(method, "llama").eval()
    with torch.no_grad():
        for p in model.memory_parameters():
            p.add_(0.1 * torch.randn_like(p))
    ids = random_ids(2, 2 * SEGMENT + 5)
    out = model.generate(input_ids=ids, **no_eos(2 * SEGMENT + 1), return_dict_in_generate=True)
    generated = output_cache(out).memory_state()
    with torch.no_grad():
        _, stepped = model.step(out.sequences[:, :-1])  # the last sampled token is never read
    assert generated.segments_seen == stepped.segments_seen and generated.pending_length == stepped.pending_length
    for name, tensor in stepped.tensors.items():
        torch.testing.assert_close(generated.tensors[name], tensor, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(generated.pending_ids, stepped.pending_ids)


def test_generation_continues_from_a_stored_memory_state(tmp_path):
    model = wrap("hmt", "llama").eval()
    document, question = random_ids(1, 3 * SEGMENT + 2, seed=5), random_ids(1, 4, seed=6)
    with torch.no_grad():
        _, state = model.step(document)
    state.save(tmp_path / "doc.safetensors")
    restored = ha.MemoryState.load(tmp_path / "doc.safetensors")
    continued = model.generate(input_ids=question, memory_state=restored, **no_eos(SEGMENT + 2))
    whole = model.generate(input_ids=torch.cat([document, question], dim=1), **no_eos(SEGMENT + 2))
    assert torch.equal(continued[:, question.shape[1] :], whole[:, document.shape[1] + question.shape[1] :])


def test_paper_query_generation_matches_forward_once_the_query_tokens_exist():
    model = wrap("hmt", "llama", query_source="segment_prefix").eval()
    j = model.memory_config.summary_tokens
    ids = random_ids(1, 2 * SEGMENT)
    out = model.generate(input_ids=ids, **no_eos(SEGMENT), output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        teacher = model(input_ids=out.sequences[:, :-1]).logits[:, 2 * SEGMENT - 1 :]
    steps = torch.stack(out.logits, dim=1)
    # the logit at segment offset t predicts offset t+1; from offset j - 1 on, the exact query is known
    torch.testing.assert_close(steps[:, j:], teacher[:, j:], atol=1e-4, rtol=1e-4)


def test_no_maximum_length_reminder_past_the_backbones_positions(caplog):
    """A memory model reads any length (positions restart every segment): transformers' "exceeded the model's
    predefined maximum length" reminder, which the bare backbone prints past its positions, does not print."""
    model = wrap("hmt", "llama").eval()
    ids = random_ids(1, MAX_POSITIONS + 3)
    with transformers_logs_to_caplog():
        for name, call in (("backbone", model.adapter.model.generate), ("memory", model.generate)):
            logging.Logger.warning_once.cache_clear()  # transformers prints each message once per process
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                call(input_ids=ids[:, : MAX_POSITIONS + 1] if name == "backbone" else ids, **no_eos(2))
            reminded = "exceeded the model's predefined maximum length" in caplog.text
            assert reminded == (name == "backbone"), name


def test_text_generation_pipeline_runs_a_memory_model_without_its_unsupported_model_error(caplog):
    """`pipeline("text-generation", model=memory_model)` (docs/adapters.md) generates what `generate` does on the
    prompt, and without transformers' "is not supported for text-generation" error (hmt_adapters.compat)."""
    tokenizer = tiny_tokenizer()
    model = ha.wrap_with_memory(tiny_llama(len(tokenizer)), "hmt", segment_length=SEGMENT).eval()
    prompt = "The pass key is 12345. Remember it. " * 4
    with transformers_logs_to_caplog(), caplog.at_level(logging.ERROR):
        out = pipeline("text-generation", model=model, tokenizer=tokenizer)(
            prompt, max_new_tokens=6, do_sample=False, return_full_text=False
        )
    assert "not supported" not in caplog.text
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = model.generate(input_ids=ids, **no_eos(6))
    assert ids.shape[1] > SEGMENT  # the prompt spans segments: the pipeline went through the memory
    assert out[0]["generated_text"] == tokenizer.decode(expected[0, ids.shape[1] :])
