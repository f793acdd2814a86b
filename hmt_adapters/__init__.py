"""hmt-adapters: long-context memory (HMT, RMT, TRAMS, Elastic Memory, MELODI, UniMem) for any HF causal LM."""

from . import compat, methods  # noqa: F401  (methods: registers every method)
from .ask import ask
from .auto import AutoMemoryModelForCausalLM
from .config import MemoryConfig
from .methods.armt import ARMTConfig
from .methods.elastic import ElasticMemoryConfig
from .methods.hmt import HMTConfig
from .methods.infllm import InfLLMConfig
from .methods.melodi import MelodiConfig
from .methods.rmt import RMTConfig
from .methods.unimem import TRAMSConfig, UniMemConfig
from .model import MemoryModel, wrap_with_memory
from .outputs import MemoryCausalLMOutput
from .registry import available_methods, register_method
from .state import MemoryState
from .version import __version__

__all__ = [
    "ARMTConfig",
    "AutoMemoryModelForCausalLM",
    "ElasticMemoryConfig",
    "HMTConfig",
    "MelodiConfig",
    "MemoryCausalLMOutput",
    "MemoryConfig",
    "MemoryModel",
    "MemoryState",
    "RMTConfig",
    "InfLLMConfig",
    "TRAMSConfig",
    "UniMemConfig",
    "__version__",
    "ask",
    "available_methods",
    "register_method",
    "wrap_with_memory",
]

compat.warn_if_untested()
compat.accept_in_pipelines(MemoryModel.__name__)
