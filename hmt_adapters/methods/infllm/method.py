"""Training-free block-retrieval memory (InfLLM, Xiao et al. 2024) through transformers' attention interface.

Per memory layer and execution chunk (one segment, `segment_length` tokens; docs/infllm.md):
- local part: the chunk's own keys (causal) and the stored *tail*, every token from the window start (`window`
  before the chunk, rounded down to a block boundary) at its true RoPE distance;
- global part: the attention sinks (the first `sink_tokens` of the stream) and the `topk_blocks` blocks of
  `block_size` older tokens whose representative keys best match the chunk's mean query (§3.2), every one seen at
  the same distance W = `window` (the query rotated by W, the stored pre-RoPE keys at position 0, InfLLM's
  `apply_rotary_pos_emb_one_angle(global_q, n_local)`), so RoPE never leaves its trained range; or, with
  `block_positions="ordered"` (beyond InfLLM), in document order at their own positions just before the tail;
  with `"question"`, the blocks just before the chunk that ranked them (docs/infllm.md, "Block positions");
- one softmax over both parts (§3.1, eq. 1).
A token's representative score is the attention it received from the queries of every chunk while it was local
(InfLLM's released `local_score`; §3.2 writes the same idea with raw dot products). When the tail reaches past the
next chunk's window, the sinks move out of it (once) and full blocks are cut from its front, each with one
representative key per query head: the mean of its `representative_keys` top-scored keys.

State (a flat dict, never mutated): `tail.k.{i}`/`tail.v.{i}` `[B, Hkv, R, D]` pre-RoPE K/V of the uncut tokens,
`tail.score.{i}` `[B, Hq, R]`, `tail.valid` `[B, R]`; `sink.*` the sinks once they left the window; per block b
`block.k.{i}.{b}`/`block.v.{i}.{b}` `[B, Hkv, block, D]` and `block.valid.{b}`; `repr.{i}` `[B, Hq, blocks, D]`;
with `match_score="tokens"`, `tail.ids` `[B, R]` and `block.ids.{b}` `[B, block]`, the tokens' ids; the last
question call's blocks `match` and the stream position where its chunk began, `match.at` `[1]`.
Blocks are separate entries, so a new chunk adds entries and copies nothing old: the cost per chunk is flat in
document length except the block scoring, one small matmul over the representatives.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ...attention import AttentionCall, AttentionContext, local_visibility
from ...memory.attend import additive_mask, family_sink_logits, head_mix, head_scores, parts_attention, query_slices
from ...method import Layout, MemoryMethod, Segment, State, compare_state
from . import growing
from .block_pages import BlockPages
from .config import InfLLMConfig

MATCH_NOTE = "match"  # the call's question-aware blocks, handed from `match_layer` to later layers and `update`
QUESTION_NOTE = "match.question"  # whether this segment's call ranked them afresh (a question call)
STORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # int8: quantized
# one part of a joint softmax: keys, values `[B, Hkv, n, D]` and visibility `[B, 1|Hq, 1|q, n]` (None: all visible)
Part = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` `[..., D]` as int8 and one fp32 scale per row (absmax / 127): 1/4 of fp32's bytes, error <= scale / 2."""
    scale = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
    return (x.float() / scale).round_().to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def num_blocks(state: State, layer: int) -> int:
    return state[f"repr.{layer}"].shape[2]


def _held(indices: torch.Tensor, count: int) -> torch.Tensor:
    """`[..., count]` bool: which of `count` blocks `indices` `[..., k]` names (-1 names none)."""
    flags = torch.zeros(*indices.shape[:-1], count + 1, dtype=torch.bool, device=indices.device)
    return flags.scatter_(-1, indices.where(indices >= 0, count), True)[..., :count]


class InfLLM(MemoryMethod):
    """Sinks + local window + top-k retrieved blocks per chunk and layer, one joint softmax; no parameters."""

    config_class = InfLLMConfig
    config: InfLLMConfig
    needs_attention = True
    updates_empty_rows: ClassVar[bool] = True  # rows without real tokens get masked slots (the store stays aligned)

    def __init__(self, config: InfLLMConfig, backbone):
        super().__init__(config, backbone)
        self.window, self.sinks, self.block = config.resolved(backbone.max_positions)
        layers = self.default_layers(range) if config.memory_layers is None else config.memory_layers
        self.layers = self.resolve_layers("`memory_layers`", layers)
        # the layer ranking the matched blocks: `None`, the first memory layer (layer 0, or a hybrid's first attention)
        self.match_layer = self.layers[0] if config.match_layer is None else config.match_layer
        if config.match_blocks and self.match_layer not in self.layers:
            raise ValueError(
                f"`match_layer` ({config.match_layer}) must be a memory layer, one of {list(self.layers)}."
            )
        self.pages = BlockPages()  # CPU blocks in RAM pages (block_pages.py: no heap holes between blocks)
        self.disk = None if config.store_disk is None else BlockPages(config.store_disk)
        self._tail_cache: dict[int, tuple[torch.Tensor, tuple, torch.Tensor]] = {}  # layer -> the last rotated tail
        self._kept_cache: dict[int, tuple[torch.Tensor, tuple, Part]] = {}  # layer -> the kept blocks, gathered
        # Set to a dict to record, per layer, which blocks each call retrieved (recall@k in the evaluation).
        self.trace: dict[int, list[dict[str, Any]]] | None = None

    # ---- state ---------------------------------------------------------------------------------------------

    def _store_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype of the tail, sinks and representatives (int8 quantizes blocks only)."""
        return STORE_DTYPES.get(self.config.store_dtype or "", dtype)

    def _block_kv(
        self, state: State, layer: int, index: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Block `index`'s keys and values `[B, Hkv, block, D]` on `device` in `dtype` (dequantized if int8)."""
        k, v = state[f"block.k.{layer}.{index}"], state[f"block.v.{layer}.{index}"]
        if k.dtype == torch.int8:
            k = dequantize(k.to(device), state[f"block.ks.{layer}.{index}"].to(device), dtype)
            v = dequantize(v.to(device), state[f"block.vs.{layer}.{index}"].to(device), dtype)
        return k.to(device, dtype), v.to(device, dtype)

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        b = self.backbone
        store = self._store_dtype(dtype)
        state = {
            "seen": torch.zeros(batch_size, dtype=torch.long, device=device),
            "tail.valid": torch.zeros(batch_size, 0, dtype=torch.bool, device=device),
            "sink.valid": torch.zeros(batch_size, 0, dtype=torch.bool, device=device),
        }
        if self.config.match_score == "tokens":  # the tail's token ids, kept with each block it is cut into
            state["tail.ids"] = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        for i in self.layers:
            heads, width = b.layer_kv_shape(i)
            for part in ("tail", "sink"):
                state[f"{part}.k.{i}"] = torch.zeros(batch_size, heads, 0, width, device=device, dtype=store)
                state[f"{part}.v.{i}"] = torch.zeros(batch_size, heads, 0, width, device=device, dtype=store)
            state[f"tail.score.{i}"] = torch.zeros(batch_size, b.num_heads, 0, device=device)
            state[f"repr.{i}"] = torch.zeros(batch_size, b.num_heads, 0, width, device=device, dtype=store)
        return state

    def state_differences(self, tensors: State, dtype: torch.dtype) -> list[str]:
        """The store grows: the tail, sinks, scores and representatives along their token (or block) dim, plus one
        entry per block (`block.{k,v,ks,vs}.{layer}.{b}`, `block.{valid,ids}.{b}`, b below the block count) and the
        question-aware blocks (`match`). Everything else is checked as every method's state is."""
        own = self.init_state(1, torch.device("meta"), dtype)
        growing = {name: 1 if name.endswith(("valid", "ids")) else 2 for name in own if name != "seen"}
        diffs = compare_state(own, {k: v for k, v in tensors.items() if k in own}, growing)
        reps = tensors.get(f"repr.{self.layers[0]}")
        count = 0 if reps is None else reps.shape[2]
        b = self.backbone
        want: tuple[int, ...]
        kept = {f"keep.{i}" for i in self.layers}
        for name in sorted(set(tensors) - set(own) - {"match", "match.at"} - kept):
            parts = name.split(".")
            if parts[0] == "block" and parts[1] in ("valid", "ids") and len(parts) == 3 and parts[2].isdigit():
                index, want = int(parts[2]), (self.block,)
            elif (
                len(parts) == 4
                and parts[0] == "block"
                and parts[1] in ("k", "v", "ks", "vs")
                and parts[2].isdigit()
                and int(parts[2]) in self.layers
                and parts[3].isdigit()
            ):
                index, (heads, width) = int(parts[3]), b.layer_kv_shape(int(parts[2]))
                want = (heads, self.block, 1 if parts[1] in ("ks", "vs") else width)
            else:
                diffs.append(f"tensor {name!r} only in the state")
                continue
            if index >= count:
                diffs.append(f"{name!r} names block {index}, but the state holds {count} blocks")
            elif tuple(tensors[name].shape[1:]) != want:
                diffs.append(f"{name!r} per-stream shape {tuple(tensors[name].shape[1:])} (state) vs {want} (model)")
        return diffs

    def stored(self, state: State) -> int:
        """Slots stored (closed tokens, padding included): the stream position of the next chunk's first token."""
        layer = self.layers[0]
        return state["sink.valid"].shape[1] + num_blocks(state, layer) * self.block + state["tail.valid"].shape[1]

    def block_start(self, state: State, index: int) -> int:
        """Stream position of block `index`'s first token."""
        sinks = state["sink.valid"].shape[1] if state["sink.valid"].shape[1] else self.sinks
        return sinks + index * self.block

    def span_retrieved(self, call: dict[str, Any], start: int, end: int) -> bool:
        """Whether tokens `[start, end)` were all readable by a traced call: in its local tail or chunk, in the
        sinks, or in a retrieved block (every head's choice, for per-head selection)."""
        for pos in range(start, end):
            if pos >= call["local_from"] or pos < call["sinks"]:
                continue
            block = (pos - call["sinks"]) // self.block
            if not call["selected"] or not all(block in chosen for chosen in call["selected"]):
                return False
        return True

    # ---- reading -------------------------------------------------------------------------------------------

    def _attend(self, layer: int, state: State, segment: Segment):
        def attend(call: AttentionCall, context: AttentionContext):
            return self.read(layer, state, call, context, segment)

        return attend

    def select_blocks(
        self,
        layer: int,
        state: State,
        query_global: torch.Tensor,
        query_valid: torch.Tensor,
        matched: torch.Tensor | None = None,
        kept: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Indices `[B, Hs, k]` (Hs = 1 per layer or Hkv per key/value head) of the blocks whose representative keys
        best match the chunk's mean query (InfLLM §3.2; `calc_block_topk`), or None without blocks. With `matched`
        `[B, m]` (question-aware blocks, `match_blocks`; -1: none), those come first and the ranking fills the other
        k; a row with fewer matched entries >= 0 reads fewer, its unused slots -1 (no keys, `gather_global`). With
        `kept` `[B, 1|Hs, k']` (a decoding step's question blocks, `keep_question_blocks`), the k come from the
        other blocks: the step reads `kept` besides them."""
        reps = state[f"repr.{layer}"]  # [B, Hq, N, D]
        count = reps.shape[2]
        excluded = None if kept is None else _held(kept, count)  # [B, 1|Hs, N]
        available = count - (0 if excluded is None else int(excluded.sum(-1).max()))
        k = min(self.config.topk_blocks + (0 if matched is None else matched.shape[1]), available)
        if k <= 0:
            return None
        weights = query_valid.to(query_global.dtype)[:, None, :, None]  # [B, 1, q, 1]
        mean_q = (query_global * weights).sum(2) / weights.sum(2).clamp_min(1)  # [B, Hq, D]
        scores = torch.einsum("bhd,bhnd->bhn", mean_q.float(), reps.float())  # [B, Hq, N]
        if self.config.select_per == "layer":
            scores = scores.sum(1, keepdim=True)
        else:
            kv = self.backbone.layer_kv_shape(layer)[0]
            scores = scores.view(scores.shape[0], kv, -1, count).sum(2)
        if excluded is not None:  # the question's blocks, read by a decoding step besides its own
            scores = scores.masked_fill(excluded, float("-inf"))
        if matched is None:
            return scores.topk(k, dim=-1).indices.sort(dim=-1).values
        hits = _held(matched[:, None], count)  # [B, 1, N]: matched blocks rank first (each once)
        ranked = scores.masked_fill(hits, float("inf")).topk(k, dim=-1).indices  # best first
        # k = topk_blocks + the matched entries that name a block (a repeated one: the next of InfLLM's ranking);
        # without ranking (`topk_blocks=0`, `ranks_blocks`) the distinct matched blocks alone
        named = (matched >= 0).sum(-1) if self.ranks_blocks else hits.sum(-1)[:, 0]
        reads = (self.config.topk_blocks + named)[:, None, None].clamp_max(k)  # [B, 1, 1]
        unused = torch.arange(k, device=ranked.device) >= reads
        return ranked.masked_fill(unused, -1).sort(dim=-1).values

    def match_blocks(
        self, layer: int, state: State, query_pre: torch.Tensor, query_valid: torch.Tensor
    ) -> torch.Tensor:
        """`[B, m]` the `match_blocks` blocks whose best single token best matches the mean of the chunk's last
        `match_queries` real queries, pre-RoPE on both sides, summed over heads (docs/infllm.md, "Question-aware
        blocks"). Costs one pass over the layer's stored keys per chunk, not one per token."""
        count, size = num_blocks(state, layer), self.block
        last = self._last_real(query_valid)
        weights = last.to(query_pre.dtype)[:, None, :, None]
        mean_q = (query_pre * weights).sum(2) / weights.sum(2).clamp_min(1)  # [B, Hq, D]
        batch, heads, dim = mean_q.shape
        device = query_pre.device
        keys = torch.cat([self._block_kv(state, layer, b, device, torch.float32)[0] for b in range(count)], dim=2)
        kv = keys.shape[1]
        grouped = mean_q.float().view(batch, kv, heads // kv, dim).sum(2)  # [B, Hkv, D]: a kv head's queries summed
        token = torch.einsum("bhd,bhnd->bn", grouped, keys)  # [B, N*size]
        valid = torch.cat([state[f"block.valid.{b}"] for b in range(count)], dim=1).to(device)
        token = token.masked_fill(~valid, float("-inf")).view(batch, count, size)
        return token.amax(-1).topk(min(self.config.match_blocks, count), dim=-1).indices

    def _last_real(self, mask: torch.Tensor) -> torch.Tensor:
        """`[B, L]` bool: the last `match_queries` real positions of each row of `mask` (the question)."""
        real = mask.bool()
        count = real.long().cumsum(1)
        return real & (count > count[:, -1:] - self.config.match_queries)

    def match_tokens(self, state: State, ids: torch.Tensor, mask: torch.Tensor, view_from: int = 0) -> torch.Tensor:
        """`[B, 2m]` the `match_blocks` blocks that hold the most of the question's words, each followed by the
        block after it (where a needle cut at a block boundary keeps its answer: the words asked about come first);
        `[B, 3m]` with `match_neighbours="both"`: each between the blocks before and after it (-1: none before the
        first).
        The question's words: the distinct tokens among the last `match_queries` real ones of `ids` (the tail's,
        then the call's), each weighted by its rarity (BM25's idf: a word in every block counts for nothing); a
        block scores the weights of those it holds (docs/infllm.md, "Question-aware blocks"). Token ids only: a few
        integer comparisons per stored token.

        Without `match_in_view`, the stored blocks are ranked alone and the last block's successor (in the local
        window) repeats it. With it, the text the call reads locally and its answer will still read (the rest of
        `ids` from `view_from`, in block-sized slices) is ranked with them: a passage in view that holds the
        question's words outranks a look-alike in memory, and no block is read for what is in view (-1 there, and
        for a successor not stored or already named)."""
        count, size = state[f"repr.{self.layers[0]}"].shape[2], self.block
        blocks = torch.stack([state[f"block.ids.{b}"] for b in range(count)], dim=1)  # [B, N, size]
        real = torch.stack([state[f"block.valid.{b}"] for b in range(count)], dim=1).to(blocks.device)
        pieces = blocks.masked_fill(~real, -1)  # padding slots match nothing
        last = self._last_real(mask)
        if self.config.match_in_view:
            local = mask.bool() & ~last
            local[:, :view_from] = False
            in_view = ids.to(blocks.device).masked_fill(~local.to(blocks.device), -1)
            in_view = torch.nn.functional.pad(in_view, (0, -in_view.shape[1] % size), value=-1)
            pieces = torch.cat([pieces, in_view.view(ids.shape[0], -1, size)], dim=1)  # [B, N + slices, size]
        picked = []
        for row in range(pieces.shape[0]):
            question = ids[row][last[row]].unique().to(blocks.device)  # [T]
            held = (pieces[row, :, :, None] == question).any(1)  # [P, T]: piece p holds question token t
            df = held.sum(0).float()
            idf = torch.log1p((len(held) - df + 0.5) / (df + 0.5)) * (df > 0)
            top = (held.float() @ idf).topk(min(self.config.match_blocks, len(held)))
            ratio = self.config.match_min_ratio
            if ratio is not None:  # a block scoring under that share of the best is not read (-1)
                picked.append(top.indices.masked_fill(top.values < ratio * top.values[:1], -1))
            else:
                picked.append(top.indices)
        best = torch.stack(picked)  # [B, min(m, pieces)]
        both = self.config.match_neighbours == "both"
        unread = best < 0
        if not self.config.match_in_view:
            after = (best + 1).clamp_max(count - 1).masked_fill(unread, -1)  # the last's successor is in the window
            if not both:
                return torch.stack([best, after], dim=-1).flatten(1)
            return torch.stack([torch.where(best > 0, best - 1, -1), best, after], dim=-1).flatten(1)  # -1: none
        offsets = (-1, 0, 1) if both else (0, 1)
        around = torch.stack([(best + d).masked_fill(unread, -1) for d in offsets], dim=-1).flatten(1)
        named = around.tolist()
        for row in named:  # each block once: a later repeat names none
            row[:] = [j if 0 <= j < count and j not in row[:i] else -1 for i, j in enumerate(row)]
        return torch.tensor(named, dtype=around.dtype, device=around.device)

    def gather_global(
        self, layer: int, state: State, chosen: torch.Tensor | None, device: torch.device, sinks: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The global keys: sinks (unless `sinks=False`) then the chosen blocks. Keys, values `[B, Hkv, sinks + k *
        block, D]` (on `device`, in the store's dtype) and validity `[B, 1|Hkv, sinks + k * block]`. Each block moves
        and is dequantized once per call, whatever rows or heads chose it, and is copied once, into its place (a
        decoding step gathers a few thousand keys per layer: copying them twice, into the blocks' run and then after
        the sinks, was a fifth of its time)."""
        sinks_k, sinks_v, sinks_m = state[f"sink.k.{layer}"], state[f"sink.v.{layer}"], state["sink.valid"][:, None]
        if not sinks:
            sinks_k, sinks_v, sinks_m = sinks_k[:, :, :0], sinks_v[:, :, :0], sinks_m[..., :0]
        sinks_k, sinks_v, sinks_m = sinks_k.to(device), sinks_v.to(device), sinks_m.to(device)
        if chosen is None:
            return sinks_k, sinks_v, sinks_m
        batch, heads_sel, count = chosen.shape
        sinks_k, sinks_v = sinks_k.expand(batch, -1, -1, -1), sinks_v.expand(batch, -1, -1, -1)
        sinks_m = sinks_m.expand(batch, -1, -1)
        _, kv_heads, n_sinks, dim = sinks_k.shape
        width = n_sinks + count * self.block
        named = sorted(set(chosen.flatten().tolist()) - {-1})
        blocks = {j: self._block_kv(state, layer, j, device, sinks_k.dtype) for j in named}
        flags = {j: state[f"block.valid.{j}"].to(device) for j in named}
        if -1 in chosen:  # an unused slot (`select_blocks`): no keys
            blank = torch.zeros(batch, kv_heads, self.block, dim, device=device, dtype=sinks_k.dtype)
            blocks[-1], flags[-1] = (blank, blank), torch.zeros(batch, self.block, device=device, dtype=torch.bool)
        keys = torch.empty(batch, kv_heads, width, dim, device=device, dtype=sinks_k.dtype)
        values = torch.empty_like(keys)
        valid = torch.empty(batch, heads_sel, width, device=device, dtype=torch.bool)
        for b in range(batch):
            for h in range(heads_sel):
                idx = chosen[b, h].tolist()
                heads = slice(None) if heads_sel == 1 else h  # one choice for every head, or head h's own
                torch.cat([sinks_k[b, heads], *(blocks[j][0][b, heads] for j in idx)], dim=-2, out=keys[b, heads])
                torch.cat([sinks_v[b, heads], *(blocks[j][1][b, heads] for j in idx)], dim=-2, out=values[b, heads])
                torch.cat([sinks_m[b, 0], *(flags[j][b] for j in idx)], out=valid[b, h])
        return keys, values, valid

    def read(
        self,
        layer: int,
        state: State,
        call: AttentionCall,
        context: AttentionContext,
        segment: Segment | None = None,
    ):
        """The layer's attention output `([B, q, Hq, D], None)` over global (sinks + retrieved blocks, at distance
        W) and local (tail at true distances + the chunk, causal) keys, one softmax. `segment`: the chunk being read;
        its padding queries do not count in the chunk's mean query, and `match_score="tokens"` ranks by its ids."""
        query = call.query  # [B, Hq, q, D], rotated at the window positions of this call
        batch, heads, q_len, dim = query.shape
        dtype = query.dtype
        scaling = call.scaling if call.scaling is not None else dim**-0.5
        stored = self.stored(state)
        tail_k, tail_v = state[f"tail.k.{layer}"], state[f"tail.v.{layer}"]
        tail_valid = state["tail.valid"]
        tail_len = tail_k.shape[2]
        # with `block_positions="question"` the tail's positions depend on the blocks read: rotated below, once
        question_positions = self.config.block_positions == "question"
        tail_rot = None if question_positions else self._rotated_tail(layer, state, context, query)
        own = local_visibility(call.attention_mask, q_len, call.key.shape[2], query.device)  # [B|1, 1|Hq, q, k]
        # key parts (keys, values, visibility [B, 1|Hq, 1|q, n] or None where every query sees every key) of one
        # softmax: global (sinks + retrieved blocks, read by the query rotated by W), then tail and own (local)
        tail_rest = (tail_v.to(dtype), self._tail_visibility(tail_valid, call, q_len))
        own_part: Part = (call.key, call.value, None if bool(own.all()) else own)
        has_blocks = num_blocks(state, layer) > 0
        chosen, query_global, global_part, kept_part = None, None, None, None
        if state["sink.valid"].shape[1] or has_blocks:
            # global part: the query rotated by W, stored keys unrotated (position 0): every entry at distance W
            rope = context.call_rope(call)
            query_pre = context.pre_rope(call, query) if rope is not None else query
            query_global = self._rotate_by(context, query_pre, self.window)
            query_valid = torch.ones(batch, q_len, dtype=torch.bool, device=query.device)
            if segment is not None and segment.mask.shape[1] == q_len:  # the segment's own call (not decoding)
                query_valid = segment.mask.bool().to(query.device)
            matched, kept = None, None
            question = self._question_call(q_len, segment)  # else a decoding step: it reuses the question's blocks
            if self.config.match_blocks and has_blocks and layer >= self.match_layer:
                matched = self._matched(layer, state, context, query_pre, query_valid, segment, question)
            if self.config.keep_question_blocks and not question:
                kept = context.notes.get(f"keep.{layer}", state.get(f"keep.{layer}"))  # see `keep_question_blocks`
            chosen = self.select_blocks(layer, state, query_global, query_valid, matched, kept)
            if self.config.keep_question_blocks and chosen is not None and question:
                context.notes[f"keep.{layer}"] = chosen  # this chunk ends in the question: its decoding keeps these
            if kept is not None and self.config.block_positions == "window":
                kept_part = self._kept_part(layer, state, kept, query.device, dtype, heads)
            elif kept is not None:  # ordered: every block at its place in document order, the kept ones too
                chosen = kept if chosen is None else torch.cat([kept, chosen], dim=-1).sort(dim=-1).values
            g_k, g_v, g_m = self.gather_global(layer, state, chosen, query.device)
            g_mask = self._global_visibility(g_m, heads)
            g_k = g_k.to(dtype)
            if self.config.block_positions == "ordered":  # docs/infllm.md, "Block positions"
                # sinks, then the blocks in document order (`select_blocks` sorts them), just before the tail's
                # first position (-tail_len): each key at its own position, read by the query at its own
                count = g_k.shape[2]
                at = torch.arange(-tail_len - count, -tail_len, device=query.device)
                g_k = context.rotate_at(g_k, at.expand(g_k.shape[0], count), query)
                query_global = query
            elif self.config.block_positions == "question":  # docs/infllm.md, "Block positions"
                # the sinks before the tail, the blocks (in document order) just before the question's chunk: the
                # tail's tokens older than that chunk move back by the blocks' length
                count, sinks = g_k.shape[2], state["sink.valid"].shape[1]
                placed, recent = count - sinks, self._question_tokens(state, question, tail_len)
                at = torch.cat(
                    [
                        torch.arange(-tail_len - placed - sinks, -tail_len - placed, device=query.device),
                        torch.arange(-recent - placed, -recent, device=query.device),
                    ]
                )
                g_k = context.rotate_at(g_k, at.expand(g_k.shape[0], count), query)
                tail_rot = self._rotated_tail(layer, state, context, query, shift=placed, recent=recent)
                query_global = query
            global_part = (g_k, g_v.to(dtype), g_mask)
        if tail_rot is None:  # `"question"` positions and no block read: the tail where it is
            tail_rot = self._rotated_tail(layer, state, context, query)
        local_parts: list[Part] = [(tail_rot, *tail_rest), own_part]
        global_parts = [part for part in (kept_part, global_part) if part is not None]
        softcap, sink_logits = call.kwargs.get("softcap"), family_sink_logits(call)
        received_needed = layer in context.record_layers and self.ranks_blocks
        if sink_logits is None and self._one_kernel(
            query, query_global, global_parts, local_parts, softcap, received_needed
        ):
            out = parts_attention(query, global_parts + local_parts, scaling)
        else:
            out = self._sliced_read(
                layer,
                context,
                query,
                query_global,
                global_parts,
                local_parts,
                scaling,
                softcap,
                received_needed,
                sink_logits,
            )
        if layer in context.record_layers and not received_needed:  # closed segment, no block ranked: zeros for
            # `update` whichever read ran, so the state does not depend on the path (`ranks_blocks`)
            zeros = torch.zeros(batch, heads, tail_len + q_len, device=query.device)
            context.notes[layer] = (zeros[..., :tail_len], zeros[..., tail_len:])
        if self.trace is not None:
            positions = call.kwargs.get("position_ids")
            last = int(positions.max()) if positions is not None else call.key.shape[2] - 1
            sinks_moved = state["sink.valid"].shape[1] > 0
            self.trace.setdefault(layer, []).append(
                {
                    "end": stored + last + 1,
                    "blocks": num_blocks(state, layer),
                    "sinks": self.sinks if sinks_moved else 0,
                    "local_from": stored - tail_len,
                    "selected": self._traced(chosen, kept if kept_part is not None else None),
                }
            )
        return out.transpose(1, 2).contiguous(), None

    @property
    def ranks_blocks(self) -> bool:
        """Whether chunks rank blocks by their representatives (`topk_blocks` > 0): only then is the attention
        each local token received scored while it is in the window (InfLLM §3.2). With `topk_blocks=0` a chunk
        reads the question-aware blocks alone, and its attention runs in one fused kernel (`parts_attention`)."""
        return self.config.topk_blocks > 0

    @staticmethod
    def _one_kernel(
        query: torch.Tensor,
        query_global: torch.Tensor | None,
        global_parts: list[Part],
        local_parts: list[Part],
        softcap: float | None,
        received_needed: bool,
    ) -> bool:
        """Whether this call's joint softmax can run as one SDPA call (`parts_attention`): one query reads every
        part (`block_positions="ordered"`, or no global part), no gradient flows, no logit soft-cap, and nobody
        needs the attention each local key received (InfLLM's representative scores, `ranks_blocks`)."""
        one_query = not global_parts or query_global is query
        parts = global_parts + local_parts
        grad = torch.is_grad_enabled() and (query.requires_grad or any(k.requires_grad for k, _, _ in parts))
        return one_query and not grad and not softcap and not received_needed

    def _sliced_read(
        self,
        layer: int,
        context: AttentionContext,
        query: torch.Tensor,
        query_global: torch.Tensor | None,
        global_parts: list[Part],
        local_parts: list[Part],
        scaling: float,
        softcap: float | None,
        received_needed: bool,
        sink_logits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The joint softmax (eq. 1) a slice of queries at a time through explicit matmuls, `[B, Hq, q, D]`: the
        global parts read by `query_global`, the local ones by `query`. With `received_needed`, hands `update` the
        attention each local key received, summed over the queries (`context.notes[layer]`). `sink_logits`: the
        family's sink logits (`memory.attend.family_sink_logits`), one more entry of the softmax per head, with no
        value."""
        batch, heads, q_len, _ = query.shape
        tail_len = local_parts[0][0].shape[2]
        keys = sum(part[0].shape[2] for part in global_parts + local_parts)
        outs, received = [], []
        for rows in query_slices(q_len, batch * heads * keys):  # the logits a slice of queries at a time
            sliced = [(query[:, :, rows], part) for part in local_parts]
            if global_parts:
                assert query_global is not None  # computed with the global part
                sliced[:0] = [(query_global[:, :, rows], part) for part in global_parts]
            probs = self._probabilities(sliced, rows, scaling, softcap, sink_logits)
            mixed = [head_mix(p.to(query.dtype), part[1]) for p, (_, part) in zip(probs, sliced)]
            outs.append(torch.stack(mixed).sum(0))
            if received_needed:  # attention each local key received, summed over queries
                received.append(torch.cat([p.sum(2) for p in probs[-2:]], dim=-1))  # [B, Hq, tail + own]
        if received_needed:  # closed segment: hand the local attention received to `update`
            total = received[0] if len(received) == 1 else torch.stack(received).sum(0)
            context.notes[layer] = (total[..., :tail_len], total[..., tail_len:][..., -q_len:])
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    @staticmethod
    def _traced(chosen: torch.Tensor | None, kept: torch.Tensor | None) -> list[list[int]]:
        """The blocks a call read (`trace`), per head selection of the first row: its own and those it kept."""
        parts = [t[0] for t in (chosen, kept) if t is not None]
        if not parts:
            return []
        selections = max(t.shape[0] for t in parts)
        return [
            sorted({j for t in parts for j in t[min(h, t.shape[0] - 1)].tolist()} - {-1}) for h in range(selections)
        ]

    def _kept_part(
        self, layer: int, state: State, kept: torch.Tensor, device: torch.device, dtype: torch.dtype, heads: int
    ) -> Part:
        """The blocks a decoding step keeps from the question (`keep_question_blocks`) as one softmax part, gathered
        once per question and layer: every step of an answer reads the same ones (the same `kept` tensor, in the
        state or the open segment's notes), and gathering them again for each generated token was a third of the
        step's extra cost over InfLLM's own decoding (docs/infllm.md, "Decoding keeps the question's blocks")."""
        key = (device, dtype, heads)
        part = self._cached(self._kept_cache, layer, kept, key)
        if part is None:
            k, v, m = self.gather_global(layer, state, kept, device, sinks=False)
            part = (k.to(dtype), v.to(dtype), self._global_visibility(m, heads))
            self._kept_cache[layer] = (kept, key, part)
        return part

    @staticmethod
    def _cached(
        cache: dict[int, tuple[torch.Tensor, tuple, Any]], layer: int, source: torch.Tensor, key: tuple
    ) -> Any:
        """What `cache` holds for `layer` if it was built from this very `source` tensor (identity, not value: a
        new segment replaces a state's tensors) under the same `key`; else None."""
        hit = cache.get(layer)
        return hit[2] if hit is not None and hit[0] is source and hit[1] == key else None

    def _question_tokens(self, state: State, question: bool, tail_len: int) -> int:
        """How many of the tail's last tokens belong to the question's chunk (`block_positions="question"`): none
        on the question's own call (the chunk is the call), else those from the last question call's first token
        on (`match.at`, its stream position), at most the whole tail."""
        if question or "match.at" not in state:
            return 0
        return max(0, min(tail_len, self.stored(state) - int(state["match.at"][0])))

    def _rotated_tail(
        self,
        layer: int,
        state: State,
        context: AttentionContext,
        query: torch.Tensor,
        shift: int = 0,
        recent: int = 0,
    ) -> torch.Tensor:
        """The tail's keys rotated at their true positions relative to the chunk's window (it starts at window
        position 0), all but the last `recent` moved back by `shift` (`block_positions="question"`), once per
        state, layer and layout: every decoding step from one state reads the same tail, and rotating the whole
        window again for each generated token was most of a decoded token's cost."""
        tail_k = state[f"tail.k.{layer}"]
        stored, tail_len = self.stored(state), tail_k.shape[2]
        key = (tail_k._version, stored, query.dtype, query.device, query.shape[0], shift, recent)
        hit = self._cached(self._tail_cache, layer, tail_k, key)
        if hit is not None:
            return hit
        tail_pos = torch.arange(stored - tail_len, stored, device=query.device) - stored
        if shift:
            tail_pos[: tail_len - recent] -= shift
        rotated = context.rotate_at(tail_k.to(query.dtype), tail_pos.expand(query.shape[0], tail_len), query)
        if not rotated.requires_grad:  # a tail in a graph (training through the backbone) is not kept across calls
            self._tail_cache[layer] = (tail_k, key, rotated)
        return rotated

    @staticmethod
    def _probabilities(
        sliced: list[tuple[torch.Tensor, Part]],
        rows: slice,
        scaling: float,
        softcap: float | None,
        sink_logits: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """One fp32 softmax (eq. 1) over the logits of every part, `(query rows, (keys, values, visibility))`, each
        masked by its visibility (None: all visible; a query that sees nothing gets a uniform row, no NaN); the
        probabilities come back per part. Without gradients every part's logits are written into one buffer
        (`head_scores(out=)`) and normalised by one `torch.softmax` over its rows, three passes where a softmax
        over separate parts takes six (docs/cost.md); when training through the backbone, autograd's softmax over
        their concatenation. `sink_logits` `[Hq]`: one more logit per head after the parts (GPT-OSS), left out of the
        probabilities returned."""
        masks = [mask if mask is None or mask.shape[-2] == 1 else mask[..., rows, :] for _, (_, _, mask) in sliced]
        widths = [k.shape[2] for _, (k, _, _) in sliced]
        low = torch.finfo(torch.float32).min
        first = sliced[0][0]
        sink = None if sink_logits is None else sink_logits.float().view(1, -1, 1, 1).expand(*first.shape[:-1], 1)
        if torch.is_grad_enabled() and any(t.requires_grad for q, (k, _, _) in sliced for t in (q, k)):
            logits = [head_scores(q * scaling, k).float() for q, (k, _, _) in sliced]
            if softcap:  # Gemma2's logit soft-capping, as the family's own attention applies it
                logits = [torch.tanh(part / softcap) * softcap for part in logits]
            logits = [part if mask is None else part.masked_fill(~mask, low) for part, mask in zip(logits, masks)]
            probs = torch.softmax(torch.cat(logits + ([] if sink is None else [sink]), dim=-1), dim=-1)
            return list(probs.split(widths + [probs.shape[-1] - sum(widths)], dim=-1))[: len(widths)]
        buffer = first.new_empty(*first.shape[:-1], sum(widths) + (sink is not None), dtype=torch.float32)
        split = widths + [buffer.shape[-1] - sum(widths)]  # a sink's column last, outside every part
        parts = buffer.split(split, dim=-1)
        for (q, (k, _, _)), part in zip(sliced, parts):
            if q.dtype == torch.float32:
                head_scores(q * scaling, k, out=part)
            else:
                part.copy_(head_scores(q * scaling, k))
        if softcap:
            buffer.div_(softcap).tanh_().mul_(softcap)
        if sink is not None:  # after the soft-cap, which the family applies to q.k only
            buffer[..., -1:] = sink
        for part, mask in zip(parts, masks):
            if mask is not None:  # plus 0 / lowest (the same logits): a broadcast `masked_fill_` costs ~7x an `add_`
                part.add_(additive_mask(mask, torch.float32))
        torch.ops.aten._softmax.out(buffer, -1, False, out=buffer)  # in place: each row is read before it is written
        return list(buffer.split(split, dim=-1))[: len(widths)]

    @staticmethod
    def _tail_visibility(tail_valid: torch.Tensor, call: AttentionCall, q_len: int) -> torch.Tensor | None:
        """Which stored local tokens each query sees, `[B|1, 1, 1|q, tail]` (None: all): the real ones, and in a
        sliding-window layer (Mistral, Gemma2's local layers) only those its own window reaches, as the layer's own
        mask does for the chunk's keys; so inside sinks + window the model stays the bare backbone."""
        tail_len = tail_valid.shape[1]
        visible = None if bool(tail_valid.all()) else tail_valid[:, None, None, :]
        reach = call.kwargs.get("sliding_window")
        if reach is None or not tail_len:
            return visible
        # query i stands (keys before it in this call) + i slots after the tail's end; tail slot j, tail_len - j before
        offset = call.key.shape[2] - q_len + tail_len
        distance = torch.arange(q_len, device=tail_valid.device)[:, None] + offset
        near = (distance - torch.arange(tail_len, device=tail_valid.device)[None, :] < reach)[None, None]
        if bool(near.all()):
            return visible
        return near if visible is None else visible & near

    def _matched(
        self,
        layer: int,
        state: State,
        context: AttentionContext,
        query_pre: torch.Tensor,
        query_valid: torch.Tensor,
        segment: Segment | None,
        question: bool,
    ) -> torch.Tensor | None:
        """The question-aware blocks of this call: ranked afresh in `match_layer` on a question call
        (`_question_call`), else those of the last one (the open segment's first call, then the last closed
        segment's, kept in the state). Later layers of the call read the same blocks. `match_score="tokens"` ranks
        by the ids of `segment` and of the tail before it (the last `match_queries` real ones)."""
        if layer == self.match_layer:
            if question or (MATCH_NOTE not in context.notes and "match" not in state):  # or nothing to reuse
                context.notes[QUESTION_NOTE] = question
                if self.config.match_score == "tokens":
                    assert segment is not None  # `_question_call` raised without one
                    ids, mask = segment.ids, segment.mask.bool()
                    view_from = 0  # see `match_in_view`
                    if "tail.ids" in state:  # the question's words may be in the text just before this call
                        ids = torch.cat([state["tail.ids"].to(ids.device), ids], dim=1)
                        mask = torch.cat([state["tail.valid"].to(mask.device), mask], dim=1)
                        # what the answer's decoding still reads once the next segment opens (its window starts
                        # at most W before it): the tail's first tokens leave it
                        view_from = max(0, state["tail.ids"].shape[1] + self.config.segment_length - self.window)
                    context.notes[MATCH_NOTE] = self.match_tokens(state, ids, mask, view_from)
                else:
                    context.notes[MATCH_NOTE] = self.match_blocks(layer, state, query_pre, query_valid)
            elif MATCH_NOTE not in context.notes:
                context.notes[MATCH_NOTE] = state["match"]
        return context.notes.get(MATCH_NOTE)

    def _question_call(self, q_len: int, segment: Segment | None) -> bool:
        """Whether this call is the question's: it ranks the question-aware blocks afresh and keeps what it
        retrieved for the calls after it (`match_blocks`, `keep_question_blocks`); the others are decoding steps,
        which reuse those of the last question call (this open segment's first call, else the last closed
        segment's, kept in the state) and, with `keep_question_blocks`, read its retrieved blocks besides their own
        top-k. `match_score="attention"`: a call of at least `match_queries` queries (a decoding step's query is
        not the question). `"tokens"`: a segment's own call of more than one token (a question asked after the
        document is one, however short: its words and those read just before it are the question; a decoding step
        that opens a segment is one token)."""
        if self.config.match_score == "tokens":
            if segment is None:
                raise ValueError("match_score='tokens' ranks blocks by the segment's token ids; none given.")
            return segment.mask.shape[1] == q_len > 1
        return q_len >= self.config.match_queries

    def _rotate_by(self, context: AttentionContext, x: torch.Tensor, distance: int) -> torch.Tensor:
        """`x` `[B, H, q, D]` (pre-RoPE) rotated at position `distance` (unchanged without RoPE)."""
        return context.rotate_at(x, torch.full((x.shape[0], 1), distance, device=x.device, dtype=torch.long), x)

    def _global_visibility(self, valid: torch.Tensor, heads: int) -> torch.Tensor | None:
        """A global part's visibility `[B, 1|Hq, 1, n]` from its validity `[B, 1|Hkv, n]` (None: every key real)."""
        return None if bool(valid.all()) else self._head_mask(valid, heads)[:, :, None, :]

    def _head_mask(self, mask: torch.Tensor, heads: int) -> torch.Tensor:
        """`[B, 1|Hkv, G]` -> `[B, 1|Hq, G]` (query head h reads key/value head h // group)."""
        if mask.shape[1] in (1, heads):
            return mask
        return mask.repeat_interleave(heads // mask.shape[1], dim=1)

    def prepare(self, segment: Segment, state: State, plan) -> Layout:
        context = AttentionContext(
            reads={i: self._attend(i, state, segment) for i in self.layers},
            record_layers=frozenset(self.layers),
            rotary=self.backbone.rotary,
        )
        return Layout(attention=context)

    # ---- writing -------------------------------------------------------------------------------------------

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        """Append the chunk to the tail (with the attention each token received), then move the sinks out once
        they left the next chunk's window and cut full blocks from the tail's front (their representatives)."""
        context = layout.attention
        length = segment.ids.shape[1]
        out = dict(state)
        mask = segment.mask.bool()
        out["seen"] = state["seen"] + mask.long().sum(1)
        out["tail.valid"] = torch.cat([state["tail.valid"], mask], dim=1)
        if "tail.ids" in state:
            out["tail.ids"] = torch.cat([state["tail.ids"], segment.ids.to(state["tail.ids"].device)], dim=1)
        for i in self.layers:
            k, v = context.records[i]
            k, v = k[:, :, -length:], v[:, :, -length:]
            store = state[f"tail.k.{i}"].dtype
            received_tail, received_own = context.notes[i]
            out[f"tail.k.{i}"] = torch.cat([state[f"tail.k.{i}"], k.detach().to(store)], dim=2)
            out[f"tail.v.{i}"] = torch.cat([state[f"tail.v.{i}"], v.detach().to(store)], dim=2)
            score = state[f"tail.score.{i}"] + received_tail.detach().float()
            out[f"tail.score.{i}"] = torch.cat([score, received_own.detach().float()], dim=2)
        if MATCH_NOTE in context.notes:  # the blocks this segment matched stay the decoding steps' (see `_matched`)
            out["match"] = context.notes[MATCH_NOTE]
        if self.config.block_positions == "question" and context.notes.get(QUESTION_NOTE):  # `_question_tokens`
            out["match.at"] = torch.tensor([self.stored(state)], device=state["seen"].device)
        for i in self.layers:  # and the blocks it retrieved, with `keep_question_blocks` (see `_question_call`)
            if f"keep.{i}" in context.notes:
                out[f"keep.{i}"] = context.notes[f"keep.{i}"]
        stored = self.stored(out)
        window_from = stored - self.window  # the next chunk's window start
        if (
            out["sink.valid"].shape[1] == 0
            and self.sinks
            and window_from >= self.sinks
            and stored - out["tail.valid"].shape[1] == 0
        ):
            self._move(out, "sink", self.sinks)
        if out["sink.valid"].shape[1] or not self.sinks:
            while stored - out["tail.valid"].shape[1] + self.block <= window_from:
                self._cut_block(out)
        return out

    # `_move` and `_cut_block` rewrite entries of `update`'s own copy of the state in place: one copy of the mapping
    # per chunk, not one per block cut (at 1M tokens the mapping holds ~1M entries, and the copies freed at every
    # cut fragmented the C heap by gigabytes; docs/infllm.md, "A million tokens").

    def _move(self, out: State, part: str, count: int) -> None:
        """The first `count` tail tokens become the sinks."""
        tail_valid = out["tail.valid"]
        out[f"{part}.valid"], out["tail.valid"] = tail_valid[:, :count], tail_valid[:, count:]
        if "tail.ids" in out:  # sinks are never matched: their ids are not kept
            out["tail.ids"] = out["tail.ids"][:, count:]
        for i in self.layers:
            for kv in ("k", "v"):
                tail = out[f"tail.{kv}.{i}"]
                out[f"{part}.{kv}.{i}"], out[f"tail.{kv}.{i}"] = tail[:, :, :count], tail[:, :, count:]
            out[f"tail.score.{i}"] = out[f"tail.score.{i}"][:, :, count:]

    def _store_block(self, out: State, layer: int, index: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Block `index` of `layer` into `out`: quantized for the int8 store, on `store_device`; on the CPU in
        RAM pages, or in a memory-mapped file once the blocks before it fill `store_ram_gb` (`store_disk`)."""
        device = torch.device(self.config.store_device or keys.device)
        parts = {"k": keys, "v": values}
        if self.config.store_dtype == "int8":
            (parts["k"], parts["ks"]), (parts["v"], parts["vs"]) = quantize(keys), quantize(values)
        block_bytes = (parts["k"].nbytes + parts["v"].nbytes) * len(self.layers)  # one block of every memory layer
        past_budget = (index + 1) * block_bytes > (self.config.store_ram_gb or 0) * 1e9
        for name, x in parts.items():
            if device.type != "cpu" or x.requires_grad:
                x = x.to(device)
            elif self.disk is not None and past_budget and name in ("k", "v"):  # int8 scales (1/32) stay in RAM
                x = self.disk.place(x)
            else:
                x = self.pages.place(x)
            out[f"block.{name}.{layer}.{index}"] = x

    def _keep(self, x: torch.Tensor) -> torch.Tensor:
        """A copy of `x` with storage of its own: in a RAM page on the CPU (block_pages.py), else a clone."""
        return self.pages.place(x) if x.device.type == "cpu" and not x.requires_grad else x.clone()

    def _cut_block(self, out: State) -> None:
        """The first `block_size` tail tokens become a block with one representative key per query head."""
        size, heads = self.block, self.backbone.num_heads
        index = num_blocks(out, self.layers[0])
        tail_valid = out["tail.valid"]
        valid = tail_valid[:, :size]
        # a block's flags and ids in pages too (own storage, as the keys'): a view of the tail would keep each
        # chunk's tail buffer alive, and a small allocation per block pins holes in the C heap
        out[f"block.valid.{index}"], out["tail.valid"] = self._keep(valid), tail_valid[:, size:]
        if "tail.ids" in out:
            tail_ids = out["tail.ids"]
            out[f"block.ids.{index}"] = self._keep(tail_ids[:, :size])
            out["tail.ids"] = tail_ids[:, size:]
        for i in self.layers:
            k, v, tail_score = out[f"tail.k.{i}"], out[f"tail.v.{i}"], out[f"tail.score.{i}"]
            block_k, block_v = k[:, :, :size].clone(), v[:, :, :size].clone()  # own storage: the tail is freed
            self._store_block(out, i, index, block_k, block_v)
            out[f"tail.k.{i}"], out[f"tail.v.{i}"] = k[:, :, size:], v[:, :, size:]
            score = tail_score[:, :, :size].masked_fill(~valid[:, None, :], float("-inf"))
            out[f"tail.score.{i}"] = tail_score[:, :, size:]
            top = score.topk(self.config.representative_keys, dim=-1).indices  # [B, Hq, r]
            per_head = block_k.float().repeat_interleave(heads // block_k.shape[1], dim=1)  # [B, Hq, block, D]
            chosen = per_head.gather(2, top[..., None].expand(-1, -1, -1, per_head.shape[-1]))
            rep = chosen.mean(2)[:, :, None]  # [B, Hq, 1, D]
            out[f"repr.{i}"] = growing.append(out[f"repr.{i}"], rep, dim=2)  # amortised: not a copy per block
