"""Elastic Memory: HiPPO-LegS compression of past keys/values, read back by polynomial sampling."""

from ...registry import register_method
from .config import ElasticMemoryConfig
from .hippo import HiPPOLegS
from .method import ElasticMemory

register_method("elastic", config_cls=ElasticMemoryConfig, method_cls=ElasticMemory)

__all__ = ["ElasticMemory", "ElasticMemoryConfig", "HiPPOLegS"]
