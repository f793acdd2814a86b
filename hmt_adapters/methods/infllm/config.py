"""`InfLLMConfig`: training-free block-retrieval memory (InfLLM, Xiao et al. 2024), a UniMem composition.

UniMem's four dimensions (docs/infllm.md): management = every past token kept, the first `sink_tokens` as attention
sinks and the rest cut into blocks of `block_size` once they leave the local window; writing = the layer's own
pre-RoPE keys/values (direct, no parameters); reading = sinks + the local window + the block (and its neighbours)
sharing the most rare words with the chunk's last tokens, in document order (the defaults), or InfLLM's `topk_blocks`
blocks whose representative keys best match the chunk's mean query at distance W (`InfLLMConfig.paper()`);
injection = one joint softmax in every memory layer.
Fields left `None` scale with the backbone's context (`max_position_embeddings`) when the method is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...config import MemoryConfig

STORE_DTYPES = ("float32", "bfloat16", "float16", "int8")
SELECT_PER = ("layer", "kv_head")
BLOCK_POSITIONS = ("window", "ordered", "question")
MATCH_SCORES = ("attention", "tokens")
MATCH_NEIGHBOURS = ("after", "both")
# InfLLM's released settings for 8k-32k models (Xiao et al. 2024, §4.1 and `config/*-inf-llm.yaml`).
INFLLM_WINDOW, INFLLM_SINKS, INFLLM_BLOCK = 4096, 128, 128
# The largest window `window=None` scales to with blocks at their own positions (`max_window`): a needle read from a
# block is then W + its place before the tail away; SmolLM2-135M read passkeys at 32k 10/10 at 512, 6/10 at 1024 and
# did not at 4096 (docs/infllm.md, "The default reader"). Files written before `max_window` existed scaled to 2048.
ORDERED_WINDOW, LEGACY_ORDERED_WINDOW = 512, 2048
# InfLLM as published (§3.2, §4.1): ranked blocks alone, at distance W, ranked anew for every decoded token.
# The defaults until 2026-12-03 less `keep_question_blocks` (docs/infllm.md, "The default reader").
PAPER = dict(
    topk_blocks=16,
    match_blocks=0,
    match_score="attention",
    match_neighbours="after",
    block_positions="window",
    keep_question_blocks=False,
    max_window=INFLLM_WINDOW,
)


@dataclass
class InfLLMConfig(MemoryConfig):
    """Block-retrieval memory over a frozen model: no trainable parameter (InfLLM, Xiao et al. 2024, §3).

    The defaults are the reader measured right on every needle task of docs/infllm.md ("The default reader"): each
    chunk reads the sinks, the local window and the one stored block (with its neighbours) that shares the most
    rare words with the chunk's last tokens (the question, when the prompt ends in one), in document order.
    InfLLM as published (ranked blocks by representative keys, at one distance): `InfLLMConfig.paper()`.

    Args:
        segment_length (`int`, defaults to 512):
            The execution chunk (InfLLM's `exc_block_size`): tokens read per backbone call; blocks are selected
            once per chunk with its mean query (§3.2).
        window (`int`, *optional*):
            Local window W (InfLLM's `n_local`): each chunk attends to its own tokens and the stored tokens from W
            before its start (rounded down to a block boundary) at their true RoPE distances. `None`: with
            `block_positions="ordered"` (or `"question"`) a quarter of the backbone's context, with `"window"`
            InfLLM's half of it, at most `max_window` either way.
        max_window (`int`, *optional*, defaults to 512):
            The largest window `window=None` scales to (unused when `window` is set): 512 keeps a block read under
            `"ordered"` positions within the distances SmolLM2-135M reads a passkey from (docs/infllm.md, "The
            default reader"); `InfLLMConfig.paper()` sets InfLLM's 4096. `None`: the rule of adapter files written
            before this field (2048 with ordered positions, 4096 with `"window"`), which is how those files load.
        sink_tokens (`int`, *optional*):
            The first tokens of the stream kept as attention sinks (InfLLM's `n_init`, §3.1 "initial tokens"),
            read by every chunk once they left the window. `None`: 128, at most 1/32 of the context.
        block_size (`int`, *optional*): Tokens per memory block (§3.2). `None`: 128, at most 1/32 of the context.
        representative_keys (`int`, defaults to 4):
            Keys that represent a block (`repr_topk`, §3.2): per query head, the block's tokens that received the
            most local attention while they were in the window; their keys are averaged.
        topk_blocks (`int`, defaults to 0): Blocks retrieved per chunk and memory layer (`topk`, §3.2; 16 in
            InfLLM). `0`: none ranked; with `match_blocks` the question-aware blocks alone (each once), the
            representatives are not scored, and with `block_positions="ordered"` every chunk's attention runs in
            one SDPA call.
        select_per (`str`, defaults to `"layer"`):
            `"layer"`: one block ranking per layer, the score summed over all heads (InfLLM); `"kv_head"`: one
            ranking per key/value head (the heads of its group summed).
        memory_layers (`list[int]`, *optional*): Layers that read memory; `None`: all.
        store_dtype (`str`, *optional*):
            Dtype of the stored keys/values: `"float32"`, `"bfloat16"` or `"float16"` (`None`: the model's), or
            `"int8"`: blocks quantized per token and head (absmax scale, 1/4 of fp32; the tail and sinks stay in
            the model's dtype), dequantized when a chunk reads them.
        store_device (`str`, *optional*):
            Where blocks are kept, e.g. `"cpu"` for a model on a GPU: only the blocks a chunk retrieves travel to the
            model's device (`None`: the model's device). A runtime switch: not saved with the adapter.
        store_disk (`str`, *optional*):
            A directory: blocks past the first `store_ram_gb` GB are copied into memory-mapped files there, so a
            document larger than RAM fits (`None`: every block in memory). The files are unlinked once mapped, so
            nothing is left behind. Needs the blocks on the CPU. A runtime switch: not saved with the adapter.
        store_ram_gb (`float`, *optional*):
            With `store_disk`, the GB of blocks (all memory layers, after `store_dtype`) kept in RAM before the rest
            go to disk (`None`: 0, every block on disk). A runtime switch: not saved with the adapter.
        match_blocks (`int`, defaults to 1):
            Beyond InfLLM, for documents with look-alike passages: this many more blocks per chunk, chosen in layer
            `match_layer` by their best single token's match with the mean of the chunk's last `match_queries`
            queries (pre-RoPE, heads summed), and read by that layer and every later one besides the `topk_blocks`
            of InfLLM's ranking. Layer 0's keys are close to the token embeddings, so its best token matches the
            question's words (a name) where block representatives see only which blocks are unusual
            (docs/infllm.md, "Question-aware blocks"). 0: InfLLM's ranking alone (with `match_score="attention"`).
        match_layer (`int`, *optional*): The memory layer whose stored keys rank the `match_blocks` (with
            `match_score="tokens"`: the first layer that reads them). `None`: the first memory layer (layer 0, or a
            hybrid's first attention layer).
        match_score (`str`, defaults to `"tokens"`):
            How the `match_blocks` are ranked. `"attention"`: a block's best single key in `match_layer` against
            the mean of the chunk's last `match_queries` queries (above). `"tokens"`: the words the question and
            a block share: the distinct token ids of the last `match_queries` tokens read, each weighted by its
            rarity among the stored blocks (BM25's idf), summed over those a block holds; each matched block is
            read with its neighbours (`match_neighbours`: by default the block after it, so `2 * match_blocks`
            blocks). Exact where layer 0's keys are only close to token identity
            (docs/infllm.md, "Question-aware blocks"). Stores one token id per stored token.
        match_neighbours (`str`, defaults to `"both"`):
            With `match_score="tokens"`: the blocks read around each matched one. `"after"`: the block after it
            (a needle whose question words come first, cut at a block boundary, keeps its answer there). `"both"`:
            the blocks before and after it, `3 * match_blocks` blocks: a needle whose words come on both sides of
            its answer ("The pass key is X. Remember it. X is the pass key.") is matched on the half holding more
            of them, which can be the second (docs/infllm.md, "Question-aware blocks").
        match_min_ratio (`float`, *optional*):
            With `match_score="tokens"`: of the `match_blocks` best-scoring blocks, read only those scoring at least
            this share of the best one (with their neighbours), so that `match_blocks` is a ceiling: a question
            whose answers lie in several passages that share its words (RULER's multi-value and multi-query
            needles) reads all of them, one whose words one passage holds reads that one. `None`: every one of the
            `match_blocks` (docs/infllm.md, "Question-aware blocks").
        match_in_view (`bool`, defaults to `False`):
            With `match_score="tokens"`: rank the text the call reads locally (and its answer will still read once
            the next segment opens) with the stored blocks, so no block is read for words the window already holds:
            a look-alike in memory then does not come in beside the passage asked about (on `niah_multikey` the
            asked-for needle in the window lost to a stored distractor with its template). Off: the stored blocks
            are ranked alone (the measured recipes; docs/infllm.md, "Question-aware blocks").
        match_queries (`int`, defaults to 32): The chunk's last queries averaged into the matching query; a call
            with fewer queries (a decoding step) keeps the blocks of the last call with more (`match_blocks`,
            `keep_question_blocks`). With `match_score="tokens"`: the question's length in tokens, the call's and
            those read before it; every segment's own call of more than one token ranks afresh (a question asked
            from a document's `memory_state`, however short), decoding steps keep its blocks.
        keep_question_blocks (`bool`, defaults to `False`):
            Beyond InfLLM: each decoding step reads, besides its own top-k (InfLLM ranks blocks anew for every
            generated token), the blocks the chunk that ended in the question retrieved in the same layer, so an
            answer copied over several tokens keeps its source in view (docs/infllm.md, "Decoding keeps the
            question's blocks"). Only calls of fewer than `match_queries` queries change: reading a document in
            chunks (its perplexity) is the same either way. `False`: InfLLM's per-token ranking alone (with
            `match_blocks` it did better on look-alike needles: a step reads half the blocks); adapter files written
            before this field read as `False`.
        block_positions (`str`, defaults to `"ordered"`):
            Where the sinks and retrieved blocks sit for RoPE. `"window"`: every one of their keys at distance W
            from every query (InfLLM §3.1), so a block's tokens carry no order among themselves. `"ordered"`
            (beyond InfLLM): sinks, then the retrieved blocks in document order, each key at its own position just
            before the local tail, as if the document were those tokens followed by the window; a passage cut at
            the window's edge then reads in order across the cut (docs/infllm.md, "Block positions"). Distances
            grow by the tokens read, so `window` + ... + the retrieved tokens must fit the backbone's context.
            `"question"`: as `"ordered"`, but the retrieved blocks sit just before the chunk that ranked them (the
            question's, while its answer is decoded), the older tail before them: the evidence nearest the
            question, the window's text further away (docs/infllm.md, "Block positions").
    """

    segment_length: int = field(default=512, metadata={"help": "Execution chunk (tokens per call).", "min": 1})
    window: int | None = field(default=None, metadata={"help": "Local window W.", "min": 1, "nullable": True})
    max_window: int | None = field(
        default=ORDERED_WINDOW,
        metadata={"help": "Largest window window=None scales to.", "min": 1, "nullable": True, "absent": None},
    )
    sink_tokens: int | None = field(
        default=None, metadata={"help": "Attention-sink tokens (InfLLM n_init).", "min": 0, "nullable": True}
    )
    block_size: int | None = field(
        default=None, metadata={"help": "Tokens per memory block.", "min": 1, "nullable": True}
    )
    representative_keys: int = field(default=4, metadata={"help": "Representative keys per block.", "min": 1})
    topk_blocks: int = field(default=0, metadata={"help": "Blocks retrieved per chunk and layer.", "min": 0})
    select_per: str = field(default="layer", metadata={"help": "Block ranking granularity.", "choices": SELECT_PER})
    memory_layers: tuple[int, ...] | None = field(
        default=None,
        metadata={"help": "Decoder layers with memory (None: all).", "type": tuple, "min": 0, "nullable": True},
    )
    store_dtype: str | None = field(
        default=None, metadata={"help": "Dtype of stored keys/values.", "choices": STORE_DTYPES, "nullable": True}
    )
    store_device: str | None = field(
        default=None,
        metadata={
            "help": "Device of the stored blocks (None: the model's).",
            "type": str,
            "nullable": True,
            "runtime": True,
        },  # where this process keeps the store, not part of the adapter: not saved
    )
    store_disk: str | None = field(
        default=None,
        metadata={
            "help": "Directory of memory-mapped blocks past store_ram_gb.",
            "type": str,
            "nullable": True,
            "runtime": True,
        },
    )
    store_ram_gb: float | None = field(
        default=None,
        metadata={
            "help": "GB of blocks kept in RAM before store_disk.",
            "type": float,
            "min": 0,
            "nullable": True,
            "runtime": True,
        },
    )
    match_blocks: int = field(default=1, metadata={"help": "Extra blocks by best-token match per chunk.", "min": 0})
    match_layer: int | None = field(
        default=None,
        metadata={"help": "Layer whose keys rank the matched blocks (None: the first).", "min": 0, "nullable": True},
    )
    keep_question_blocks: bool = field(
        default=False, metadata={"help": "Decoding steps also read the question chunk's blocks.", "absent": False}
    )
    match_queries: int = field(default=32, metadata={"help": "Last queries averaged for the match.", "min": 1})
    match_min_ratio: float | None = field(
        default=None,
        metadata={
            "help": "Read a token-matched block only if it scores this share of the best (None: all).",
            "type": float,
            "min": 0,
            "max": 1,
            "nullable": True,
            "absent": None,
        },
    )
    match_in_view: bool = field(
        default=False, metadata={"help": "Token match also ranks the text in view.", "absent": False}
    )
    match_score: str = field(
        default="tokens",
        metadata={"help": "Ranking of the matched blocks.", "choices": MATCH_SCORES, "absent": "attention"},
    )
    match_neighbours: str = field(
        default="both",
        metadata={"help": "Blocks read around a token-matched one.", "choices": MATCH_NEIGHBOURS, "absent": "after"},
    )
    block_positions: str = field(
        default="ordered",
        metadata={"help": "RoPE positions of sinks and blocks.", "choices": BLOCK_POSITIONS, "absent": "window"},
    )

    @classmethod
    def paper(cls, **fields: Any) -> InfLLMConfig:
        """InfLLM as published (Xiao et al. 2024, §3.2): the `topk_blocks=16` blocks best ranked by representative
        keys, read at distance W, ranked anew for every decoded token; `fields` change any of it."""
        return cls(**{**PAPER, **fields})

    @property
    def blocks_per_match(self) -> int:
        """Blocks read for each of the `match_blocks`: itself, and with `match_score="tokens"` its neighbours."""
        if self.match_score != "tokens":
            return 1
        return 3 if self.match_neighbours == "both" else 2

    @property
    def method(self) -> str:  # type: ignore[override]  # a preset per instance, not one string per class
        return "infllm"

    def validate(self) -> None:
        super().validate()
        if self.store_device is not None:
            try:
                torch.device(self.store_device)
            except (RuntimeError, TypeError) as err:
                raise ValueError(
                    f"`store_device` must name a torch device (e.g. 'cpu', 'cuda:0') or be None, got "
                    f"{self.store_device!r}."
                ) from err
        if self.store_ram_gb is not None and self.store_disk is None:
            raise ValueError(
                f"`store_ram_gb` ({self.store_ram_gb}) is the RAM kept before blocks go to "
                "`store_disk`, which is None: set `store_disk` to a directory, or leave `store_ram_gb` unset."
            )
        if (
            self.store_disk is not None
            and self.store_device is not None
            and torch.device(self.store_device).type != "cpu"
        ):
            raise ValueError(
                f"`store_disk` keeps blocks in CPU memory-mapped files, but `store_device` is {self.store_device!r}: "
                "use store_device='cpu' (or None with a model on the CPU)."
            )
        if self.match_in_view and self.match_score != "tokens":
            raise ValueError(
                f"`match_in_view` ranks the text in view by its token ids, which only match_score='tokens' keeps; "
                f"got match_score={self.match_score!r}."
            )
        if self.match_min_ratio is not None and self.match_score != "tokens":
            raise ValueError(
                f"`match_min_ratio` ({self.match_min_ratio}) compares the blocks' token-match scores, which only "
                f"match_score='tokens' computes; got match_score={self.match_score!r}."
            )
        if self.match_neighbours != "after" and self.match_score != "tokens":
            raise ValueError(
                f"`match_neighbours` ({self.match_neighbours!r}) says which blocks are read around a block matched by "
                f"its token ids, which only match_score='tokens' does; got match_score={self.match_score!r}."
            )
        if self.match_score != "attention" and not self.match_blocks:
            raise ValueError(
                f"`match_score` ({self.match_score!r}) ranks the `match_blocks`, which is 0: set match_blocks >= 1, "
                "or match_score='attention' (InfLLM as published, every field: InfLLMConfig.paper())."
            )
        if (
            self.match_blocks
            and self.memory_layers is not None
            and self.match_layer is not None
            and self.match_layer not in self.memory_layers
        ):
            raise ValueError(
                f"`match_layer` ({self.match_layer}) must be one of `memory_layers` {list(self.memory_layers)}: "
                "the matched blocks are ranked by that layer's stored keys."
            )
        block = self.block_size
        if block is not None and self.representative_keys > block:
            raise ValueError(
                f"`representative_keys` ({self.representative_keys}) must not exceed `block_size` ({block}): a "
                f"block is represented by some of its own keys."
            )

    def resolved(self, max_positions: int | None) -> tuple[int, int, int]:
        """`(window, sink_tokens, block_size)` with `None` fields scaled to a context of `max_positions` tokens
        (InfLLM's 4096 / 128 / 128 where the context allows); a `ValueError` when the local part of a chunk
        (window + the larger of sinks and block + chunk) would read RoPE distances past the context."""
        context = max_positions or 2 * INFLLM_WINDOW
        ordered = self.block_positions in ("ordered", "question")
        if self.window is not None:
            window = self.window
        else:
            cap = self.max_window or (LEGACY_ORDERED_WINDOW if ordered else INFLLM_WINDOW)
            window = max(1, min(cap, context // (4 if ordered else 2)))
        sinks = self.sink_tokens if self.sink_tokens is not None else min(INFLLM_SINKS, context // 32)
        block = self.block_size if self.block_size is not None else max(1, min(INFLLM_BLOCK, context // 32))
        if self.representative_keys > block:  # only a scaled block can be smaller (`validate` checks a set one)
            raise ValueError(
                f"`representative_keys` ({self.representative_keys}) must not exceed the block size ({block}: "
                f"`block_size` unset, scaled to the backbone's {context} positions as context // 32); set "
                f"`block_size` >= {self.representative_keys} or `representative_keys` <= {block}."
            )
        span = window + max(sinks, block) + self.segment_length
        if max_positions is not None and span > max_positions:
            raise ValueError(
                f"window ({window}) + max(sink_tokens ({sinks}), block_size ({block})) + segment_length "
                f"({self.segment_length}) = {span} exceeds the backbone's {max_positions} positions: local keys would "
                f"be read at distances it was not trained on; lower `window` or `segment_length`."
            )
        if ordered and max_positions is not None:
            # a decoding step with `keep_question_blocks` reads its own blocks and the question's (`InfLLM._kept`)
            matched = self.match_blocks * self.blocks_per_match
            blocks = (self.topk_blocks + matched) * (2 if self.keep_question_blocks else 1)
            needed = span + sinks + blocks * block
            if needed > max_positions:
                raise ValueError(
                    f"block_positions={self.block_positions!r} puts sink_tokens ({sinks}) + up to {blocks} blocks "
                    f"of {block} tokens (topk_blocks {self.topk_blocks} + {matched} matched"
                    f"{', twice with keep_question_blocks' if self.keep_question_blocks else ''}) before the local "
                    f"span ({span}): {needed} positions, past the backbone's {max_positions}; lower `topk_blocks` "
                    "or `window`, or use block_positions='window'."
                )
        return window, sinks, block
