"""Reading a segment's memory once while it is decoded token by token."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..attention import AttentionCall, AttentionContext

T = TypeVar("T")
Reader = Callable[[AttentionCall, AttentionContext], T]


def read_once(build: Reader[T]) -> Reader[T]:
    """`build`, for a read that does not depend on the queries, run at its first call and reused afterwards.

    Methods wrap a reader per segment (per `prepare`). Training calls each layer once per segment (checkpoint
    recomputation prepares again), while generation calls it once per new token: those calls get the first read.
    """
    kept: list[T] = []

    def read(call: AttentionCall, context: AttentionContext) -> T:
        if not kept:
            kept.append(build(call, context))
        return kept[0]

    return read
