"""`UniMemConfig`: K/V memory methods as UniMem compositions (management, writing, reading, injection)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config import MemoryConfig

PRESETS = ("transformer_xl",)
POSITION_SCHEMES = ("original", "compact", "pos0")
READINGS = ("all",)


@dataclass
class UniMemConfig(MemoryConfig):
    """A per-layer store of past keys/values read through a patched attention (UniMem §2, eq. 9).

    Args:
        preset (`str`, defaults to `"transformer_xl"`):
            The method string this configuration was built from; each preset sets the other fields' defaults.
        memory_size (`int`, defaults to 512):
            Past tokens kept per memory layer (FIFO; memory management).
        memory_layers (`list[int]`, *optional*):
            0-based decoder layers that read memory (injection); `None` means every layer.
        positions (`str`, defaults to `"original"`):
            RoPE positions of memory keys relative to the segment's queries: `"original"` (true stream distances),
            `"compact"` (read entries contiguous just before the segment, TRAMS code), `"pos0"` (every memory key at
            position 0, UniMem code). Learned-position backbones keep the positions their keys were computed at.
        reading (`str`, defaults to `"all"`):
            Which stored entries each query sees (memory reading).
        detach_memory (`bool`, defaults to `True`):
            Store keys/values without gradient (stop-gradient, as Transformer-XL and the Memorizing Transformer).
    """

    preset: str = field(default="transformer_xl", metadata={"help": "Method string (preset).", "choices": PRESETS})
    memory_size: int = field(default=512, metadata={"help": "Past tokens kept per memory layer.", "min": 1})
    memory_layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "Decoder layers with memory (None = all).", "type": tuple, "min": 0, "nullable": True}
    )
    positions: str = field(
        default="original", metadata={"help": "RoPE positions of memory keys.", "choices": POSITION_SCHEMES}
    )
    reading: str = field(default="all", metadata={"help": "Memory reading rule.", "choices": READINGS})
    detach_memory: bool = field(default=True, metadata={"help": "Stop gradients into stored keys/values."})

    @property
    def method_name(self) -> str:
        return self.preset
