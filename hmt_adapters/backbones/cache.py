"""Where hmt-adapters caches converted models (the SmolLM2 checkpoint dequantised from its GGUF file)."""

from __future__ import annotations

import os


def cache_dir() -> str:
    """`$HMT_ADAPTERS_CACHE`, else `~/.cache/hmt_adapters`."""
    return os.environ.get("HMT_ADAPTERS_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "hmt_adapters"))
