"""UniMem K/V memory methods as presets of one `UniMemConfig`: Transformer-XL, the Memorizing Transformer, TRAMS and
UniMix (docs/attention_memory.md); and InfLLM's training-free block retrieval (`InfLLMConfig`, docs/infllm.md)."""

from ...registry import register_method
from .config import PRESETS, TRAMSConfig, UniMemConfig
from .infllm import InfLLM
from .infllm_config import InfLLMConfig
from .method import UniMem

for _preset in PRESETS:
    _config_cls = TRAMSConfig if _preset == "trams" else UniMemConfig
    register_method(_preset, config_cls=_config_cls, method_cls=UniMem, defaults={"preset": _preset})

register_method("infllm", config_cls=InfLLMConfig, method_cls=InfLLM)

__all__ = ["InfLLM", "InfLLMConfig", "TRAMSConfig", "UniMem", "UniMemConfig"]
