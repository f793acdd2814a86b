"""The method configurations the shared tests run, and which backbone families each one supports."""

from __future__ import annotations

import hmt_adapters as ha
from hmt_adapters.registry import get_method
from tiny import ATTENTION_FAMILIES, FAMILIES, tiny_backbone

SEGMENT = 8

# method string -> config overrides for tiny models (segment_length is always SEGMENT)
METHOD_CASES: dict[str, dict] = {
    "rmt": dict(num_memory_tokens=2),
    "hmt": dict(sensory_length=3, memory_window=4, retrieval_dim=16),
    "transformer_xl": dict(memory_size=12),
    "trams": dict(memory_size=16, select_size=8),  # recent_keep 6 + top 2 of the older 10
    "memorizing_transformer": dict(memory_size=24, topk=4),
    "unimix": dict(memory_size=24, window=4, global_tokens=2, topk=2, memory_tokens=2),
    "elastic": dict(hippo_order=8, memory_tokens=6),
    "melodi": dict(summary_length=4, long_term_length=2, long_term_windows=3),
    "infllm": dict(window=8, sink_tokens=2, block_size=4, representative_keys=2),
    "armt": dict(key_size=4, read_init_std=0.05),  # a read that starts nonzero: gradients reach every weight at once
}

# Methods causal between segments but not inside one, and why. The shared causality and streaming tests hold them to
# that (no logit depends on a later segment's tokens; a stream cut at segment boundaries equals one forward); the
# tests that compare token by token (greedy generation against forward, padded streams cut mid-segment) run them
# with the overrides under which they are causal.
CAUSAL_PER_SEGMENT = {
    "infllm": (
        "a chunk's block is chosen by the words of its last tokens, so an early token's logits depend on the "
        "chunk's later tokens (docs/infllm.md, 'Not causal inside a chunk')"
    ),
}
# every block retrieved: no choice left to depend on the queries (at the window's distance: 64 ordered blocks would
# not fit a tiny context)
CAUSAL_WITH = {"infllm": dict(topk_blocks=64, block_positions="window")}
# Methods whose state assumes the rows of a batch close their segments in the same `step` calls, and why: the shared
# test of padded rows streamed in calls where they close segments at different times leaves them out. `generate`
# splits such rows into groups that close together, so its padded batches are exact (tests/test_infllm.py).
ROWS_CLOSE_TOGETHER = {
    "infllm": (
        "the sinks and blocks are cut from the front of a tail shared by the batch, at the batch's width: a row "
        "that closed fewer segments loses part of its local window to blocks and takes its sinks from another "
        "offset"
    ),
}


def token_causal(method: str) -> dict:
    """Overrides under which `method`'s every logit depends on earlier tokens only (none for most methods)."""
    return CAUSAL_WITH.get(method, {})


def families_for(method: str) -> tuple[str, ...]:
    return ATTENTION_FAMILIES if get_method(method).needs_attention else FAMILIES


def cases(predicate=lambda method: True) -> list[tuple[str, str]]:
    """`(method, family)` pairs for every method the predicate accepts, on every family it supports."""
    return [(m, f) for m in METHOD_CASES if predicate(m) for f in families_for(m)]


def wrap(method: str, family: str, seed: int = 0, **overrides) -> ha.MemoryModel:
    kwargs = {"segment_length": SEGMENT, **METHOD_CASES[method], **overrides}
    return ha.wrap_with_memory(tiny_backbone(family, seed), method, **kwargs)


def has_parameters(method: str) -> bool:
    return any(True for _ in wrap(method, families_for(method)[0]).memory_parameters())


def trains_through_memory(method: str) -> bool:
    """Methods whose memory carries gradients across segments (input-level memory)."""
    return not get_method(method).needs_attention
