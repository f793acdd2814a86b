"""Elastic Memory: HiPPO-LegS compression of past keys/values, read back by polynomial sampling."""

from ...registry import register_method
from .config import ElasticMemoryConfig
from .hippo import HiPPOLegS
from .method import ElasticMemory

register_method(
    "elastic",
    config_cls=ElasticMemoryConfig,
    method_cls=ElasticMemory,
    untrained=(
        "no trainable parameters: the layer at 3/4 depth reads 540 HiPPO-LegS reconstructions of all past pre-"
        "RoPE keys/values"
    ),
)

__all__ = ["ElasticMemory", "ElasticMemoryConfig", "HiPPOLegS"]
