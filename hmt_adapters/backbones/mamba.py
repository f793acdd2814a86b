"""Mamba: a state-space backbone; memory enters through input embeddings only."""

from __future__ import annotations

from typing import Any

import torch

from .base import RecurrentAdapter


class MambaAdapter(RecurrentAdapter):
    """Each segment starts from a fresh SSM state (HMT spec §2.8); padding is zeroed by Mamba's own mask."""

    model_types = ("mamba",)

    def body_kwargs(self, mask: torch.Tensor, position_ids: torch.Tensor | None) -> dict[str, Any]:
        return {"attention_mask": mask, "use_cache": False}
