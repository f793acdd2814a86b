"""The method registry: method string -> config class, method class and preset defaults.

Methods register themselves from their own package (`register_method(...)` in `methods/<m>/__init__.py`); this
module imports no method, so dependencies point one way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import MemoryConfig
    from .method import MemoryMethod


@dataclass(frozen=True)
class MethodEntry:
    """One registered method string."""

    name: str
    config_cls: type[MemoryConfig]
    method_cls: type[MemoryMethod]
    defaults: dict[str, Any] = field(default_factory=dict)
    untrained: str = ""  # what an untrained instance does to the backbone (the zero-shot tables quote it)

    def make_config(self, name: str, **fields: Any) -> MemoryConfig:
        """Instantiate the config for this method string, with unknown keys reported as a `ValueError`."""
        valid = set(self.config_cls.field_names())
        unknown = sorted(set(fields) - valid)
        if unknown:
            raise ValueError(
                f"Unknown field(s) {unknown} for method '{name}' ({self.config_cls.__name__}); "
                f"valid fields: {sorted(valid)}."
            )
        return self.config_cls(**{**self.defaults, **fields})

    @property
    def needs_attention(self) -> bool:
        return self.method_cls.needs_attention


_METHODS: dict[str, MethodEntry] = {}


def register_method(
    name: str,
    config_cls: type[MemoryConfig],
    method_cls: type[MemoryMethod],
    defaults: dict[str, Any] | None = None,
    untrained: str = "",
) -> None:
    """Register `name` (lower case, unique) so `wrap_with_memory(model, name)` and saved configs can find it;
    `untrained` says in words what an untrained instance does to the backbone (quoted by the zero-shot tables)."""
    if name != name.lower() or not name or name.endswith("_"):
        raise ValueError(f"Method names are lower case without a trailing '_', got {name!r}.")
    if name in _METHODS:
        raise KeyError(f"There is already a memory method called {name!r}.")
    _METHODS[name] = MethodEntry(name, config_cls, method_cls, dict(defaults or {}), untrained)


def get_method(name: str) -> MethodEntry:
    """The entry for `name`, or a `ValueError` listing every registered method."""
    if not isinstance(name, str) or name not in _METHODS:
        raise ValueError(f"Unknown memory method {name!r}; available methods: {available_methods()}.")
    return _METHODS[name]


def available_methods() -> list[str]:
    return sorted(_METHODS)


def method_for_config(config: MemoryConfig) -> MethodEntry:
    """The registry entry a config object belongs to."""
    return get_method(config.method)
