"""Zero-shot memory readers: the bare backbone wrapped with a memory method and no training, so every method gets a
row in the long-context tables even where no adapter was trained for it (docs/benchmarks.md).

The attention-level methods read the backbone's own keys/values and can retrieve without training; the input-level
ones (and every learned part of the others) start from their untrained initialisation, which each method's
registration states (`register_method(..., untrained=...)`) and the results record.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from ..config import MemoryConfig
from ..model import MemoryModel, wrap_with_memory
from ..registry import available_methods, get_method
from .runner import Reader

SEGMENT_LENGTH = 256  # the shipped SmolLM2 adapter's segment: zero-shot rows read with the same window
MEMORY_SIZES = ("preset", "cover")


def zero_shot_fields(
    method: str, segment_length: int = SEGMENT_LENGTH, memory: str = "preset", cover: int | None = None
) -> dict[str, Any]:
    """Config fields of `method`'s zero-shot reader: `segment_length`, and with `memory='cover'` a store sized to
    hold `cover` past tokens (the method's config says how: `MemoryConfig.cover_fields`; K/V methods size
    `memory_size`, HMT and MELODI enough cached segments, the rest have no store size); `'preset'` keeps the
    method's defaults."""
    get_method(method)  # a ValueError naming the registered methods
    if memory not in MEMORY_SIZES:
        raise ValueError(f"Unknown memory size policy {memory!r}; allowed: {list(MEMORY_SIZES)}.")
    fields: dict[str, Any] = {"segment_length": segment_length}
    if memory == "preset":
        return fields
    if cover is None or cover < 1:
        raise ValueError(f"memory='cover' needs `cover` (tokens the store must hold) >= 1, got {cover!r}.")
    fields.update(get_method(method).config_cls.cover_fields(cover, segment_length))
    return fields


def zero_shot_model(base: nn.Module, method: str, **fields: Any) -> MemoryModel:
    """`base` wrapped with an untrained `method` (`zero_shot_fields`); the wrapper holds its own module tree but
    shares the backbone's weights, so many readers of one backbone cost one copy of its parameters."""
    fields = zero_shot_fields(method, **fields)
    shared = {id(t): t for t in (*base.parameters(), *base.buffers())}
    return wrap_with_memory(copy.deepcopy(base, memo=shared), method, **fields).eval()


def memory_policies(words: list[str], methods: list[str]) -> dict[str, str]:
    """`["cover", "transformer_xl=preset"]` -> each method's store policy: the bare word is the default (`preset`
    if none), `method=policy` overrides one method; a bad word or a method not run is an error naming the options."""
    default, per_method = "preset", {}
    for word in words:
        method, _, policy = word.rpartition("=")
        if policy not in MEMORY_SIZES:
            raise ValueError(f"Unknown memory size policy {policy!r} in {word!r}; allowed: {list(MEMORY_SIZES)}.")
        if not method:
            default = policy
        elif method not in methods:
            raise ValueError(f"{word!r} names method {method!r}, which is not among the methods run: {methods}.")
        else:
            per_method[method] = policy
    return {m: per_method.get(m, default) for m in methods}


def zero_shot_readers(
    base: nn.Module,
    methods: list[str],
    segment_length: int = SEGMENT_LENGTH,
    memory: str | dict[str, str] = "preset",
    cover: int | None = None,
) -> tuple[list[Reader], dict[str, Any]]:
    """One `Reader` named `<method> (zero-shot)` per method (`memory`: one store policy for all, or one per method),
    and what each one ran (config, store policy, untrained parts) for the results; refuses an unknown method name,
    naming the registered ones, before building any."""
    unknown = [m for m in methods if m not in available_methods()]
    if unknown:
        raise ValueError(f"Unknown memory method(s) {unknown}; available methods: {available_methods()}.")
    policies = memory if isinstance(memory, dict) else dict.fromkeys(methods, memory)
    readers, info = [], {}
    for method in methods:
        model = zero_shot_model(base, method, segment_length=segment_length, memory=policies[method], cover=cover)
        name = f"{method} (zero-shot)"
        readers.append(Reader(name, model))
        config: MemoryConfig = model.memory_config
        info[name] = {
            "method": method,
            "memory": policies[method],
            "config": config.to_dict(),
            "untrained": get_method(method).untrained,
        }
    return readers, info
