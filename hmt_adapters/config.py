"""`MemoryConfig`: the fields every memory method shares, their validation and the JSON round trip.

Each field declares its constraints in `metadata` (`min`, `max`, `choices`, `nullable`); one validator checks them
all, so a bad value always raises a `ValueError` that names the field, the value and what is allowed. Two more keys
say how a field is saved: `runtime` (never saved) and `absent` (what a file written before the field means).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from .registry import get_method
from .saving.files import CONFIG_NAME, METADATA_KEYS

# Fields that say how this process runs the method, not what the adapter is: `memory_config.json` never records
# them (`to_json_string`), and a file that does (written before they were left out) has them ignored on load.
RUNTIME_SWITCHES = ("offload_activations", "gradient_checkpointing")


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The JSON object in `path`; a `ValueError` naming `what` and the file when it is not valid JSON or not an
    object."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} {os.fspath(path)!r} is not valid JSON ({err}).") from err
    if not isinstance(data, dict):
        raise ValueError(f"{what} {os.fspath(path)!r} must hold a JSON object, got {type(data).__name__}.")
    return data


def _check_field(name: str, value: Any, meta: dict, default: Any) -> None:
    """Raise a `ValueError` naming `name` when `value` breaks the constraints declared in `meta`."""
    if value is None:
        if meta.get("nullable", False):
            return
        raise ValueError(f"`{name}` must not be None{_allowed(meta, default)}.")
    choices = meta.get("choices")
    if choices is not None:
        if value not in choices:
            raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}.")
        return
    if isinstance(default, bool) or meta.get("type") is bool:
        if not isinstance(value, bool):
            raise ValueError(f"`{name}` must be a bool, got {value!r}.")
        return
    kind = meta.get("type", type(default) if default is not None else int)
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"`{name}` must be a string{_allowed(meta, default)}, got {value!r}.")
        return
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"`{name}` must be an integer{_allowed(meta, default)}, got {value!r}.")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"`{name}` must be a number{_allowed(meta, default)}, got {value!r}.")
    lo, hi = meta.get("min"), meta.get("max")
    if kind is tuple:
        if (
            not isinstance(value, tuple)
            or not value
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
        ):
            raise ValueError(f"`{name}` must be a non-empty list of integers{_allowed(meta, default)}, got {value!r}.")
        bad = [v for v in value if (lo is not None and v < lo) or (hi is not None and v > hi)]
        if bad:
            raise ValueError(f"`{name}` entries must be in {_range_text(lo, hi)}, got {bad!r}.")
        return
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"`{name}` must be in {_range_text(lo, hi)}, got {value!r}.")


def _range_text(lo: Any, hi: Any) -> str:
    return f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"


def _allowed(meta: dict, default: Any) -> str:
    parts = []
    if meta.get("min") is not None or meta.get("max") is not None:
        parts.append(f" in {_range_text(meta.get('min'), meta.get('max'))}")
    if meta.get("nullable"):
        parts.append(" or None")
    return "".join(parts)


@dataclass
class MemoryConfig:
    """Common configuration of every memory method.

    Args:
        segment_length (`int`, defaults to 512):
            Real (text) tokens per segment. Memory, sensory and summary slots come on top.
        bptt_depth (`int`, *optional*):
            Segments that gradients flow back through (truncated BPTT: the state is detached every `bptt_depth`
            segments). `None` means through the whole input.
        offload_activations (`bool`, defaults to `False`):
            Move each segment's saved activations to CPU memory (parameters are never copied).
        gradient_checkpointing (`bool`, defaults to `False`):
            Recompute each segment in the backward pass instead of keeping its activations.

    `offload_activations` and `gradient_checkpointing` are runtime switches (`RUNTIME_SWITCHES`): set here or by
    `model.gradient_checkpointing_enable()`, but not saved with the adapter.
    """

    # The registered method string this config selects, also the `"method"` key of `memory_config.json`. One
    # method per class sets it here; a class with several presets (UniMem) answers per instance with a property.
    method: ClassVar[str] = ""

    segment_length: int = field(default=512, metadata={"help": "Real tokens per segment.", "min": 1})
    bptt_depth: int | None = field(
        default=None,
        metadata={"help": "Segments gradients flow back through; None = all.", "min": 1, "nullable": True},
    )
    offload_activations: bool = field(default=False, metadata={"help": "Move per-segment saved activations to CPU."})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute each segment in backward (non-reentrant)."}
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field against the constraints it declares; subclasses add cross-field checks."""
        for f in dataclasses.fields(self):
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.metadata.get("type") is tuple and isinstance(getattr(self, f.name), list):
                setattr(self, f.name, tuple(getattr(self, f.name)))  # JSON lists come back as tuples
            _check_field(f.name, getattr(self, f.name), dict(f.metadata), default)

    # ---- JSON round trip -------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The fields plus `method`, ready for JSON."""
        out: dict[str, Any] = {"method": self.method}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @property
    def method_name(self) -> str:
        """Deprecated alias of `method` (one name for the method string)."""
        warnings.warn("`config.method_name` is deprecated; use `config.method`.", FutureWarning, stacklevel=2)
        return self.method

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryConfig:
        """Build the config of `data["method"]`, rejecting keys that are neither fields nor checkpoint metadata."""
        data = dict(data)
        method = data.pop("method", None)
        if method is None:
            raise ValueError("The memory config has no `method` key; it is needed to pick the config class.")
        entry = get_method(method)
        for key in METADATA_KEYS:
            data.pop(key, None)
        return entry.make_config(method, **data)

    @classmethod
    def cover_fields(cls, tokens: int, segment_length: int) -> dict[str, Any]:
        """The fields that size this method's store to hold `tokens` past tokens read in segments of
        `segment_length` (the zero-shot readers' `memory='cover'`, `evaluation/zero_shot.py`); none by default: a
        method without a store size (RMT's memory tokens, Elastic's HiPPO over all history, InfLLM's store of every
        past token)."""
        return {}

    @classmethod
    def runtime_switches(cls) -> tuple[str, ...]:
        """Fields that say how this process runs, not what the adapter is (not saved): `RUNTIME_SWITCHES` and the
        method's fields marked `"runtime": True` (e.g. where InfLLM keeps its store)."""
        marked = tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("runtime"))
        return RUNTIME_SWITCHES + marked

    @classmethod
    def absent_values(cls) -> dict[str, Any]:
        """Fields added after files of the method were first written, with the value a file without the field means
        (field metadata `"absent"`: the behaviour of the package that wrote it, whatever today's default). Every other
        field must be in the file (a hand-edited file missing one is refused rather than guessed)."""
        return {f.name: f.metadata["absent"] for f in dataclasses.fields(cls) if "absent" in f.metadata}

    def saved_fields(self) -> dict[str, Any]:
        """What `memory_config.json` holds of this config: `to_dict()` without the runtime switches (how one
        process runs the method, not what the adapter is)."""
        return {k: v for k, v in self.to_dict().items() if k not in self.runtime_switches()}

    def to_json_string(self, **metadata: Any) -> str:
        """The JSON written to `memory_config.json`: the saved fields plus `metadata`."""
        return json.dumps({**self.saved_fields(), **metadata}, indent=2, sort_keys=True) + "\n"

    def save(self, directory: str | os.PathLike, **metadata: Any) -> str:
        """Write `memory_config.json` into `directory` (metadata keys such as the base model id go beside the
        fields)."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, CONFIG_NAME)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json_string(**metadata))
        return path

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> MemoryConfig:
        return MemoryConfig.from_dict(read_json_object(path, "The memory config file"))

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes` applied (validated like a fresh config)."""
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise ValueError(
                f"Unknown field(s) {unknown} for {type(self).__name__}; valid fields: {sorted(self.field_names())}."
            )
        return dataclasses.replace(self, **changes)
