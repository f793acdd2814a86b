"""UniMem K/V memory methods as presets of one `UniMemConfig`: Transformer-XL, the Memorizing Transformer, TRAMS and
UniMix (docs/attention_memory.md). InfLLM, which the UniMem paper also describes as a composition of its dimensions,
shares no class with them and has its own folder (`methods/infllm/`)."""

from ...registry import register_method
from .config import PRESETS, TRAMSConfig, UniMemConfig
from .method import UniMem

# What an untrained instance of each preset does to the backbone (its config defaults), quoted by the zero-shot tables.
UNTRAINED = {
    "transformer_xl": (
        "no trainable parameters: every layer joins the stored past keys/values to its own (one softmax, true "
        "RoPE distances)"
    ),
    "memorizing_transformer": (
        "no trainable parameters (combine='joint', no gate): the middle and last layer read the top 32 stored "
        "keys by q.k, at position 0"
    ),
    "trams": (
        "no trainable parameters: every layer attends to a query-independent selection from the pool (newest 3/4 "
        "kept, the rest by the key-norm metric)"
    ),
    "unimix": (
        "window + 4 global + top-4 stored keys in the upper half (no trainable parameters there), plus 40 RMT "
        "memory tokens at the input that start as random embeddings and carry untrained hidden states"
    ),
}

for _preset in PRESETS:
    _config_cls = TRAMSConfig if _preset == "trams" else UniMemConfig
    register_method(
        _preset, config_cls=_config_cls, method_cls=UniMem, defaults={"preset": _preset}, untrained=UNTRAINED[_preset]
    )

__all__ = ["TRAMSConfig", "UniMem", "UniMemConfig"]
