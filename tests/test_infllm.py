"""InfLLM block retrieval (`"infllm"`, docs/infllm.md): the bare backbone inside sinks + window, block scoring and
representative keys on constructed cases, the fixed global distance, the store (round trip, bf16), config errors;
and the evaluation pieces it brought (standard passkey, noise-haystack needle, JSONL records, Wilson intervals)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.attention import AttentionCall, AttentionContext, apply_rope
from hmt_adapters.backbones.pretrained import smollm2_tokenizer
from hmt_adapters.compat import output_cache
from hmt_adapters.evaluation import TASKS
from hmt_adapters.evaluation.records import append_record, cell_table, load_records, record_key, wilson_interval
from hmt_adapters.evaluation.runner import Reader, retrieval_recall
from hmt_adapters.evaluation.shared_prefix import Checkpoints, SharedPrefixes
from hmt_adapters.memory import attend
from hmt_adapters.methods.infllm import block_pages
from hmt_adapters.methods.infllm import method as infllm_module
from hmt_adapters.methods.infllm.config import PAPER
from hmt_adapters.methods.infllm.method import InfLLM
from tiny import (
    FAMILY_NAMES,
    FAMILY_VOCAB,
    REFUSED,
    STATE_OUTSIDE_ATTENTION,
    family_backbone,
    layer_overrides,
    random_ids,
    tiny_backbone,
)

# InfLLM's own reading (the defaults until 2026-12-03, `keep_question_blocks` on as they had it), small: the tests of
# its mechanisms; the default reader's own are below (`test_the_default_reader_*`)
SMALL = {
    **PAPER,
    "keep_question_blocks": True,
    "segment_length": 16,
    "window": 64,
    "sink_tokens": 8,
    "block_size": 8,
    "topk_blocks": 2,
    "representative_keys": 2,
}


# the default reader's fields where InfLLM's differ (over `SMALL`: the defaults at its sizes)
DEFAULT_READER = {name: getattr(ha.InfLLMConfig(), name) for name in PAPER}


def backbone():
    return tiny_backbone("llama", max_position_embeddings=256).eval()


def wrap(base, **fields) -> ha.MemoryModel:
    return ha.wrap_with_memory(base, "infllm", **{**SMALL, **fields}).eval()


@pytest.mark.parametrize("length", [1, 16, 37, 72])
def test_document_within_sinks_and_window_is_the_bare_backbone(length):
    base = backbone()
    model = wrap(base)
    ids = random_ids(2, length, seed=length)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, base(ids).logits, atol=1e-5, rtol=1e-5)


def test_generation_within_the_window_is_the_bare_backbone():
    base = backbone()
    ids = random_ids(1, 40, seed=3)
    bare = base.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(wrap(base).generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0), bare)


def test_no_trainable_parameters_and_a_document_past_the_window_streams():
    model = wrap(backbone())
    assert list(model.memory_parameters()) == []
    ids = random_ids(1, 300, seed=1)
    with torch.no_grad():
        out = model(input_ids=ids).logits
    assert out.shape == (1, 300, 96) and torch.isfinite(out).all()
    _, state = model.step(ids[:, :288])
    blocks = state.tensors["repr.0"].shape[2]
    # every token older than the next chunk's window start (rounded to a block) is a sink or in a block
    assert state.tensors["sink.valid"].shape[1] == 8
    assert 8 + blocks * 8 <= 288 - 64 < 8 + (blocks + 1) * 8
    assert 8 + blocks * 8 + state.tensors["tail.valid"].shape[1] == 288


@pytest.mark.parametrize("positions", ["window", "ordered", "question"])
def test_training_through_the_backbone_gives_the_logits_of_reading_and_gradients_to_it(positions):
    """With gradients the joint softmax is autograd's over the parts' concatenation; without, the parts' logits share
    one buffer normalised in place (`InfLLM._probabilities`): the same logits, past the window (blocks retrieved)."""
    base = backbone()
    model = wrap(base, block_positions=positions)
    ids = random_ids(2, 200, seed=5)
    with torch.no_grad():
        read = model(input_ids=ids).logits
    trained = list(base.model.layers[0].self_attn.q_proj.parameters())
    for weight in trained:  # the wrapped backbone is frozen: train one projection, as a LoRA would
        weight.requires_grad_(True)
    out = model(input_ids=ids, labels=ids)
    torch.testing.assert_close(out.logits, read, atol=2e-5, rtol=1e-5)
    out.loss.backward()
    assert all(w.grad is not None and float(w.grad.abs().sum()) > 0 for w in trained)


def test_block_scoring_picks_the_block_that_matches_the_mean_query():
    model = wrap(backbone())
    method: InfLLM = model.memory
    heads, dim, count = 4, 8, 12
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(1, heads, 5, dim, generator=gen)
    mean = query.mean(2)  # [1, H, D]
    reps = 0.1 * torch.randn(1, heads, count, dim, generator=gen)
    reps[0, :, 7] = mean[0]  # block 7 is the mean query itself: the largest sum over heads of q.r
    reps[0, :, 2] = 0.5 * mean[0]  # block 2 is second
    state = {"repr.0": reps}
    chosen = method.select_blocks(0, state, query, torch.ones(1, 5, dtype=torch.bool))
    assert chosen.shape == (1, 1, 2) and chosen[0, 0].tolist() == [2, 7]  # top-2, in stream order
    # a padding query does not count in the mean: making it huge and opposite changes nothing
    padded = torch.cat([query, -100 * mean[:, :, None]], dim=2)
    valid = torch.tensor([[True] * 5 + [False]])
    assert torch.equal(method.select_blocks(0, state, padded, valid), chosen)
    # per key/value head: head pair 1 (query heads 2, 3) prefers block 4 when only its heads match block 4
    reps[0, 2:, 4] = 10 * mean[0, 2:]
    method.config.select_per = "kv_head"
    per_head = method.select_blocks(0, state, query, torch.ones(1, 5, dtype=torch.bool))
    method.config.select_per = "layer"
    assert per_head.shape == (1, 2, 2) and 4 in per_head[0, 1].tolist() and 7 in per_head[0, 0].tolist()


def test_representative_key_is_the_mean_of_the_most_attended_keys():
    model = wrap(backbone(), representative_keys=2)
    method: InfLLM = model.memory
    state = method.init_state(1, torch.device("cpu"), torch.float32)
    kv, heads, dim = 2, 4, 8
    keys = torch.randn(1, kv, 12, dim)
    score = torch.rand(1, heads, 12)
    score[0, 0, [3, 6]] = 5.0  # query head 0 attended most to tokens 3 and 6
    state["tail.valid"] = torch.ones(1, 12, dtype=torch.bool)
    for i in method.layers:
        state[f"tail.k.{i}"], state[f"tail.v.{i}"], state[f"tail.score.{i}"] = keys, keys.clone(), score
    out = dict(state)
    method._cut_block(out)  # rewrites the copy it is given
    torch.testing.assert_close(out["repr.0"][0, 0, 0], keys[0, 0, [3, 6]].mean(0))  # head 0 reads kv head 0
    best = score[0, 3, :8].topk(2).indices
    torch.testing.assert_close(out["repr.1"][0, 3, 0], keys[0, 1, best].mean(0))  # head 3 reads kv head 1
    assert out["tail.valid"].shape[1] == 4 and torch.equal(out["block.k.0.0"], keys[:, :, :8])


def test_global_keys_are_seen_at_the_window_distance_from_every_query():
    base = backbone()
    model = wrap(base)
    adapter = model.adapter
    context = AttentionContext(rotary=adapter.rotary)
    context.layer = 0
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 8, generator=gen), torch.randn(1, 1, 1, 8, generator=gen)
    by_method = (model.memory._rotate_by(context, q, 64) * k).sum()
    for p in (64, 100, 250):  # any query position p: the key at p - W gives the same logit
        rq, rk = (context.rope_at(torch.tensor([[x]]), q) for x in (p, p - 64))
        rotated = (apply_rope(q, rq[0][:, None], rq[1][:, None]) * apply_rope(k, rk[0][:, None], rk[1][:, None])).sum()
        torch.testing.assert_close(rotated, by_method, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [120, 181])
def test_ordered_blocks_with_every_block_retrieved_are_full_attention(length):
    """`block_positions="ordered"` with every block retrieved: sinks + blocks + tail are the whole prefix, each key at
    its true position, so the model is the bare backbone reading the whole document (generation too). InfLLM's
    shared distance W, on the same blocks, is not."""
    base = tiny_backbone("llama", max_position_embeddings=512).eval()
    ids = random_ids(2, length, seed=length)
    ordered = wrap(base, block_positions="ordered", topk_blocks=32, keep_question_blocks=False)
    with torch.no_grad():
        full = base(ids).logits
        got = ordered(input_ids=ids).logits
        torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
        shared = (wrap(base, topk_blocks=32)(input_ids=ids).logits - full).abs().max()
    assert shared > 1e-4 and shared > 30 * (got - full).abs().max()  # a random model's logits move little
    _, state = ordered.step(ids[:, :length])
    assert state.tensors["repr.0"].shape[2] >= 5  # blocks were cut and read, not a document inside the window
    bare = base.generate(ids[:1], max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ordered.generate(ids[:1], max_new_tokens=6, do_sample=False, pad_token_id=0), bare)


def test_call_rope_follows_each_new_position_tensor():
    """The per-call RoPE cache is keyed by the position tensor itself: keyed by `id()`, a freed tensor's id came
    back for the next decoding step's positions and returned the previous step's angles (a query un-rotated one
    position off, nondeterministically)."""
    base = backbone()
    layer = base.model.layers[0].self_attn
    adapter = wrap(base).adapter
    context = AttentionContext(rotary=adapter.rotary)
    query = torch.zeros(1, 4, 1, 8)
    for step in range(50):  # a fresh tensor per step, as transformers builds one per forward
        positions = torch.tensor([[100 + step]])
        call = AttentionCall(layer, query, query, query, None, None, 0.0, {"position_ids": positions}, "sdpa", None)
        context.layer = 0
        torch.testing.assert_close(context.call_rope(call)[0], context.rope_at(torch.tensor([[100 + step]]), query)[0])
        del positions, call


@pytest.mark.parametrize("cut", [160, 171])
def test_generation_from_a_read_document_is_deterministic_and_equals_one_read(cut):
    """A document read once (`step(return_logits=False)`), then answered from its state several times: the same
    tokens and scores each time, and the same tokens as generating from the whole prompt."""
    model = wrap(backbone())
    ids = random_ids(1, 300, seed=1)
    kwargs = {
        "max_new_tokens": 5,
        "do_sample": False,
        "pad_token_id": 0,
        "eos_token_id": None,
        "output_scores": True,
        "return_dict_in_generate": True,
    }
    whole = model.generate(ids, **kwargs)
    with torch.no_grad():
        out, state = model.step(ids[:, :cut], return_logits=False)
    assert out.logits is None and state.segments_seen == cut // 16
    for _ in range(10):
        again = model.generate(ids[:, cut:], memory_state=state, **kwargs)
        assert torch.equal(again.sequences[:, 300 - cut :], whole.sequences[:, 300:])
        torch.testing.assert_close(torch.stack(again.scores), torch.stack(whole.scores), atol=1e-5, rtol=1e-5)


def test_decoding_rotates_the_stored_tail_once_per_state_and_layer(monkeypatch):
    """Every decoding step from one state reads the same tail: it is rotated once per layer, not once per token,
    and the tokens are those of rotating it every time."""
    model = wrap(backbone())
    ids = random_ids(1, 208, seed=2)
    with torch.no_grad():
        _, state = model.step(ids[:, :192], return_logits=False)
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    rotations = []
    real = AttentionContext.rotate_at

    def counted(context, k, positions, like):  # a rotation of several keys: the tail (the query's is one position)
        rotations.extend([1] if positions is not None and positions.shape[-1] > 1 else [])
        return real(context, k, positions, like)

    monkeypatch.setattr(AttentionContext, "rotate_at", counted)
    cached = model.generate(ids[:, 192:200], memory_state=state, **kwargs)
    assert len(rotations) == len(model.memory.layers)  # the prompt's 8 tokens and 5 decoding steps, one state
    model.memory._tail_cache.clear()
    monkeypatch.setattr(model.memory, "_tail_cache", _Forgetful())
    assert torch.equal(model.generate(ids[:, 192:200], memory_state=state, **kwargs), cached)
    # the first generation rotated once; without the cache every call (the prompt and 5 decoding steps) rotates
    assert len(rotations) == len(model.memory.layers) * (1 + 6)


class _Forgetful(dict):
    """A cache that keeps nothing: every call rotates the tail again (the behaviour before the cache)."""

    def __setitem__(self, key, value):
        pass


@pytest.mark.parametrize("task", ["passkey_standard", "niah_single_noise"])
def test_the_noise_haystack_starts_at_its_first_sentence_for_every_seed(task):
    tokenizer = smollm2_tokenizer()
    deep, shallow = (TASKS[task](tokenizer, 600, seed=s, depth=d) for s, d in ((1, 0.9), (2, 0.2)))
    needle = shallow.inserts[0].position
    assert deep.input_ids[:needle] == shallow.input_ids[:needle]  # one prefix: read once for both (SharedPrefixes)
    assert deep.input_ids[needle : needle + 5] != shallow.input_ids[needle : needle + 5]


def test_matched_blocks_hold_the_best_single_token_for_the_last_queries_and_come_first():
    model = wrap(backbone(), match_blocks=1, match_queries=2)
    with torch.no_grad():
        _, state = model.step(random_ids(1, 300, seed=2))
    method, tensors = model.memory, dict(state.tensors)
    count = tensors["repr.0"].shape[2]
    direction = torch.nn.functional.normalize(torch.randn(8, generator=torch.Generator().manual_seed(0)), dim=0)
    target = count // 2
    keys = tensors[f"block.k.0.{target}"].clone()
    keys[0, :, 5] = 10 * direction  # one token of one block matches the question (both key/value heads)
    tensors[f"block.k.0.{target}"] = keys
    query = torch.zeros(1, 4, 6, 8)
    query[:, :, :4] = -10 * direction  # older queries point away: only the last `match_queries` count
    query[:, :, 4:] = direction
    valid = torch.ones(1, 6, dtype=torch.bool)
    assert method.match_blocks(0, tensors, query, valid).tolist() == [[target]]
    valid[0, 5] = False  # the last real queries: 3 and 4 (3 points away, 4 towards; the sum still points towards)
    query[:, :, 3] = 0.5 * direction
    assert method.match_blocks(0, tensors, query, valid).tolist() == [[target]]
    chosen = method.select_blocks(0, tensors, query, valid, matched=torch.tensor([[target]]))
    plain = method.select_blocks(0, tensors, query, valid)
    assert chosen.shape == (1, 1, 3) and target in chosen[0, 0].tolist()  # topk_blocks 2 + 1 matched, distinct
    assert set(plain[0, 0].tolist()) - {target} <= set(chosen[0, 0].tolist())


def test_token_match_ranks_blocks_by_the_rare_question_words_they_hold():
    model = wrap(backbone(), match_blocks=1, match_queries=4, match_score="tokens")
    ids = random_ids(1, 300, seed=2) % 80  # tokens 80-95 only where placed below
    ids[0, 8:] = torch.where(torch.arange(292) % 8 == 0, 80, ids[0, 8:])  # token 80 in every block: weighs nothing
    ids[0, 100:102] = torch.tensor([91, 92])  # block 11 (tokens 96-103) holds two rare question words
    ids[0, 150] = 93  # block 17 one rare word, plus token 80 (in every block)
    ids[0, -4:] = torch.tensor([80, 91, 92, 93])  # the question
    with torch.no_grad():
        _, state = model.step(ids[:, :288])
    method, tensors = model.memory, dict(state.tensors)
    assert tensors["block.ids.11"][0, 4:6].tolist() == [91, 92] and "tail.ids" in tensors
    real = torch.ones(1, 12, dtype=torch.bool)
    assert method.match_tokens(tensors, ids[:, 288:], real).tolist() == [[11, 12]]  # with the block after it
    model.memory_config.match_blocks = 2
    assert method.match_tokens(tensors, ids[:, 288:], real)[0].tolist() == [11, 12, 17, 18]
    model.memory_config.match_min_ratio = 0.6  # block 17 scores about half of block 11: not read
    assert method.match_tokens(tensors, ids[:, 288:], real)[0].tolist() == [11, 12, -1, -1]
    model.memory_config.match_neighbours, model.memory_config.match_in_view = "both", True
    assert method.match_tokens(tensors, ids[:, 288:], real)[0].tolist() == [10, 11, 12, -1, -1, -1]
    model.memory_config.match_neighbours, model.memory_config.match_in_view = "after", False
    model.memory_config.match_min_ratio = 0.4
    assert method.match_tokens(tensors, ids[:, 288:], real)[0].tolist() == [11, 12, 17, 18]
    model.memory_config.match_min_ratio = None
    real[0, -3:] = False  # padding at the end: the question is the last real tokens (..., 80), not 91-93
    assert 11 not in method.match_tokens(tensors, ids[:, 288:], real)[0].tolist()
    model.memory.trace = {}
    model.memory_config.match_blocks = 1
    with torch.no_grad():
        model.step(ids)  # the question's call reads blocks 11 and 12 in every layer, besides InfLLM's top-2
    for calls in model.memory.trace.values():
        question = next(c for c in calls if c["end"] == 300)
        assert {11, 12} <= set(question["selected"][0]) and len(question["selected"][0]) == 4
    assert wrap(backbone(), match_blocks=1).memory_config.match_score == "attention"  # the default
    with pytest.raises(ValueError, match="match_score.*'attention', 'tokens'"):
        wrap(backbone(), match_blocks=1, match_score="words")
    with pytest.raises(ValueError, match=r"`match_min_ratio` \(0.5\) compares .* got match_score='attention'"):
        wrap(backbone(), match_blocks=2, match_score="attention", match_min_ratio=0.5)
    with pytest.raises(ValueError, match=r"`match_min_ratio` must be in \[0, 1\]"):
        wrap(backbone(), match_blocks=2, match_min_ratio=1.5)
    with pytest.raises(ValueError, match=r"`match_score` \('tokens'\) ranks the `match_blocks`, which is 0"):
        wrap(backbone(), match_score="tokens")


def test_token_match_reads_both_neighbours_of_a_needle_cut_with_words_on_either_side():
    """`match_neighbours="both"`: a needle whose question words stand on both sides of its answer ("The pass key
    is X. Remember it. X is the pass key."), cut at a block boundary, is matched on the half with more of them; the
    default reads the block after it, "both" the one before too (-1 before the first block)."""
    model = wrap(backbone(), match_blocks=1, match_queries=4, match_score="tokens", topk_blocks=0)
    method = model.memory
    ids = random_ids(1, 300, seed=2) % 80
    ids[0, 94] = 93  # block 10 (tokens 88-95): the needle's first half, one question word
    ids[0, 96:98] = torch.tensor([91, 92])  # block 11 (tokens 96-103): its second half, two
    ids[0, -4:] = torch.tensor([80, 91, 92, 93])  # the question
    with torch.no_grad():
        _, state = model.step(ids[:, :288])
    tensors, real = dict(state.tensors), torch.ones(1, 12, dtype=torch.bool)
    assert method.match_tokens(tensors, ids[:, 288:], real).tolist() == [[11, 12]]  # the first half is not read
    model.memory_config.match_neighbours = "both"
    assert method.match_tokens(tensors, ids[:, 288:], real).tolist() == [[10, 11, 12]]
    model.memory.trace = {}
    with torch.no_grad():
        model.step(ids)  # the question's call reads the three blocks in every layer, and no other
    for calls in model.memory.trace.values():
        assert next(c for c in calls if c["end"] == 300)["selected"][0] == [10, 11, 12]
    first = ids.clone()
    first[0, 94], first[0, 96:98] = 0, 0
    first[0, 9:12] = torch.tensor([91, 92, 93])  # every word in block 0: nothing before it
    with torch.no_grad():
        _, state = model.step(first[:, :288])
    assert method.match_tokens(dict(state.tensors), first[:, 288:], real).tolist() == [[-1, 0, 1]]
    model.memory_config.match_in_view = True  # the same blocks, each named once, none in view
    assert method.match_tokens(tensors, ids[:, 288:], real).tolist() == [[10, 11, 12]]
    assert wrap(backbone(), match_blocks=1, match_score="tokens").memory_config.match_neighbours == "after"
    with pytest.raises(
        ValueError, match="`match_neighbours` \\('both'\\).*match_score='tokens' does; got match_score='attention'"
    ):
        wrap(backbone(), match_blocks=1, match_neighbours="both")
    with pytest.raises(ValueError, match="match_neighbours.*'after', 'both'"):
        wrap(backbone(), match_blocks=1, match_score="tokens", match_neighbours="before")


def test_token_match_in_view_reads_no_block_for_words_the_window_holds():
    """`match_in_view`: the question's words ranked over the stored blocks and the text the call reads locally. A
    passage in view that holds them outranks a look-alike in memory, and no block is read for it (on `niah_multikey`
    the asked-for needle in the window lost to a stored distractor sharing its template); text that leaves the
    window when the answer's segment opens does not count. A matched block whose successor is not stored is read
    alone (with `topk_blocks=0`: no block of InfLLM's ranking fills the slot, in view or not). Off, the old
    ranking."""
    model = wrap(backbone(), match_blocks=1, match_queries=4, match_score="tokens", topk_blocks=0, match_in_view=True)
    method = model.memory
    ids = random_ids(1, 300, seed=2) % 80
    ids[0, 100:102] = torch.tensor([91, 92])  # block 11: a look-alike, two of the question's words
    ids[0, -4:] = torch.tensor([80, 91, 92, 93])  # the question

    def read(ids):
        with torch.no_grad():
            _, state = model.step(ids[:, :288])
        tensors = dict(state.tensors)
        local = torch.cat([tensors["tail.ids"], ids[:, 288:]], dim=1)
        matched = method.match_tokens(tensors, local, torch.ones_like(local, dtype=torch.bool))
        model.memory.trace = {}
        with torch.no_grad():
            model.step(ids)
        selected = {tuple(next(c for c in calls if c["end"] == 300)["selected"][0]) for calls in method.trace.values()}
        return tensors, matched.tolist(), selected

    tensors, matched, selected = read(ids)
    assert matched == [[11, 12]] and selected == {(11, 12)}  # the look-alike, nothing better in view
    assert tensors["tail.ids"].shape[1] >= 64  # the window (tokens 224-287) is the tail
    in_view = ids.clone()
    in_view[0, 270:273] = torch.tensor([91, 92, 93])  # all three words in the window
    _, matched, selected = read(in_view)
    assert matched == [[-1, -1]] and selected == {()}
    edge, start = ids.clone(), 288 - tensors["tail.ids"].shape[1]
    edge[0, start + 1 : start + 4] = torch.tensor([91, 92, 93])  # in view now, not once the answer's segment opens
    assert read(edge)[2] == {(11, 12)}
    last = tensors["repr.0"].shape[2] - 1  # the last stored block: its successor is in the tail
    at_end = ids.clone()
    at_end[0, 8 + 8 * last + 2 : 8 + 8 * last + 5] = torch.tensor([91, 92, 93])
    _, matched, selected = read(at_end)
    assert matched == [[last, -1]] and selected == {(last,)}
    model.memory_config.match_in_view = False  # the stored blocks alone: the look-alike, and the last block twice
    assert read(in_view)[1:] == ([[11, 12]], {(11, 12)})
    _, matched, selected = read(at_end)
    assert matched == [[last, last]] and selected == {(last,)}  # once: with topk_blocks=0 no ranked block fills in
    with pytest.raises(ValueError, match="`match_in_view`.*match_score='tokens'.*'attention'"):
        wrap(backbone(), match_blocks=1, match_in_view=True)
    keys, values, valid = method.gather_global(1, tensors, torch.tensor([[[-1, 3]]]), torch.device("cpu"))
    sinks, size = tensors["sink.valid"].shape[1], method.block
    assert not valid[0, 0, sinks : sinks + size].any()
    assert valid[0, 0, sinks + size :].equal(tensors["block.valid.3"][0])
    torch.testing.assert_close(keys[:, :, sinks + size :], tensors["block.k.1.3"])


@pytest.mark.parametrize("keep", [False, True])
def test_a_short_question_after_the_document_is_matched_by_its_words_and_those_before_it(keep):
    """A question asked from the document's state (`generate(memory_state=...)`, `ha.ask`) shorter than
    `match_queries` ranks the blocks afresh with `match_score="tokens"`: by its words and the last ones read before
    it, not by the document's last chunk's; its decoding steps keep them."""
    model = wrap(backbone(), match_blocks=1, match_queries=4, match_score="tokens", keep_question_blocks=keep)
    a, b, c = 91, 92, 93  # rare words (the text is tokens 0-79, and 80 in every block: it weighs nothing)
    ids = random_ids(1, 288, seed=3) % 80
    ids[0, 8:] = torch.where(torch.arange(280) % 8 == 0, 80, ids[0, 8:])
    ids[0, 100:102] = torch.tensor([a, c])  # block 11
    ids[0, 150:152] = torch.tensor([b, c])  # block 17
    ids[0, 195] = a  # block 23
    ids[0, -4:] = torch.tensor([b, 80, c, 80])  # the document ends in words of block 17
    with torch.no_grad():
        _, state = model.step(ids)
    assert state.tensors["match"].tolist() == [[17, 18]]  # the document's last chunk: b and c
    model.memory.trace = {}
    question = torch.tensor([[a, 80]])  # with the words before it (c, 80): a and c, block 11's
    kwargs = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    model.generate(question, attention_mask=torch.ones_like(question), memory_state=state, **kwargs)
    for calls in model.memory.trace.values():
        asked, *decoding = calls
        assert asked["end"] == 290 and [call["end"] for call in decoding] == [291, 292]
        for call in (asked, *decoding):
            assert {11, 12} <= set(call["selected"][0]) and not {17, 18} <= set(call["selected"][0])


@pytest.mark.parametrize("match_score", ["attention", "tokens"])
def test_decoding_steps_keep_the_blocks_the_question_matched(match_score):
    model = wrap(backbone(), match_blocks=2, match_queries=4, keep_question_blocks=False, match_score=match_score)
    model.memory.trace = {}
    ids = random_ids(1, 300, seed=1)  # the open segment at the question: 12 tokens, 3 decoding steps inside it
    model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    question, *decoding = [c for c in model.memory.trace[1] if c["end"] >= 300]
    assert question["end"] == 300 and [c["end"] for c in decoding] == [301, 302, 303]
    # every step reads the blocks the question matched besides its own top-2 (InfLLM's ranking of its one query)
    matched = 2 if match_score == "attention" else 4  # tokens: each matched block with the one after it
    assert all(len(c["selected"][0]) == 2 + matched for c in decoding)
    assert len(set.intersection(*(set(c["selected"][0]) for c in [question, *decoding]))) >= 2
    assert wrap(backbone(), match_blocks=0).memory_config.match_blocks == 0
    with pytest.raises(ValueError, match="match_layer"):
        wrap(backbone(), match_blocks=1, match_layer=1, memory_layers=[0])


@pytest.mark.parametrize("length", [300, 288])  # the question's chunk open (12 tokens) or closed (a full segment)
def test_decoding_steps_keep_the_blocks_the_question_retrieved(length):
    model = wrap(backbone(), keep_question_blocks=True, match_queries=4)
    model.memory.trace = {}
    ids = random_ids(1, length, seed=1)
    model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    for layer, calls in model.memory.trace.items():
        question = next(c for c in calls if c["end"] == length)
        decoding = [c for c in calls if c["end"] > length][: 3 if length == 300 else 2]  # before a segment closes
        assert decoding and len(question["selected"][0]) == 2
        for call in decoding:  # the question's 2 blocks besides the step's own top-2
            assert set(question["selected"][0]) <= set(call["selected"][0]) and len(call["selected"][0]) == 4, layer
    plain = wrap(backbone(), keep_question_blocks=False, match_queries=4)
    plain.memory.trace = {}
    plain.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0, eos_token_id=None)
    with_blocks = [c for c in plain.memory.trace[0] if c["blocks"] >= 2]
    assert with_blocks and all(len(c["selected"][0]) == 2 for c in with_blocks)  # InfLLM's decoding: its own top-k
    assert wrap(backbone()).memory_config.keep_question_blocks  # on by default (docs/infllm.md)


@pytest.mark.parametrize("positions", ["window", "ordered", "question"])
def test_decoding_with_every_block_kept_reads_what_infllms_decoding_reads(positions):
    """With every block retrieved, a decoding step that keeps the question's blocks (read as their own part of the
    softmax, gathered once per question) reads the same keys as one that ranks its own: the same logits."""
    ids = random_ids(1, 200, seed=6)
    fields = dict(topk_blocks=32, match_queries=4, block_positions=positions)
    scores = []
    for keep in (True, False):
        model = wrap(tiny_backbone("llama", max_position_embeddings=1024).eval(), keep_question_blocks=keep, **fields)
        model.memory.trace = {}
        out = model.generate(
            ids,
            max_new_tokens=4,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            output_scores=True,
            return_dict_in_generate=True,
        )
        scores.append(torch.stack(out.scores))
        decoding = [c for c in model.memory.trace[0] if c["end"] > 200]
        assert decoding and all(len(c["selected"][0]) == c["blocks"] > 10 for c in decoding)  # every block
    torch.testing.assert_close(scores[0], scores[1], atol=1e-5, rtol=1e-5)


def test_keeping_the_question_blocks_leaves_a_document_read_in_chunks_unchanged():
    """Only calls of fewer than `match_queries` queries read the kept blocks: the logits of a document read in
    chunks (its perplexity) are the same with `keep_question_blocks` on and off, and the blocks do matter there."""
    ids = random_ids(2, 200, seed=3)
    with torch.no_grad():
        on, off = (wrap(backbone(), keep_question_blocks=k)(input_ids=ids).logits for k in (True, False))
        no_blocks = wrap(backbone(), topk_blocks=0)(input_ids=ids).logits
    torch.testing.assert_close(on, off, rtol=0, atol=0)
    assert (on - no_blocks).abs().max() > 1e-3


def test_prompts_sharing_a_beginning_read_it_once_and_answer_as_alone():
    model = wrap(backbone())
    trunk, other = random_ids(1, 200, seed=4)[0].tolist(), random_ids(1, 200, seed=5)[0].tolist()
    prompts = [trunk[:150] + other[:50], trunk[:90] + other[:60], trunk + other[:7], other[:120], trunk[:40]]
    shared = SharedPrefixes(model, prompts)
    # prompt 1 continues from prompt 0 after 80 tokens (5 segments), prompt 2 from prompt 0 after 144; 3 and 4 alone
    # (4 shares 40 tokens with 0, but only 32 in whole segments and needs a token of its own: 32)
    assert shared.source == {1: (0, 80), 2: (0, 144), 4: (0, 32)} and shared.keep[0] == {32, 80, 144}
    assert shared.tokens_to_read == sum(map(len, prompts)) - 80 - 144 - 32
    alone = [Reader("alone", model).generate(p, 6, 0) for p in prompts]
    assert [shared.generate(j, 6, 0) for j in range(len(prompts))] == alone
    assert shared.states == {}  # every kept state was used and dropped
    assert SharedPrefixes(model, prompts).generate(2, 6, 0) == alone[2]  # its source never ran: read from scratch


def test_a_prompt_read_with_checkpoints_continues_from_the_last_one_after_a_stop(tmp_path, monkeypatch):
    model = wrap(backbone())  # segments of 16
    prompt = random_ids(1, 150, seed=6)[0].tolist()
    alone = Reader("alone", model).generate(prompt, 6, 0)
    checkpoints = Checkpoints(tmp_path, every=48)
    saved, save = [], Checkpoints.save

    class Stopped(Exception):
        pass

    def save_then_stop(self, name, prompt, state, progress):
        save(self, name, prompt, state, progress)
        saved.append(progress.tokens)
        if progress.tokens == 96:
            raise Stopped  # the run ends mid-prompt, after its second checkpoint

    with monkeypatch.context() as patch:
        patch.setattr(Checkpoints, "save", save_then_stop)
        with pytest.raises(Stopped):
            SharedPrefixes(model, [prompt], checkpoints, ["p"]).generate(0, 6, 0)
    assert saved == [48, 96] and checkpoints.path("p").exists()
    read, step = [], model.step
    monkeypatch.setattr(model, "step", lambda ids, *a, **k: read.append(ids.shape[1]) or step(ids, *a, **k))
    again = SharedPrefixes(model, [prompt], checkpoints, ["p"])
    assert again.generate(0, 6, 0) == alone  # the same answer as one uninterrupted read
    assert again.resumed[0].tokens == 96 and again.resumed[0].cpu_seconds > 0
    assert read == [144 - 96]  # from the checkpoint to the next one; generate reads the rest with the question
    assert not checkpoints.path("p").exists()  # removed once answered
    with monkeypatch.context() as patch:  # a checkpoint left behind (at 144): another prompt under its name refuses it
        patch.setattr(Checkpoints, "drop", lambda self, name: None)
        SharedPrefixes(model, [prompt], checkpoints, ["p"]).generate(0, 6, 0)
    other = random_ids(1, 150, seed=7)[0].tolist()
    with pytest.raises(ValueError, match=r"checkpoint .*p\.safetensors is not a state of this prompt's first tokens"):
        SharedPrefixes(model, [other], checkpoints, ["p"]).generate(0, 6, 0)
    with pytest.raises(ValueError, match=r"every 40 tokens: it must be a multiple of the segment length \(16\)"):
        SharedPrefixes(model, [prompt], Checkpoints(tmp_path, every=40), ["p"])
    with pytest.raises(ValueError, match="one distinct file name per prompt"):
        SharedPrefixes(model, [prompt, other], checkpoints, ["p", "p"])


def test_local_distances_stay_inside_the_trained_range_and_the_trace_names_the_blocks():
    model = wrap(backbone())
    model.memory.trace = {}
    ids = random_ids(1, 250, seed=2)
    with torch.no_grad():
        model(input_ids=ids)
    calls = model.memory.trace[0]
    limit = 64 + 8 + 16  # window + max(sinks, block) + chunk
    assert all(c["end"] - c["local_from"] <= limit for c in calls)
    late = calls[-1]
    assert late["end"] == 250 and late["sinks"] == 8 and len(late["selected"][0]) == 2
    assert late["blocks"] == (late["local_from"] - 8) // 8


def test_state_round_trip_continues_the_stream_exactly(tmp_path):
    model = wrap(backbone())
    ids = random_ids(1, 224, seed=4)
    with torch.no_grad():
        _, state = model.step(ids[:, :160])
        state.save(tmp_path / "state")
        loaded = ha.MemoryState.load(tmp_path / "state")
        assert set(loaded.tensors) == set(state.tensors)
        direct, _ = model.step(ids[:, 160:], state)
        again, _ = model.step(ids[:, 160:], loaded)
    torch.testing.assert_close(again.logits, direct.logits, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("store_dtype", "match_score"), [(None, "attention"), ("int8", "attention"), (None, "tokens")]
)
def test_an_unsigned_state_with_blocks_is_checked_by_its_growing_store(store_dtype, match_score):
    model = wrap(backbone(), store_dtype=store_dtype, match_blocks=1, match_queries=2, match_score=match_score)
    ids = random_ids(1, 240, seed=4)
    with torch.no_grad():
        _, state = model.step(ids[:, :208])
        signed, _ = model.step(ids[:, 208:], state)
        state.extras.pop("made_for")  # checked by its tensors: blocks, scales and matched blocks are this model's
        assert state.tensors["repr.0"].shape[2] > 1 and "match" in state.tensors
        unsigned, _ = model.step(ids[:, 208:], state)
    torch.testing.assert_close(unsigned.logits, signed.logits, atol=0, rtol=0)
    bad = ha.MemoryState(state.method, dict(state.tensors), state.segments_seen)
    count = state.tensors["repr.0"].shape[2]
    bad.tensors[f"block.k.0.{count}"] = bad.tensors["block.k.0.0"]  # a block beyond the count
    bad.tensors["block.k.1.0"] = bad.tensors["block.k.1.0"][..., :4]  # a block of the wrong width
    with pytest.raises(ValueError, match=rf"names block {count}.*'block.k.1.0' per-stream shape"):
        model.step(ids[:, 208:], bad)
    if match_score == "tokens":  # the blocks' token ids are checked as their keys are
        short = ha.MemoryState(state.method, dict(state.tensors), state.segments_seen)
        short.tensors["block.ids.0"] = short.tensors["block.ids.0"][:, :3]
        with pytest.raises(ValueError, match=r"'block.ids.0' per-stream shape \(3,\)"):
            model.step(ids[:, 208:], short)


def test_bf16_store_keeps_blocks_in_bf16_close_to_float32():
    base = backbone()
    ids = random_ids(1, 224, seed=5)
    with torch.no_grad():
        full = wrap(base)(input_ids=ids).logits
        half_model = wrap(base, store_dtype="bfloat16")
        half = half_model(input_ids=ids).logits
        _, state = half_model.step(ids)
    assert state.tensors["block.k.0.0"].dtype == torch.bfloat16 and state.tensors["tail.v.1"].dtype == torch.bfloat16
    assert (half - full).abs().max() < 0.05 * full.abs().max()


def test_int8_store_quantizes_blocks_per_token_and_head_and_reads_close_to_float32(tmp_path):
    base = backbone()
    ids = random_ids(1, 224, seed=5)
    model = wrap(base, store_dtype="int8", store_device="cpu")
    with torch.no_grad():
        full = wrap(base)(input_ids=ids).logits
        quarter = model(input_ids=ids).logits
        _, state = model.step(ids)
        _, exact = wrap(base).step(ids)
    keys, scale = state.tensors["block.k.0.0"], state.tensors["block.ks.0.0"]
    assert (
        keys.dtype == torch.int8
        and scale.shape == (*keys.shape[:3], 1)
        and state.tensors["tail.v.1"].dtype == torch.float32
    )
    reference = exact.tensors["block.k.0.0"]
    assert ((keys.float() * scale - reference).abs() <= scale / 2 + 1e-6).all()  # rounding error at most half a step
    assert 0 < (quarter - full).abs().max() < 0.02 * full.abs().max()
    state.save(tmp_path / "state")  # int8 blocks and their scales round-trip
    loaded = ha.MemoryState.load(tmp_path / "state")
    assert torch.equal(loaded.tensors["block.k.0.0"], keys) and torch.equal(
        loaded.tensors["block.vs.1.0"], state.tensors["block.vs.1.0"]
    )
    # where this process keeps its store is a runtime switch: not saved, given again when loading
    model.save_pretrained(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "memory_config.json").read_text())
    assert saved["store_dtype"] == "int8" and "store_device" not in saved
    again = ha.MemoryModel.from_pretrained(base, str(tmp_path / "adapter"), store_device="cpu")
    assert again.memory_config.store_device == "cpu"


def test_generating_from_a_state_reads_its_blocks_where_they_are():
    """`generate(memory_state=...)` and the state it hands back hold the given blocks themselves, not copies (each
    generation copied the whole store before: 4 GB of heap at 90k tokens on SmolLM2-135M); the given state is
    unchanged and answers again the same."""
    model = wrap(backbone())
    ids = random_ids(1, 200, seed=4)
    with torch.no_grad():
        _, state = model.step(ids[:, :192])
    before = {k: v.clone() for k, v in state.tensors.items()}
    names = [k for k in state.tensors if k.startswith("block.")]
    assert len(names) > 10
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    out = model.generate(ids[:, 192:], memory_state=state, **kwargs)
    after = output_cache(out).memory_state()
    assert all(after.tensors[k].data_ptr() == state.tensors[k].data_ptr() for k in names)
    assert all(torch.equal(state.tensors[k], v) for k, v in before.items())
    assert torch.equal(model.generate(ids[:, 192:], memory_state=state, **kwargs).sequences, out.sequences)


@pytest.mark.parametrize("store_dtype", [None, "int8"])
def test_cpu_blocks_share_a_few_ram_pages_and_a_copied_model_gets_its_own(store_dtype):
    """Blocks (and int8 scales) are views of 64 MB pages, not one heap allocation each (block_pages.py); the values
    are the blocks themselves, and a deep copy of the model fills pages of its own."""
    base = backbone()
    model = wrap(base, store_dtype=store_dtype)
    ids = random_ids(1, 224, seed=5)
    with torch.no_grad():
        out, state = model.step(ids)
    names = [k for k in state.tensors if k.startswith("block.") and not k.startswith("block.valid")]
    pages = {state.tensors[k].untyped_storage().data_ptr() for k in names}
    assert len(names) > 8 and len(pages) == 1
    assert all(state.tensors[k].untyped_storage().nbytes() == block_pages.PAGE_BYTES for k in names)
    assert all(state.tensors[k].is_contiguous() for k in names)
    # the same blocks as the tail they were cut from: a store read back equals reading the prompt in two calls
    with torch.no_grad():
        streamed, _ = model.step(ids[:, 200:], model.step(ids[:, :200])[1])
    torch.testing.assert_close(streamed.logits, out.logits[:, 200:], atol=0, rtol=0)
    copied = copy.deepcopy(model)
    assert copied.memory.pages is not model.memory.pages
    with torch.no_grad():
        _, again = copied.step(ids)
    assert not {again.tensors[k].untyped_storage().data_ptr() for k in names} & pages
    assert all(torch.equal(again.tensors[k], state.tensors[k]) for k in state.tensors)


@pytest.mark.parametrize("store_dtype", [None, "int8"])
def test_blocks_past_the_ram_budget_live_in_memory_mapped_files_and_read_the_same(tmp_path, store_dtype):
    base = backbone()
    ids = random_ids(1, 224, seed=5)
    block_bytes = (
        2 * 2 * 8 * 8 * (1 if store_dtype == "int8" else 4) * 2
    )  # K and V, 2 heads x 8 tokens x 8 dims, 2 layers
    in_ram = wrap(base, store_dtype=store_dtype)
    on_disk = wrap(
        base, store_dtype=store_dtype, store_disk=str(tmp_path / "blocks"), store_ram_gb=2.5 * block_bytes / 1e9
    )
    with torch.no_grad():
        reference, ram_state = in_ram.step(ids)
        out, state = on_disk.step(ids)
        streamed, _ = on_disk.step(ids[:, 200:], on_disk.step(ids[:, :200])[1])
    torch.testing.assert_close(out.logits, reference.logits, atol=0, rtol=0)
    torch.testing.assert_close(streamed.logits, reference.logits[:, 200:], atol=0, rtol=0)
    blocks = state.tensors["repr.0"].shape[2]
    files = [state.tensors[f"block.k.{i}.{b}"].untyped_storage().filename for b in range(blocks) for i in (0, 1)]
    assert blocks > 3 and files[:4] == [None] * 4  # the first two blocks fit the budget of 2.5 blocks
    assert all(f is not None and f.startswith(str(tmp_path / "blocks")) for f in files[4:])
    assert all(torch.equal(state.tensors[k], ram_state.tensors[k]) for k in ram_state.tensors)
    assert list((tmp_path / "blocks").iterdir()) == []  # each page file is unlinked once it is mapped
    state.save(tmp_path / "state")  # a state with file-backed blocks saves and loads like any other
    assert torch.equal(
        ha.MemoryState.load(tmp_path / "state").tensors[f"block.v.1.{blocks - 1}"],
        state.tensors[f"block.v.1.{blocks - 1}"],
    )
    on_disk.save_pretrained(tmp_path / "adapter")  # where this process keeps its store is not saved
    saved = json.loads((tmp_path / "adapter" / "memory_config.json").read_text())
    assert "store_disk" not in saved and "store_ram_gb" not in saved


def test_growing_append_equals_cat_reuses_its_buffer_and_keeps_branches_apart():
    from hmt_adapters.methods.infllm.growing import append

    x, reference, views = torch.zeros(2, 3, 0, 4, dtype=torch.bfloat16), torch.zeros(2, 3, 0, 4), []
    for _ in range(50):
        row = torch.randn(2, 3, 1, 4)
        x, reference = append(x, row, dim=2), torch.cat([reference, row.bfloat16().float()], dim=2)
        views.append(x)
        assert x.dtype == torch.bfloat16 and torch.equal(x.float(), reference)
    buffers = {v.untyped_storage().data_ptr() for v in views}
    assert len(buffers) <= 4  # rooms of 16, 34, 70: a copy per doubling, not per row
    older = views[19]  # a branch from an older state: its rows are copied, the later views keep theirs
    branch = append(older, torch.full((2, 3, 1, 4), 7.0), dim=2)
    assert branch.untyped_storage().data_ptr() not in buffers and torch.equal(branch[:, :, :20], older)
    assert torch.equal(views[30].float(), reference[:, :, :31]) and bool((branch[:, :, 20] == 7).all())
    leaf = torch.zeros(1, 2, requires_grad=True)
    grown = append(leaf, torch.ones(1, 1), dim=1)  # under autograd: torch.cat, gradients flow
    grown.sum().backward()
    assert torch.equal(leaf.grad, torch.ones(1, 2))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page residency is read from Linux's /proc")
def test_full_file_pages_leave_the_resident_set_and_read_back_the_same(tmp_path):
    pages = block_pages.BlockPages(str(tmp_path), page_bytes=64 * 1024)
    blocks = [torch.randn(4, 1000) for _ in range(12)]  # 16 KB each: four to a page, three pages
    placed = [pages.place(b) for b in blocks]
    files = [placed[i].untyped_storage().filename for i in (0, 4, 8)]

    def resident() -> list[int]:
        found = block_pages.resident_kib_by_mapping()  # the files' resident KiB (None: no longer mapped)
        return [found.get(f) for f in files]

    assert resident() == [0, 0, 64]  # only the page being filled
    assert all(torch.equal(p, b) for p, b in zip(placed, blocks))  # reads map the dropped pages back
    assert resident() == [64, 64, 64]
    assert pages.release_full_pages() == 2 and resident() == [0, 0, 64]
    del placed[:4]  # the first page's blocks are gone: its mapping goes with them
    assert pages.release_full_pages() == 1 and resident() == [None, 0, 64]
    assert all(torch.equal(p, b) for p, b in zip(placed, blocks[4:]))


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"store_ram_gb": 1.0}, ["store_ram_gb", "store_disk", "None"]),
        ({"store_disk": "/tmp/x", "store_device": "cuda"}, ["store_disk", "cuda", "store_device='cpu'"]),
        ({"select_per": "head"}, ["select_per", "layer", "kv_head"]),
        ({"store_dtype": "int4"}, ["store_dtype", "bfloat16", "int8"]),
        ({"store_device": "gpu7"}, ["store_device", "gpu7", "cpu"]),
        ({"window": 240}, ["240", "exceeds", "256"]),
        ({"representative_keys": 9}, ["representative_keys", "9", "8"]),
        ({"block_positions": "shared"}, ["block_positions", "shared", "window", "ordered"]),
        (
            {"block_positions": "ordered", "topk_blocks": 21, "keep_question_blocks": False},
            ["ordered", "topk_blocks 21", "264", "256", "'window'"],
        ),
        (
            {"block_positions": "ordered", "topk_blocks": 11, "keep_question_blocks": True},
            ["22 blocks", "twice with keep_question_blocks", "272"],
        ),
    ],
)
def test_bad_fields_are_refused_naming_the_value_and_the_allowed_ones(fields, words):
    with pytest.raises(ValueError) as err:
        wrap(backbone(), **fields)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_scaled_block_below_the_representatives_says_how_it_was_sized():
    """A small context scales the unset block below the default 4 representative keys: the error says so and
    names both ways out."""
    with pytest.raises(ValueError) as err:
        ha.InfLLMConfig(segment_length=8).resolved(64)
    words = ["(2:", "`block_size` unset", "64 positions", "`block_size` >= 4", "`representative_keys` <= 2"]
    assert all(w in str(err.value) for w in words), str(err.value)


def test_config_round_trips_and_defaults_scale_with_the_context():
    config = ha.InfLLMConfig(window=2048)
    assert ha.InfLLMConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert ha.InfLLMConfig.paper().resolved(8192) == (4096, 128, 128)  # InfLLM's settings at an 8k context
    assert ha.InfLLMConfig.paper(segment_length=64).resolved(512) == (256, 16, 16)
    # the default reader's blocks sit at their own positions before the window: a quarter of the context, <= 512
    assert ha.InfLLMConfig().resolved(8192) == (512, 128, 128)
    assert ha.InfLLMConfig(segment_length=64).resolved(512) == (128, 16, 16)
    assert ha.InfLLMConfig(max_window=1024).resolved(8192)[0] == 1024
    assert ha.InfLLMConfig(window=700).resolved(8192)[0] == 700  # a set window is the window
    # `max_window=None`: files written before the field, ordered (the defaults of 2026-12-04) and InfLLM's
    assert ha.InfLLMConfig(max_window=None).resolved(8192)[0] == 2048
    assert ha.InfLLMConfig.paper(max_window=None).resolved(8192)[0] == 4096


def test_standard_passkey_and_noise_needle_tasks():
    tokenizer = smollm2_tokenizer()
    sample = TASKS["passkey_standard"](tokenizer, 2048, seed=1, depth=0.5)
    text = tokenizer.decode(sample.input_ids)
    key = sample.answers[0]
    assert len(sample.input_ids) == 2048 and f"The pass key is {key}. Remember it. {key} is the pass key." in text
    assert "The grass is green. The sky is blue." in text and text.endswith("What is the pass key? The pass key is")
    needle = TASKS["niah_single_noise"](tokenizer, 2048, seed=1, depth=0.3)
    assert needle.haystack == "repeat" and f"is: {needle.answers[0]}." in tokenizer.decode(needle.input_ids)


def test_records_accumulate_without_duplicates_and_wilson_intervals(tmp_path):
    path = tmp_path / "r.jsonl"
    row = {
        "reader": "infllm",
        "task": "passkey_standard",
        "haystack": "repeat",
        "length": 8192,
        "depth": 0.5,
        "seed": 0,
        "score": 1.0,
    }
    append_record(path, row)
    append_record(path, {**row, "score": 0.0})  # the same key again: the later record replaces it
    append_record(path, {**row, "seed": 1, "score": 1.0})
    rows = load_records(path)
    assert len(rows) == 2 and {record_key(r)[-1] for r in rows} == {0, 1}
    cell = cell_table(rows)["passkey_standard"]["infllm"][8192]
    assert cell["samples"] == 2 and cell["accuracy"] == 0.5
    low, high = wilson_interval(25, 25)
    assert abs(low - 0.8668) < 1e-4 and high == 1.0
    low, high = wilson_interval(5, 10)
    assert abs(low - 0.2366) < 1e-4 and abs(high - 0.7634) < 1e-4
    with pytest.raises(ValueError, match="seed"):
        record_key({k: v for k, v in row.items() if k != "seed"})


@pytest.mark.parametrize("topk, found", [(0, False), (64, True)])
def test_retrieval_recall_per_layer_at_the_question(topk, found):
    from hmt_adapters.evaluation import Insert, Sample, retrieval_recall

    model = wrap(backbone(), topk_blocks=topk)
    ids = random_ids(1, 250, seed=6)
    sample = Sample("t", 250, ids[0].tolist(), ["x"], "q", [Insert("needle", 0.2, position=40, num_tokens=5)], "none")
    model.memory.trace = {}
    model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    recall = retrieval_recall(model, sample)
    # the needle (tokens 40-44) lies in a block: only retrieval can bring it back (all blocks with a large top-k)
    assert recall["layers"] == 2 and recall["per_layer"] == {"0": found, "1": found}
    assert recall["blocks"] == (240 - 64 - 8) // 8  # 240 tokens closed before the question chunk was read
    inside = Sample("t", 250, ids[0].tolist(), ["x"], "q", [Insert("n", 0.9, position=240, num_tokens=5)], "none")
    assert retrieval_recall(model, inside)["layers_found"] == 2  # in the local window: always readable
    # of several needles, the ones holding an answer count (a multi-key prompt's distractors need not be read)
    needles = [
        Insert("the key is x", 0.9, position=240, num_tokens=5),
        Insert("the key is y", 0.2, position=40, num_tokens=5),
    ]
    several = Sample("t", 250, ids[0].tolist(), ["x"], "q", needles, "none")
    assert retrieval_recall(model, several)["layers_found"] == 2
    several.answers = ["y"]
    assert retrieval_recall(model, several)["per_layer"] == {"0": found, "1": found}


def test_a_padded_row_reads_as_it_reads_alone():
    model = wrap(backbone())
    ids = random_ids(2, 230, seed=9)
    mask = torch.ones_like(ids)
    mask[1, 150:] = 0  # row 1 ends inside a chunk: its padding queries must not move the chunk's mean query
    with torch.no_grad():
        both = model(input_ids=ids, attention_mask=mask).logits
        alone = model(input_ids=ids[1:, :150]).logits
    torch.testing.assert_close(both[1, :150], alone[0], atol=1e-5, rtol=1e-5)
    left = torch.ones_like(ids)
    left[1, :80] = 0  # left padding in generation
    out = model.generate(ids, attention_mask=left, max_new_tokens=4, do_sample=False, pad_token_id=0)
    alone = model.generate(ids[1:, 80:], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(out[1, -4:], alone[0, -4:])


def test_query_slices_give_the_same_attention(monkeypatch):
    model = wrap(backbone())
    ids = random_ids(1, 230, seed=10)
    with torch.no_grad():
        whole = model(input_ids=ids).logits
        monkeypatch.setattr(attend, "QUERY_SLICE_FLOATS", 4 * 100)  # a few queries per slice
        sliced = model(input_ids=ids).logits
    torch.testing.assert_close(sliced, whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_one_kernel_read_gives_the_sliced_reads_logits_and_tokens(monkeypatch, padded):
    """With nothing ranking blocks by their representatives (`topk_blocks=0`) and one query for every part
    (`block_positions="ordered"`), a chunk's joint softmax runs as one SDPA call (`parts_attention`): the explicit
    sliced read's logits and greedy tokens, in a left-padded batch too (a query that sees no key gets a uniform
    row, as the explicit softmax gives it: no NaN)."""
    model = wrap(backbone(), **DEFAULT_READER)  # the defaults: no ranked block, ordered positions
    ids = random_ids(2, 230, seed=11)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :70] = 0
    calls = []
    fused_attention = infllm_module.parts_attention
    monkeypatch.setattr(infllm_module, "parts_attention", lambda *a: calls.append(a[0].shape) or fused_attention(*a))

    def run():
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        tokens = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        return logits, tokens

    fused, fused_tokens = run()
    assert {shape[2] for shape in calls} == {16, 6, 1}  # every chunk (230 = 14 x 16 + 6) and decoding step
    calls.clear()
    monkeypatch.setattr(InfLLM, "_one_kernel", staticmethod(lambda *args: False))
    sliced, sliced_tokens = run()
    assert not calls
    assert torch.isfinite(fused).all()
    real = mask.bool()
    torch.testing.assert_close(fused[real], sliced[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(fused_tokens, sliced_tokens)


def test_smollm2_answers_a_needle_it_retrieved_from_memory():
    """The real model, no training: SmolLM2-135M wrapped with the default configuration (window 4096) answers a
    RULER single needle in an 8k-token noise haystack with the needle in a retrieved block, not in the window
    (4k-128k are measured in docs/infllm.md)."""
    from hmt_adapters.backbones import smollm2

    base, tokenizer = smollm2()
    model = ha.wrap_with_memory(base.eval(), "infllm").eval()
    model.memory.trace = {}
    sample = TASKS["niah_single_noise"](tokenizer, 8192, seed=0, depth=0.3)
    new = Reader("infllm", model).generate(sample.input_ids, sample.extra["max_new_tokens"], tokenizer.eos_token_id)
    assert sample.answers[0] in tokenizer.decode(new)
    recall = retrieval_recall(model, sample)
    assert recall["blocks"] > 16 and recall["layers_found"] >= 27  # more blocks than retrieved; found in 27+ of 30


def test_the_weight_free_configuration_ships_loads_in_one_line_and_its_card_says_so():
    from hmt_adapters.saving.card import render_model_card

    folder = Path(__file__).resolve().parents[1] / "examples" / "adapters" / "smollm2-infllm"
    model = ha.AutoMemoryModelForCausalLM.from_pretrained(str(folder))
    assert model.method == "infllm" and list(model.memory.parameters()) == []
    assert model.memory_config == ha.InfLLMConfig()  # the defaults: the README headline's reader (`infllm`)
    assert (model.memory.window, model.memory.sinks, model.memory.block) == (512, 128, 128)  # scaled to SmolLM2
    assert model.memory.match_layer == 0
    card = str(render_model_card(wrap(backbone())))
    assert "no trained weights" in card and "is_trainable" not in card and "ha.ask(model" in card
    assert "is_trainable=True" in str(render_model_card(ha.wrap_with_memory(backbone(), "rmt", segment_length=8)))


def test_the_recipe_the_headline_measured_is_the_default_reader():
    """docs/infllm.md's `wrap_with_memory(base, "infllm", ...)` call of the headline in full (the rows
    `infllm-matched-both-ordered-2k`, measured before it became the default) is the defaults on SmolLM2."""
    import ast
    import re

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "infllm.md").read_text().split("## The headline in full", 1)[1]
    snippet = re.search(r'wrap_with_memory\(\s*base, "infllm",(.*?)\n\)', page, re.S)
    assert snippet is not None
    recipe = {k.arg: ast.literal_eval(k.value) for k in ast.parse(f"f({snippet.group(1)})").body[0].value.keywords}
    assert recipe["match_blocks"] == 1 and recipe["topk_blocks"] == 0  # the call the regex found
    assert ha.InfLLMConfig(**recipe).replace(window=None) == ha.InfLLMConfig()
    assert ha.InfLLMConfig().resolved(8192)[0] == recipe["window"]  # SmolLM2's 8k context


# `examples/adapters/smollm2-infllm/memory_config.json` as shipped until 2026-12-03, when the defaults were InfLLM's
# ranking with `keep_question_blocks` (fields added later absent, as in every file of that time)
OLD_DEFAULT_FILE = {
    "base_model_architecture": "LlamaForCausalLM",
    "base_model_type": "llama",
    "block_size": None,
    "bptt_depth": None,
    "format_version": 2,
    "keep_question_blocks": True,
    "match_blocks": 0,
    "match_layer": 0,
    "match_queries": 32,
    "memory_layers": None,
    "method": "infllm",
    "representative_keys": 4,
    "segment_length": 16,
    "select_per": "layer",
    "sink_tokens": 8,
    "store_dtype": None,
    "topk_blocks": 2,
    "window": None,
}


def test_a_file_saved_with_the_old_defaults_loads_and_reads_as_it_ran(tmp_path):
    base = backbone()
    ha.wrap_with_memory(base, "infllm", segment_length=16).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "memory_config.json").read_text())
    facts = ("embed_dim", "hidden_size", "num_hidden_layers", "vocab_size")  # of this base
    old = {**OLD_DEFAULT_FILE, **{k: saved[k] for k in facts}}
    (tmp_path / "memory_config.json").write_text(json.dumps(old))
    loaded = ha.MemoryModel.from_pretrained(base, str(tmp_path))
    fields = {k: v for k, v in OLD_DEFAULT_FILE.items() if k in ha.InfLLMConfig.field_names() and k != "method"}
    then = ha.InfLLMConfig.paper(**fields, max_window=None)  # `max_window` absent: the rule of its time
    assert loaded.memory_config == then and (then.block_positions, then.match_score) == ("window", "attention")
    assert loaded.memory.window == 128  # InfLLM's half of the 256 positions (the default reader would take 64)
    ids = random_ids(1, 200, seed=3)
    with torch.no_grad():
        ran = ha.wrap_with_memory(base, then).eval()(input_ids=ids).logits
        torch.testing.assert_close(loaded(input_ids=ids).logits, ran, atol=0, rtol=0)


def test_a_file_saved_before_max_window_keeps_the_window_it_read(tmp_path):
    """The defaults of 2026-12-04 saved `window` null under ordered positions, which scaled to a quarter of the
    context up to 2048; such a file (no `max_window`) loads with that window, a save of today's defaults with 512."""
    base = tiny_backbone("llama", max_position_embeddings=4096).eval()
    ha.wrap_with_memory(base, "infllm").save_pretrained(tmp_path)
    path = tmp_path / "memory_config.json"
    saved = json.loads(path.read_text())
    assert (saved["window"], saved["max_window"], saved["block_positions"]) == (None, 512, "ordered")
    assert ha.MemoryModel.from_pretrained(base, str(tmp_path)).memory.window == 512
    del saved["max_window"]
    path.write_text(json.dumps(saved))
    loaded = ha.MemoryModel.from_pretrained(base, str(tmp_path))
    assert loaded.memory_config.max_window is None and loaded.memory.window == 1024  # 4096 // 4, as it ran


def test_the_default_reader_reads_the_block_holding_the_last_words_in_document_order():
    """The defaults: sinks, the window and the one stored block (with both neighbours) sharing the most rare words
    with the call's last tokens, at their own positions in document order; no block ranked by representatives."""
    base = backbone()
    model = ha.wrap_with_memory(base, "infllm", segment_length=16, sink_tokens=8, block_size=8).eval()
    assert model.memory.window == 64 and model.memory_config.topk_blocks == 0
    ids = random_ids(1, 240, seed=11)
    ids[ids >= 80] = 0
    ids[0, 64:72] = torch.arange(80, 88)  # block 7 (after the 8 sinks): words only the question repeats
    ids[0, -8:] = torch.arange(80, 88)
    model.memory.trace = {}
    with torch.no_grad():
        model(input_ids=ids)
    selected = model.memory.trace[0][-1]["selected"][0]
    assert sorted(selected) == [6, 7, 8]  # block 7 and both its neighbours
    assert all(model.memory.trace[layer][-1]["selected"][0] == selected for layer in model.memory.trace)


FAMILY_FIELDS = dict(segment_length=8, window=24, sink_tokens=4, block_size=4, topk_blocks=2, representative_keys=2)


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if f not in REFUSED])
def test_every_attention_family_is_its_bare_self_inside_the_window_and_reads_blocks_past_it(family):
    base = family_backbone(family)
    model = ha.wrap_with_memory(base, "infllm", **FAMILY_FIELDS, **layer_overrides("infllm", family)).eval()
    gen = torch.Generator().manual_seed(0)
    short, long = (torch.randint(0, FAMILY_VOCAB, (2, n), generator=gen) for n in (27, 90))
    with torch.no_grad():
        # exact where positions are relative (RoPE): learned absolute positions (GPT-2, OPT, BigCode) restart every
        # segment, and SSM/convolution state (the hybrids) restarts every segment too
        if model.adapter.rope_module is not None and family not in STATE_OUTSIDE_ATTENTION:
            torch.testing.assert_close(
                model(input_ids=short).logits, base(input_ids=short).logits, atol=1e-4, rtol=1e-4
            )
        model.memory.trace = {}
        logits = model(input_ids=long).logits
    assert torch.isfinite(logits).all()
    layer = min(model.memory.trace)
    # the default reader: the 2 ranked blocks and the token-matched one with both neighbours, 5 distinct blocks
    assert model.memory.trace[layer][-1]["blocks"] > 5 and len(model.memory.trace[layer][-1]["selected"][0]) == 5
    out = model.generate(long[:1], max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 93)  # (a random model's eos can come first: min_new_tokens)
    if (
        model.adapter.rope_module is None
        or family in STATE_OUTSIDE_ATTENTION
        or getattr(base.config, "sliding_window", None)
    ):
        return  # a sliding-window layer reads blocks its own window would not (Mistral, Gemma2/3's local layers)
    # ordered block positions with every block retrieved: the family's own RoPE (partial, interleaved) puts each
    # block key at its true position, so the whole document reads as the bare backbone reads it
    fields = {**FAMILY_FIELDS, **PAPER, "topk_blocks": 6, "block_positions": "ordered"}
    ordered = ha.wrap_with_memory(base, "infllm", **fields, **layer_overrides("infllm", family)).eval()
    with torch.no_grad():
        got, full = ordered(input_ids=long[:, :56]).logits, base(input_ids=long[:, :56]).logits
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["ordered", "question"])
def test_the_question_chunk_reads_exactly_the_view_its_block_positions_lay_out(positions):
    """A one-layer model's keys and values do not depend on context, so the chunk that ends a document reads
    exactly what the bare model reads over the tokens it sees laid out at contiguous positions: `"ordered"`: sinks,
    the retrieved blocks, the tail, the chunk; `"question"`: sinks, tail, blocks, chunk. So does the first decoding
    step after that chunk closed, with the blocks still just before the question's chunk (now the tail's end)."""
    base = tiny_backbone("llama", max_position_embeddings=512, num_hidden_layers=1).eval()
    model = wrap(base, **{**DEFAULT_READER, "block_positions": positions, "match_queries": 8})
    ids = random_ids(1, 160, seed=3)
    ids[0, 40:48] = ids[0, -8:]  # the question's last words, in block 4 (tokens 40-47): blocks 3-5 are retrieved
    prompt, sinks, block, chunk = ids[0].tolist(), 8, 8, 16

    def seen(call: dict, tail_end: int, question: int, new: list[int]) -> torch.Tensor:
        """The tokens `call` read laid out as `positions` does: its tail ends at `tail_end`, whose last `question`
        tokens are the question's, then the call's own `new` tokens."""
        assert call["selected"][0] == [3, 4, 5]  # the matched block with both neighbours
        blocks = [t for b in call["selected"][0] for t in prompt[sinks + b * block : sinks + (b + 1) * block]]
        tail = prompt[call["local_from"] : tail_end]
        cut = len(tail) - question
        if positions == "ordered":
            return torch.tensor([prompt[:sinks] + blocks + tail + new])
        return torch.tensor([prompt[:sinks] + tail[:cut] + blocks + tail[cut:] + new])

    with torch.no_grad():
        model.memory.trace = {}
        got = model(input_ids=ids).logits[0, -chunk:]
        call = next(c for c in model.memory.trace[0] if c["end"] == len(prompt))
        # the question's chunk is the call itself: the tail ends before it
        want = base(seen(call, len(prompt) - chunk, 0, prompt[-chunk:])).logits[0, -chunk:]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        _, state = model.step(ids)
        model.memory.trace = {}
        step = model.step(torch.tensor([[5]]), state)[0].logits[0, -1]
        call = model.memory.trace[0][-1]
        want = base(seen(call, len(prompt), chunk, [5])).logits[0, -1]
        torch.testing.assert_close(step, want, atol=1e-5, rtol=1e-5)
