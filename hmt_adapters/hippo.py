"""Deprecated alias: HiPPO-LegS moved to `hmt_adapters.methods.elastic.hippo`, the one method that uses it
(`HiPPOLegS` is also `hmt_adapters.methods.elastic.HiPPOLegS`). Each name read from here warns once per caller."""

from __future__ import annotations

import warnings
from typing import Any

from .methods.elastic import hippo as _hippo

NEW_PATH = "hmt_adapters.methods.elastic.hippo"


def __getattr__(name: str) -> Any:
    if name.startswith("__") or not hasattr(_hippo, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} moved to {NEW_PATH}.{name}; import it from there.", DeprecationWarning, stacklevel=2
    )
    return getattr(_hippo, name)


def __dir__() -> list[str]:
    return sorted(name for name in vars(_hippo) if not name.startswith("_"))
