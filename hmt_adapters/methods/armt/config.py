"""`ARMTConfig`: an associative memory per decoder layer, read as a residual and written by the delta rule (ARMT,
Rodkin et al. 2024), written from every token of a segment."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config import MemoryConfig

FEATURE_MAPS = ("dpfp", "elu")


@dataclass
class ARMTConfig(MemoryConfig):
    """Associative memory per layer (ARMT, Rodkin et al. 2024, §3): a matrix `A` and a normaliser `z` per memory layer.

    Before a memory layer every token reads `A^T phi(q) / (z . phi(q))`, `q = W_q n(h)`, and adds `W_o` of it to its
    residual stream; after the segment the layer's outputs write `A += sum_t beta_t (v_t - v_old_t) phi(k_t)^T`,
    `z += sum_t phi(k_t)` (the delta rule, ARMT eq. 2-4), `k = W_k n(h)`, `v = W_v n(h)`, `beta = sigmoid(w_b n(h))`,
    `n` a parameter-free RMS norm. `W_o` starts at zero, so the wrapped model is the bare backbone until it is trained.

    Args:
        segment_length (`int`, defaults to 512): Tokens per segment.
        key_size (`int`, defaults to 32): Width of the key and query projections before the feature map.
        feature_map (`str`, defaults to `"dpfp"`): `phi`: `"dpfp"` (ARMT's deterministic parameter-free projection,
            `2 * dpfp_order * key_size` features) or `"elu"` (`elu + 1`, `key_size` features).
        dpfp_order (`int`, defaults to 3): DPFP's `nu`.
        memory_layers (`list[int]`, *optional*): Decoder layers with a memory; `None`: all.
        read_init_std (`float`, defaults to 0.0): Standard deviation of `W_o`'s initial weights; 0: the wrapped model
            is the bare backbone before training.
    """

    method = "armt"

    segment_length: int = field(default=512, metadata={"help": "Tokens per segment.", "min": 1})
    key_size: int = field(default=32, metadata={"help": "Key/query width before the feature map.", "min": 1})
    feature_map: str = field(default="dpfp", metadata={"help": "Feature map phi.", "choices": FEATURE_MAPS})
    dpfp_order: int = field(default=3, metadata={"help": "DPFP's nu.", "min": 1})
    memory_layers: tuple[int, ...] | None = field(
        default=None,
        metadata={"help": "Decoder layers with memory (None: all).", "type": tuple, "min": 0, "nullable": True},
    )
    read_init_std: float = field(default=0.0, metadata={"help": "Init std of the read's output projection.", "min": 0})

    @property
    def features(self) -> int:
        """Width of `phi(k)`: the rows of each layer's `A`."""
        return 2 * self.dpfp_order * self.key_size if self.feature_map == "dpfp" else self.key_size
