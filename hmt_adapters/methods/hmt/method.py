"""HMT: `[P ; sensory ; segment ; P]` per segment, P retrieved from cached memory embeddings (input level).

Per segment n (HMT §3.1-3.3, Eqs. 1-5):
1. representation encoding: `S_n` = backbone output at the trailing T of `[T ; j query tokens ; T]`;
2. memory search: `P_n = softmax(S_n W_q (C W_k)^T / sqrt(d_h)) C` over the last N memory embeddings C;
3. the main pass over `[P_n ; E(last k tokens of n-1) ; E(x_n) ; P_n]`;
4. `M_n` = output at the trailing P slot, pushed into the cache.
"""

from __future__ import annotations

from typing import Any

import torch

from ...memory import append_tail, learned_tokens, newest_or_init, push_fifo, trim_empty_columns
from ...method import Layout, MemoryMethod, Segment, State
from .config import HMTConfig
from .retrieval import MemoryRetrieval


class HMT(MemoryMethod):
    """Hierarchical Memory Transformer over any backbone that takes `inputs_embeds`."""

    config_class = HMTConfig
    writes_from_window = True  # `update` reads the window's last hidden states
    config: HMTConfig
    window_slot_fields = ("sensory_length",)

    def __init__(self, config: HMTConfig, backbone):
        super().__init__(config, backbone)
        dim, std = backbone.embed_dim, backbone.embedding_std()
        self.memory_init = learned_tokens(1, dim, std)  # M_init: the prompt of the first segment
        if config.use_retrieval:
            self.summary_prompt = learned_tokens(1, dim, std)  # T
            self.retrieval = MemoryRetrieval(dim, config.retrieval_dim or dim)  # W_q, W_k

    @property
    def _causal_query(self) -> bool:
        return self.config.use_retrieval and self.config.query_source == "previous_suffix"

    @property
    def _tail_width(self) -> int:
        """Token ids kept from earlier segments: the sensory tokens and, for the causal query, the j query tokens."""
        return max(self.config.sensory_length, self.config.summary_tokens if self._causal_query else 0)

    def layout_fixed_after(self) -> int:
        return 0 if self._causal_query or not self.config.use_retrieval else self.config.summary_tokens

    def window_slots(self) -> int:
        return 2 + self.config.sensory_length

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        slots = self.config.memory_window if self.config.use_retrieval else 1
        width = self._tail_width
        return {
            "cache": torch.zeros(batch_size, slots, self.backbone.embed_dim, device=device, dtype=dtype),
            "cache_valid": torch.zeros(batch_size, slots, device=device, dtype=torch.bool),
            "tail_ids": torch.zeros(batch_size, width, device=device, dtype=torch.long),
            "tail_mask": torch.zeros(batch_size, width, device=device, dtype=torch.long),
        }

    # ---- representation encoding (batched over segments) ------------------------------------------------------

    def plan(self, segments: list[Segment], state: State) -> list[Any]:
        """`S_n` `[B, d]` for every segment that retrieves, from one backbone call per query width."""
        if not self.config.use_retrieval:
            return [None] * len(segments)
        j = self.config.summary_tokens
        tail_ids, tail_mask = state["tail_ids"], state["tail_mask"]
        sources: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for seg in segments:
            if seg.index == 0:
                sources.append(None)  # nothing cached yet: P_0 = M_init
            elif self._causal_query:
                sources.append(trim_empty_columns(tail_ids[:, -j:], tail_mask[:, -j:]))
            else:
                sources.append((seg.ids[:, :j], seg.mask[:, :j]))
            if self._causal_query:
                tail_ids, tail_mask = append_tail(tail_ids, tail_mask, seg.ids, seg.mask, self._tail_width)
        return self._summaries(sources)

    def _summaries(self, sources: list[tuple[torch.Tensor, torch.Tensor] | None]) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = [None] * len(sources)
        by_width: dict[int, list[int]] = {}
        present = {n: src for n, src in enumerate(sources) if src is not None and src[0].shape[1] > 0}
        for n, src in present.items():
            by_width.setdefault(src[0].shape[1], []).append(n)
        for group in by_width.values():
            ids = torch.cat([present[n][0] for n in group])  # [G*B, w]
            mask = torch.cat([present[n][1] for n in group])
            prompt = self.summary_prompt.to(self.backbone.model.dtype).unsqueeze(0).expand(ids.shape[0], -1, -1)
            ones = mask.new_ones(ids.shape[0], 1)
            window = torch.cat([prompt, self.backbone.embed(ids), prompt], dim=1)  # [T ; tokens ; T]
            window_mask = torch.cat([ones, mask, ones], dim=1)
            summary = self.backbone.body(window, window_mask)[:, -1]  # output at the trailing T
            for n, s in zip(group, summary.chunk(len(group))):
                out[n] = s
        return out

    # ---- per segment --------------------------------------------------------------------------------------------

    def prepare(self, segment: Segment, state: State, plan: Any) -> Layout:
        cache, valid = state["cache"], state["cache_valid"]
        if plan is not None:
            prompt = self.retrieval(plan, cache, valid)[:, None]  # P_n [B, 1, d]
            init = self.memory_init.to(prompt.dtype).unsqueeze(0).expand_as(prompt)
            prompt = torch.where(valid.any(-1).view(-1, 1, 1), prompt, init)
        else:
            prompt = newest_or_init(cache, valid, self.memory_init, 1)  # stage 1: P_n = M_{n-1}
        k = self.config.sensory_length
        sens_ids, sens_mask = (
            trim_empty_columns(state["tail_ids"][:, -k:], state["tail_mask"][:, -k:]) if k else (None, None)
        )
        ones = segment.mask.new_ones(prompt.shape[0], 1)
        prefix, prefix_mask = prompt, ones
        if sens_ids is not None and sens_mask is not None and sens_ids.shape[1]:
            prefix = torch.cat([prompt, self.backbone.embed(sens_ids).to(prompt.dtype)], dim=1)
            prefix_mask = torch.cat([ones, sens_mask.to(ones.dtype)], dim=1)
        return Layout(prefix=prefix, prefix_mask=prefix_mask, suffix=prompt, suffix_mask=ones)

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        cache, valid = push_fifo(state["cache"], state["cache_valid"], hidden[:, -1:])  # M_n at the trailing P
        tail_ids, tail_mask = append_tail(
            state["tail_ids"], state["tail_mask"], segment.ids, segment.mask, self._tail_width
        )
        return {"cache": cache, "cache_valid": valid, "tail_ids": tail_ids, "tail_mask": tail_mask}
