"""UniMem K/V memory methods as presets of one `UniMemConfig`: Transformer-XL, the Memorizing Transformer, TRAMS and
UniMix (UniMem spec §9.7)."""

from ...registry import register_method
from .config import PRESETS, TRAMSConfig, UniMemConfig
from .method import UniMem

for _preset in PRESETS:
    _config_cls = TRAMSConfig if _preset == "trams" else UniMemConfig
    register_method(_preset, config_cls=_config_cls, method_cls=UniMem, defaults={"preset": _preset})

__all__ = ["TRAMSConfig", "UniMem", "UniMemConfig"]
