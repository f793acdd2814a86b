"""`UniMemConfig`: K/V memory methods as UniMem compositions (management, writing, reading, injection).

Transformer-XL, the Memorizing Transformer, TRAMS and UniMix are presets of this one configuration
(docs/attention_memory.md);
`TRAMSConfig` is the same class with the `"trams"` preset fixed. Fields left `None` take the preset's value, resolved
against `segment_length` when used (`settings()`), so `replace(segment_length=...)` keeps derived sizes consistent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...config import MemoryConfig

PRESETS = ("transformer_xl", "memorizing_transformer", "trams", "unimix")
POSITION_SCHEMES = ("original", "compact", "pos0")
READINGS = ("all", "window", "global", "topk", "union", "trams")
SCORES = ("code", "paper", "norm")
SELECT_PER = ("query_head", "kv_head")
COMBINES = ("joint", "gated")
LAYER_RULES = ("all", "middle_and_last", "upper_half")

# Which knobs each reading uses; a knob set for a reading that ignores it is an error, not a silent no-op.
READING_KNOBS = {
    "all": (),
    "window": ("window",),
    "global": ("global_tokens",),
    "topk": ("topk",),
    "union": ("window", "global_tokens", "topk"),
    "trams": ("select_size", "recent_keep"),
}
# "compact" packs the read entries just before the segment: defined for readings whose entries are shared by all
# queries and kept in stream order (docs/attention_memory.md, Positions); per-query top-k entries have no such order.
COMPACT_READINGS = ("all", "window", "trams")


def _preset_defaults(preset: str, segment_length: int) -> dict[str, Any]:
    """The preset's value of every `None`-able field, for segments of `segment_length` tokens.

    Sources (UniMem §3.3, Tab. 1-2; TRAMS §3.2; docs/attention_memory.md): XL keeps one segment (Single-Sgm) and reads
    it all at its true distances; the Memorizing Transformer keeps 10 segments (Tab. 2: 20,480 tokens at L = 2048),
    reads the top 32 by q.k in the middle and last layer (code layers 11, 21 of 22), keys at position 0; UniMix keeps
    10 segments, reads a window of L plus 4 global plus top 4 in the upper half (code 11..21 of 22) and adds 40 RMT
    tokens; TRAMS keeps a pool M = 8L and attends to m = M/2 (the paper's M = 2m; our LLM example
    n = 512, M = 4096, m = 2048), keeping the newest 3/4 of m and selecting 1/4 (r = 150, k = 50 in TRAMS' release;
    docs/attention_memory.md).
    """
    L = segment_length
    base = {"window": L, "global_tokens": 4, "topk": 4, "memory_tokens": 0, "positions": "pos0"}
    table = {
        "transformer_xl": {"memory_size": L, "reading": "all", "positions": "original", "layers": "all"},
        "memorizing_transformer": {"memory_size": 10 * L, "reading": "topk", "topk": 32, "layers": "middle_and_last"},
        "trams": {"memory_size": 8 * L, "reading": "trams", "positions": "compact", "layers": "all"},
        "unimix": {"memory_size": 10 * L, "reading": "union", "memory_tokens": 40, "layers": "upper_half"},
    }
    return {**base, **table[preset]}


@dataclass(frozen=True)
class UniMemSettings:
    """Every knob of a `UniMemConfig` with the preset's defaults applied (what the method actually runs)."""

    memory_size: int
    reading: str
    positions: str
    window: int
    global_tokens: int
    topk: int
    select_size: int
    recent_keep: int
    memory_tokens: int
    layer_rule: str  # how `memory_layers=None` resolves: "all", "middle_and_last" or "upper_half"

    def layers(self, num_layers: int) -> tuple[int, ...]:
        """The preset's memory layers of a `num_layers`-deep backbone (fractions of depth, UniMem Tab. 2)."""
        if self.layer_rule == "middle_and_last":  # MemTrans "11, 21" of 22 layers
            return tuple(sorted({num_layers // 2, num_layers - 1}))
        if self.layer_rule == "upper_half":  # UniMix "12-22" (1-based) of 22 layers
            return tuple(range(num_layers // 2, num_layers))
        return tuple(range(num_layers))


@dataclass
class UniMemConfig(MemoryConfig):
    """A per-layer FIFO of past keys/values read through a patched attention (UniMem §2, eq. 9).

    Args:
        preset (`str`, defaults to `"transformer_xl"`):
            The method string this configuration was built from: `"transformer_xl"`, `"memorizing_transformer"`,
            `"trams"` or `"unimix"`. It supplies the default of every field left `None`.
        memory_size (`int`, *optional*):
            Past tokens kept per memory layer (FIFO; memory management). Preset: L (XL), 10 L (Memorizing, UniMix),
            8 L (TRAMS pool M), with L = `segment_length`.
        memory_layers (`list[int]`, *optional*):
            0-based decoder layers that read memory (injection). `None`: the preset's layers, as fractions of
            depth: all (XL, TRAMS), the middle and the last layer (Memorizing), the upper half (UniMix).
        positions (`str`, *optional*):
            RoPE positions of memory keys relative to the segment's queries: `"original"` (true stream distances),
            `"compact"` (read entries contiguous just before the segment, as TRAMS), `"pos0"` (every memory key
            at position 0, as UniMem; docs/attention_memory.md, Positions). Preset: original (XL), compact (TRAMS),
            pos0 (Memorizing, UniMix).
            Learned-position backbones (OPT, GPT-2) keep the positions their keys were computed at.
        reading (`str`, *optional*):
            Memory reading: `"all"`, `"window"` (entries at distance <= `window` from the query), `"global"` (the
            first `global_tokens` entries of the buffer), `"topk"` (per query and head, the `topk` entries of
            largest q.k), `"union"` (window + global + top-k among the rest, no duplicates; UniMix) or `"trams"`
            (query-independent selection of `select_size` entries per layer, head and row).
        window (`int`, *optional*): Window length for `"window"`/`"union"` reading (preset: L).
        global_tokens (`int`, *optional*): Global entries for `"global"`/`"union"` reading (preset: 4).
        topk (`int`, *optional*): Entries retrieved per query and head, at most `memory_size` (preset: 32 Memorizing,
            4 UniMix, each at most the store).
        select_size (`int`, *optional*):
            TRAMS: memory tokens attended (`m`) out of `memory_size` (`M`). Preset: `memory_size // 2`.
        recent_keep (`int`, *optional*):
            TRAMS: the newest `r` of the pool are always kept; the other `select_size - r` are the top of the
            metric among the older ones. Preset: `3 * select_size // 4` (150 of 200 in TRAMS' release).
        select_score (`str`, defaults to `"code"`):
            TRAMS metric: `"code"` (TRAMS' release, norm(K') * |1.K'|; docs/attention_memory.md), `"paper"`
            (1.K' / sqrt(D)) or `"norm"`.
        select_per (`str`, defaults to `"query_head"`):
            TRAMS with grouped-query attention: select per query head (memory grows to the query heads) or once
            per key/value head (the group's scores summed).
        fold_norm_weight (`bool`, defaults to `True`):
            TRAMS: fold the pre-attention norm weight into the metric (docs/attention_memory.md), so the query-side
            norm is constant.
        combine (`str`, defaults to `"joint"`):
            `"joint"`: one softmax over memory and local keys (UniMem); `"gated"`: a learned per-head gate
            sigmoid(theta_h) mixes memory-only and local-only attention (the original Memorizing Transformer).
        memory_tokens (`int`, *optional*):
            RMT memory tokens read before and written after each segment (model-forward writing). Preset: 40
            (UniMix), 0 otherwise.
        detach_memory (`bool`, defaults to `True`):
            Store keys/values without gradient (stop-gradient, as Transformer-XL and the Memorizing Transformer).
            Then a loss in a later segment never reaches what an earlier segment wrote: fine-tuning with a loss on
            every token works, but a task supervised only long after its evidence (the recall benchmark) cannot
            teach the model what to write. `False` trains through the stored keys/values (BPTT, the runtime's
            `bptt_depth` truncates it); Transformer-XL whose memory covers the document then has exactly full
            attention's gradients (docs/attention_memory.md, "Training from scratch").
    """

    preset: str = field(default="transformer_xl", metadata={"help": "Method string (preset).", "choices": PRESETS})
    memory_size: int | None = field(
        default=None, metadata={"help": "Past tokens kept per memory layer.", "min": 1, "nullable": True}
    )
    memory_layers: tuple[int, ...] | None = field(
        default=None,
        metadata={"help": "Decoder layers with memory (None: preset).", "type": tuple, "min": 0, "nullable": True},
    )
    positions: str | None = field(
        default=None,
        metadata={"help": "RoPE positions of memory keys.", "choices": POSITION_SCHEMES, "nullable": True},
    )
    reading: str | None = field(
        default=None, metadata={"help": "Memory reading rule.", "choices": READINGS, "nullable": True}
    )
    window: int | None = field(default=None, metadata={"help": "Window length (reading).", "min": 0, "nullable": True})
    global_tokens: int | None = field(
        default=None, metadata={"help": "Global entries (reading).", "min": 0, "nullable": True}
    )
    topk: int | None = field(default=None, metadata={"help": "Top-k per query and head.", "min": 0, "nullable": True})
    select_size: int | None = field(
        default=None, metadata={"help": "TRAMS: tokens attended out of memory_size.", "min": 1, "nullable": True}
    )
    recent_keep: int | None = field(
        default=None, metadata={"help": "TRAMS: newest tokens always kept.", "min": 0, "nullable": True}
    )
    select_score: str = field(default="code", metadata={"help": "TRAMS metric.", "choices": SCORES})
    select_per: str = field(
        default="query_head", metadata={"help": "TRAMS selection granularity.", "choices": SELECT_PER}
    )
    fold_norm_weight: bool = field(default=True, metadata={"help": "TRAMS: fold the norm weight into the metric."})
    combine: str = field(default="joint", metadata={"help": "Memory/local combination.", "choices": COMBINES})
    memory_tokens: int | None = field(
        default=None, metadata={"help": "RMT memory tokens per segment.", "min": 0, "nullable": True}
    )
    detach_memory: bool = field(default=True, metadata={"help": "Stop gradients into stored keys/values."})

    @property
    def method(self) -> str:  # type: ignore[override]  # a preset per instance, not one string per class
        return self.preset

    def __eq__(self, other: object) -> bool:
        """Configs are equal when they select the same method with the same fields (`TRAMSConfig` included)."""
        if not isinstance(other, UniMemConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable dataclass

    @classmethod
    def cover_fields(cls, tokens: int, segment_length: int) -> dict[str, Any]:
        """A K/V store of `tokens` past tokens."""
        return {"memory_size": tokens}

    def validate(self) -> None:
        super().validate()
        s = self.settings()
        reading = s.reading
        for knob in ("window", "global_tokens", "topk", "select_size", "recent_keep"):
            users = [r for r, knobs in READING_KNOBS.items() if knob in knobs]
            if getattr(self, knob) is not None and reading not in users:
                raise ValueError(f"`{knob}` applies to reading {users}, but `reading` is {reading!r}.")
        if reading == "trams":
            if s.select_size > s.memory_size:
                raise ValueError(
                    f"`select_size` ({s.select_size}) must not exceed `memory_size` ({s.memory_size}): TRAMS attends "
                    f"to select_size tokens chosen out of the memory_size kept."
                )
            if s.recent_keep > s.select_size:
                raise ValueError(f"`recent_keep` must be in [0, `select_size`={s.select_size}], got {s.recent_keep}.")
        if reading in ("topk", "union") and s.topk > s.memory_size:
            raise ValueError(
                f"`topk` ({s.topk}) must not exceed `memory_size` ({s.memory_size}): each query reads its topk best "
                f"entries out of the memory_size kept."
            )
        if reading in ("window", "global", "topk") and getattr(s, READING_KNOBS[reading][0]) == 0:
            knob = READING_KNOBS[reading][0]
            raise ValueError(f"`{knob}` must be >= 1 for reading {reading!r}, got 0.")
        if s.positions == "compact" and reading not in COMPACT_READINGS:
            raise ValueError(
                f"`positions`='compact' needs a reading in {list(COMPACT_READINGS)} (entries shared by all queries), "
                f"got reading {reading!r}; use 'original' or 'pos0'."
            )

    def settings(self) -> UniMemSettings:
        """All knobs with the preset's defaults filled in for this `segment_length`."""
        d = _preset_defaults(self.preset, self.segment_length)

        def pick(name: str) -> Any:
            value = getattr(self, name)
            return d[name] if value is None else value

        memory_size = pick("memory_size")
        select_size = self.select_size if self.select_size is not None else max(1, memory_size // 2)
        recent_keep = self.recent_keep if self.recent_keep is not None else 3 * select_size // 4
        return UniMemSettings(
            memory_size=memory_size,
            reading=pick("reading"),
            positions=pick("positions"),
            window=pick("window"),
            global_tokens=pick("global_tokens"),
            topk=self.topk if self.topk is not None else min(d["topk"], memory_size),  # a preset k: at most the store
            select_size=select_size,
            recent_keep=recent_keep,
            memory_tokens=pick("memory_tokens"),
            layer_rule=d["layers"],
        )


@dataclass(eq=False)
class TRAMSConfig(UniMemConfig):
    """`UniMemConfig` with the `"trams"` preset: a pool of `memory_size` past K/V, `select_size` of them attended.

    TRAMS (Yu et al. 2023) is a training-free reading rule: per segment, layer, head and row, keep the newest
    `recent_keep` pool tokens and the top of a query-independent metric among the older ones (TRAMS §3.2).
    """

    preset: str = field(default="trams", metadata={"help": "Method string (preset).", "choices": ("trams",)})

    @classmethod
    def cover_fields(cls, tokens: int, segment_length: int) -> dict[str, Any]:
        """The pool holds `tokens`; the preset's share of a pool of 8 segments is attended, not half the document."""
        return {**super().cover_fields(tokens, segment_length), "select_size": 4 * segment_length}
