"""`ElasticMemoryConfig`: Elastic Memory (HiPPO-LegS compressed keys/values with polynomial sampling)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config import MemoryConfig
from .sampling import STRATEGIES


@dataclass
class ElasticMemoryConfig(MemoryConfig):
    """Past pre-RoPE keys and values of one layer compressed into `N` Legendre coefficients, read back as memory
    tokens by polynomial sampling ("Towards Compressive and Scalable Recurrent Memory", Alg. 1). No trainable
    parameters: every matrix is fixed.

    Args:
        hippo_order (`int`, defaults to 540):
            `N`, Legendre coefficients per channel; the state is `[batch, kv_heads, N, head_dim]` for keys and for
            values. 540 is the paper's "1x" memory (1080..8640 for 2x..16x, Table 3).
        memory_tokens (`int`, *optional*):
            `L_mem`, memory tokens reconstructed per segment; `None` means `hippo_order` (not in the paper: a square
            readout keeps every coefficient, more points add no information).
        memory_layers (`list[int]`, *optional*):
            0-based decoder layers with elastic memory; `None` means one layer at 3/4 depth (layer
            `ceil(3n/4) - 1`: the 9th of 12, like the paper's).
        sampling (`str`, defaults to `"uniform"`):
            Polynomial sampling: `"uniform"` (Elastic_uni) or `"exponential"` (Elastic_exp, dense near the present).
            Only the readout depends on it, so it can be changed after training (`from_pretrained(...,
            sampling=...)` or `model.memory.set_sampling(...)`): the paper's "uni-exp" and "exp-uni" (Table 5).
        exp_alpha (`float`, *optional*):
            Fixed decay `alpha` in (0, 1) of exponential sampling; `None` chooses it per segment so that the newest
            sample lies `max(1, t/N)` tokens before the present (not in the paper; docs/elastic_memory.md).
        matrix_cache_mb (`int`, defaults to 64):
            MiB kept of the fixed block and readout matrices (the paper's precomputed bank). Training revisits the
            same positions and reuses them; a stream never does, so this bounds its memory. 0 rebuilds every
            matrix (about 20 ms per 512-token segment at `N` = 540, one CPU thread).
    """

    method = "elastic"

    hippo_order: int = field(default=540, metadata={"help": "HiPPO order N (Legendre coefficients).", "min": 1})
    memory_tokens: int | None = field(
        default=None,
        metadata={"help": "Memory tokens L_mem per segment (None = hippo_order).", "min": 1, "nullable": True},
    )
    memory_layers: tuple[int, ...] | None = field(
        default=None,
        metadata={
            "help": "Decoder layers with memory (None = one layer at 3/4 depth).",
            "type": tuple,
            "min": 0,
            "nullable": True,
        },
    )
    sampling: str = field(default="uniform", metadata={"help": "Polynomial sampling strategy.", "choices": STRATEGIES})
    exp_alpha: float | None = field(
        default=None,
        metadata={
            "help": "Exponential sampling decay in (0, 1) (None = per segment).",
            "type": float,
            "nullable": True,
        },
    )
    matrix_cache_mb: int = field(
        default=64, metadata={"help": "MiB of fixed HiPPO matrices kept for reuse.", "min": 0}
    )

    def validate(self) -> None:
        super().validate()
        if self.exp_alpha is not None and not 0 < self.exp_alpha < 1:
            raise ValueError(f"`exp_alpha` must lie in the open interval (0, 1) or be None, got {self.exp_alpha!r}.")

    @property
    def readout_tokens(self) -> int:
        """`L_mem` with its default applied."""
        return self.memory_tokens if self.memory_tokens is not None else self.hippo_order
