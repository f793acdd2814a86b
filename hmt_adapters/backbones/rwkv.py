"""RWKV-4: a recurrent backbone that ignores `attention_mask`, so padded batches are refused."""

from __future__ import annotations

from typing import Any

import torch

from .base import RecurrentAdapter


class RwkvAdapter(RecurrentAdapter):
    """Runs without carried RWKV state (HF writes that state in place, which breaks backward)."""

    model_types = ("rwkv",)
    continues_cache = False  # HF's RWKV state continuation does not reproduce a full read: generation re-reads

    def check_mask(self, mask: torch.Tensor) -> None:
        if not bool(mask.bool().all()):
            raise ValueError(
                "RWKV ignores `attention_mask`, so padded tokens would enter its recurrence; pass batches without "
                "padding (all-ones `attention_mask`) or use batch size 1."
            )

    def body_kwargs(self, mask: torch.Tensor, position_ids: torch.Tensor | None) -> dict[str, Any]:
        return {"use_cache": False}

    def body_cached(self, inputs_embeds, mask, position_ids, cache, **kwargs):
        self.check_mask(mask)
        out = self.body_module(inputs_embeds=inputs_embeds, state=cache, use_cache=True)
        return out.last_hidden_state, out.state
