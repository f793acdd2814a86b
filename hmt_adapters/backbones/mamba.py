"""Mamba, Mamba2, Falcon-Mamba: state-space backbones; memory enters through input embeddings only."""

from __future__ import annotations

from typing import Any

import torch

from ..compat import cache_kwargs, output_cache
from .base import RecurrentAdapter


def _gather_slots(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    index = order if x.dim() == 2 else order.unsqueeze(-1).expand(-1, -1, x.shape[-1])
    return x.gather(1, index)


class MambaAdapter(RecurrentAdapter):
    """Each segment starts from a fresh SSM state (the backbone reads each segment on its own, HMT §3.1).

    A zero input still moves an SSM's state, so masked slots inside a window (absent sensory tokens, padding in a
    segment) are moved to the front of the row, where Mamba's own left-padding handling makes them a no-op.
    """

    model_types = ("mamba", "mamba2", "falcon_mamba")
    continues_multi_token = False  # HF's multi-token scan restarts from a zero SSM state

    def body_kwargs(self, mask: torch.Tensor, position_ids: torch.Tensor | None) -> dict[str, Any]:
        return {"attention_mask": mask, "use_cache": False}

    def body(self, inputs_embeds: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        order = torch.argsort(mask.long(), dim=1, stable=True)  # padding first, real slots in their order
        if bool((order == torch.arange(mask.shape[1], device=mask.device)).all()):
            return super().body(inputs_embeds, mask, **kwargs)
        hidden = super().body(_gather_slots(inputs_embeds, order), _gather_slots(mask, order), **kwargs)
        return _gather_slots(hidden, torch.argsort(order, dim=1))

    def body_cached(self, inputs_embeds, mask, position_ids, cache, **kwargs):
        if cache is None:  # fresh window: masked slots first, as in `body`
            order = torch.argsort(mask.long(), dim=1, stable=True)
            out = self.body_module(
                inputs_embeds=_gather_slots(inputs_embeds, order),
                attention_mask=_gather_slots(mask, order),
                use_cache=True,
            )
            return (
                _gather_slots(out.last_hidden_state, torch.argsort(order, dim=1)),
                output_cache(out, state_space=True),
            )
        out = self.body_module(inputs_embeds=inputs_embeds, use_cache=True, **cache_kwargs(cache, state_space=True))
        return out.last_hidden_state, output_cache(out, state_space=True)
