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
}


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
