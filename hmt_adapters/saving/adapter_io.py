"""Adapter files: `memory_config.json` + `memory_adapter.safetensors` (+ the peft adapter files), written atomically
and read back with every check that keeps an adapter off a backbone it was not made for.

The frozen backbone is never written: an adapter is what the memory method (and peft) added. The config records
the base model (name, architecture, widths, vocabulary) and the file format version; loading refuses a mismatch.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..backbones import BackboneAdapter, get_backbone_adapter, is_peft
from ..compat import peft_on_transformers5
from ..config import MemoryConfig, read_json_object
from ..registry import get_method
from ..state import check_finite
from ..version import __version__
from . import checkpoint, hub
from .atomic import replace_folder
from .files import (
    ADAPTER_FILE_KIND,
    CONFIG_NAME,
    FORMAT_VERSION,
    GUARD_NAME,
    LORA_BIN_NAME,
    LORA_CONFIG_NAME,
    LORA_WEIGHTS_NAME,
    METADATA_KEYS,
    PEFT_FILES,
    TOKENIZER_CONFIG_NAME,
    TOKENIZER_FILES,
    WEIGHTS_NAME,
)
from .savable import SavableModel

logger = logging.getLogger(__name__)
Model = TypeVar("Model", bound=SavableModel)  # the model class `load_adapter` builds (`MemoryModel`)

# What `from_pretrained` accepts besides the download keywords and the config fields.
LOAD_KWARGS = ("is_trainable", "inplace")
FILE_KIND = ADAPTER_FILE_KIND  # safetensors metadata `hmt_adapters_file` of the memory weights

# A saved folder must not load without its memory through transformers or peft (docs/training.md, "peft's verbs"):
# - `config.json` with a `model_type` transformers does not know: `AutoModelForCausalLM.from_pretrained(folder)` and
#   `pipeline(model=folder)` read it (before any adapter_config.json) and stop with a message that holds the type;
# - `adapter_config.json`'s `peft_type` replaced by a sentence (the real type under `PEFT_TYPE_KEY`):
#   `PeftModel.from_pretrained`, `PeftConfig.from_pretrained` and `AutoPeftModelForCausalLM` stop on the unknown type.
LOAD_HINT = (
    "hmt_adapters.AutoMemoryModelForCausalLM.from_pretrained(folder) or MemoryModel.from_pretrained(base, folder)"
)
GUARD_MODEL_TYPE = f"hmt-adapters memory adapter (not a full model): load it with {LOAD_HINT}"
GUARD_QUIET = "tokenizer_loading"  # see `write_guard`
PEFT_TYPE_KEY = "hmt_adapters_peft_type"
MARKED_PEFT_TYPE = (
    "HMT_ADAPTERS_MEMORY: this peft adapter belongs to a memory adapter and is wrong without it; "
    f"load it with {LOAD_HINT}"
)


def has_peft_layers(model: torch.nn.Module) -> bool:
    """Whether `model` holds peft tuner layers (LoRA, IA3, ...); after peft's `merge_and_unload` it has none."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in model.modules())


def base_metadata(model: SavableModel) -> dict[str, Any]:
    """The metadata `save_pretrained` writes beside the config fields (see `config.METADATA_KEYS`)."""
    name = getattr(model.adapter.config, "_name_or_path", "") or None
    return {
        "format_version": FORMAT_VERSION,
        "hmt_adapters_version": __version__,
        "base_model_name_or_path": name,
        **model.adapter.facts(),
    }


def memory_state_dict(
    model: SavableModel, state_dict: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The memory method's weights, keyed as in `model.memory` (taken from `state_dict` when the Trainer passes
    one)."""
    if state_dict is None:
        return {k: v.detach() for k, v in model.memory.state_dict().items()}
    prefix = checkpoint.MEMORY_PREFIX
    return {k[len(prefix) :]: v.detach() for k, v in state_dict.items() if k.startswith(prefix)}


# ---- saving ----------------------------------------------------------------------------------------------------


def _write_files(model: SavableModel, folder: str, state_dict: dict[str, torch.Tensor] | None) -> None:
    weights = {k: v.contiguous().cpu() for k, v in memory_state_dict(model, state_dict).items()}
    save_file(
        weights,
        os.path.join(folder, WEIGHTS_NAME),
        metadata={"format": "pt", "method": model.method, "hmt_adapters_file": FILE_KIND},
    )
    if is_peft(model.backbone):
        if not has_peft_layers(model.backbone):
            raise ValueError(
                "The backbone is a peft model without adapter layers: its adapter was merged into the base weights "
                "(e.g. by `model.base_model.merge_and_unload()`), and an adapter folder cannot hold merged base "
                "weights (peft would write an empty adapter). Use `model = model.merge_and_unload()`: it keeps the "
                "memory and saves a memory-only adapter; save the merged base with `model.base_model.save_pretrained`."
            )
        peft_state = None
        if state_dict is not None:
            prefix = f"{model.base_model_prefix}."
            peft_state = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        model.backbone.save_pretrained(folder, state_dict=peft_state)
        _mark_peft_config(folder)
    write_guard(folder)
    with open(os.path.join(folder, CONFIG_NAME), "w", encoding="utf-8") as fh:
        fh.write(model.memory_config.to_json_string(**base_metadata(model)))


def write_guard(folder: str) -> None:
    """Write `GUARD_NAME`, the `config.json` that stops transformers' loaders from reading the folder as a model.

    `AutoTokenizer.from_pretrained(folder)` reads it too (as a bare `PreTrainedConfig`, whose `model_type` is ""),
    and warns about a checkpoint "of type <the guard's sentence>" unless a nested entry has the type ""; `GUARD_QUIET`
    is that entry, so a tokenizer saved with the adapter loads without the misleading warning.
    """
    guard = {"model_type": GUARD_MODEL_TYPE, "hmt_adapters_version": __version__, GUARD_QUIET: {"model_type": ""}}
    with open(os.path.join(folder, GUARD_NAME), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(guard, indent=2) + "\n")


def _mark_peft_config(folder: str) -> None:
    """Replace `peft_type` in the peft config peft just wrote by `MARKED_PEFT_TYPE` (the real one under
    `PEFT_TYPE_KEY`), so that peft alone refuses the folder; `_load_peft` reads it back."""
    path = os.path.join(folder, LORA_CONFIG_NAME)
    data = read_json_object(path, "The peft adapter config")
    if PEFT_TYPE_KEY in data:
        return
    data[PEFT_TYPE_KEY] = data.get("peft_type")
    data["peft_type"] = MARKED_PEFT_TYPE
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _read_peft_config(folder: str, is_trainable: bool) -> Any:
    """The peft config of `folder`, marked (format 2) or not (formats 0 and 1, plain peft files)."""
    from peft import PeftConfig

    data = read_json_object(os.path.join(folder, LORA_CONFIG_NAME), "The peft adapter config")
    if PEFT_TYPE_KEY in data:
        data["peft_type"] = data.pop(PEFT_TYPE_KEY)
    config = PeftConfig.from_peft_type(**data)
    config.inference_mode = not is_trainable
    return config


def save_adapter(
    model: SavableModel,
    directory: str | os.PathLike,
    state_dict: dict[str, torch.Tensor] | None = None,
    is_main_process: bool = True,
    trainer_weights: bool = False,
    tokenizer: Any = None,
) -> None:
    """Write the adapter into `directory` (main process only), atomically per save.

    Every file is first written to a temporary folder beside `directory`, with the other files of an existing
    `directory` hard-linked in (peft files of an earlier save that this one does not write are dropped: a later load
    would apply them); the complete folder then replaces `directory` in one rename (`atomic.replace_folder`), so an
    error or a kill while saving leaves the earlier save whole, and a reader never sees a mix. Staging folders that a
    killed save left behind are removed by the next save. `trainer_weights` adds the Trainer's `model.safetensors`;
    `tokenizer` (anything with a transformers-style `save_pretrained`) is written into the same folder, in the same
    swap.
    """
    if not is_main_process:
        return
    if tokenizer is not None and not callable(getattr(tokenizer, "save_pretrained", None)):
        raise TypeError(
            f"`tokenizer` must be a tokenizer with `save_pretrained` (e.g. from AutoTokenizer.from_pretrained) or "
            f"None, got {type(tokenizer).__name__}."
        )
    directory = os.path.abspath(os.fspath(directory))
    if os.path.isfile(directory):
        raise ValueError(f"`save_directory` {directory!r} is a file; pass a directory.")
    with replace_folder(directory, replaced=_replaced, last=CONFIG_NAME) as tmp:
        _write_files(model, tmp, state_dict)
        if trainer_weights:
            checkpoint.save_trainer_weights(model, tmp, state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)


def _replaced(written: set[str]) -> tuple[str, ...]:
    """Files of an earlier save that go when a save writes `written`: peft files it does not write (a load would
    apply them), and the tokenizer's when it writes a tokenizer (one tokenizer's files, never a mix of two)."""
    return PEFT_FILES + (TOKENIZER_FILES if TOKENIZER_CONFIG_NAME in written else ())


# ---- loading ---------------------------------------------------------------------------------------------------


def read_adapter_config(folder: str, overrides: dict[str, Any], source: str) -> tuple[MemoryConfig, dict[str, Any]]:
    """The saved config with `overrides` applied, and its metadata; every field of the method must be in the file."""
    path = os.path.join(folder, CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{source!r} has no {CONFIG_NAME}; is it a directory written by save_pretrained?")
    data = read_json_object(path, "The memory config file")
    meta = {k: data.pop(k) for k in METADATA_KEYS if k in data}
    version = meta.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= FORMAT_VERSION:
        raise ValueError(
            f"The adapter at {source!r} has format version {version!r}, but hmt-adapters {__version__} reads formats "
            f"0 to {FORMAT_VERSION}: it was written by a newer hmt-adapters; upgrade the package to load it."
        )
    if "method" not in data:
        raise ValueError(f"{path} has no `method` key; it is needed to pick the config class.")
    entry = get_method(data["method"])
    switches = entry.config_cls.runtime_switches()
    for key in switches:  # recorded by saves before they were left out: how that process ran, not the adapter
        data.pop(key, None)
    fields = entry.config_cls.field_names()
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        allowed = [*LOAD_KWARGS, *hub.DOWNLOAD_KWARGS, *fields]
        hub.refuse_unknown(
            "MemoryModel.from_pretrained",
            {k: overrides[k] for k in unknown},
            allowed,
            f" (neither a loading option nor a field of {entry.config_cls.__name__})",
        )
    data = {**entry.config_cls.absent_values(), **data}  # fields newer than the file: what the file's writer did
    missing = sorted(set(fields) - set(data) - set(overrides) - set(switches))
    if missing:
        raise ValueError(
            f"{path} lacks the required field(s) {missing} of {entry.config_cls.__name__} (a save_pretrained folder "
            "has them all); add them to the file or pass them as keyword arguments."
        )
    meta["overridden"] = {  # (saved, given)
        k: (data.get(k), v) for k, v in overrides.items() if data.get(k) != v and k not in switches
    }
    return MemoryConfig.from_dict({**data, **overrides}), meta


def check_base(meta: dict[str, Any], adapter: BackboneAdapter, source: str) -> None:
    """Refuse a base model that differs from the recorded one in architecture, widths, depth or vocabulary."""
    given = adapter.facts()
    diffs = [
        f"{key} {meta[key]!r} (adapter) vs {given[key]!r} (given base)"
        for key in given
        if meta.get(key) is not None and given[key] is not None and meta[key] != given[key]
    ]
    if diffs:
        saved_for = meta.get("base_model_name_or_path") or "another base model"
        raise ValueError(
            f"The adapter at {source!r} was saved for {saved_for}, not for this base model: {'; '.join(diffs)}. "
            "Load it onto the base model it was trained on."
        )


def _read_weights(folder: str, method: str) -> dict[str, torch.Tensor]:
    """The memory weights in `folder`, refused when the file records another method than the folder's config."""
    path = os.path.join(folder, WEIGHTS_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder!r} has no {WEIGHTS_NAME}; is it a directory written by save_pretrained?")
    try:
        with safe_open(path, framework="pt") as fh:
            saved_by = (fh.metadata() or {}).get("method")
        weights = load_file(path)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}); the adapter is corrupted.") from err
    if saved_by is not None and saved_by != method:
        raise ValueError(
            f"{path} holds the weights of a '{saved_by}' memory adapter, but {CONFIG_NAME} in the same folder is for "
            f"'{method}': the folder mixes the files of two adapters (e.g. one file copied over another save's). "
            "Save the adapter again, or put back the weights file of this config."
        )
    check_finite(weights, f"The memory weights {path}")
    return weights


def load_tokenizer(folder: str, source: str) -> Any:
    """The tokenizer saved with the adapter in `folder`, or None when the folder has none (docs/adapters.md, "The
    tokenizer"). Files that do not load give a warning and None: the adapter itself is usable without them."""
    if not os.path.isfile(os.path.join(folder, TOKENIZER_CONFIG_NAME)):
        return None
    from transformers import AutoTokenizer, PreTrainedConfig

    try:  # the folder's config.json is the guard, not a model config: AutoTokenizer gets an empty config instead
        return AutoTokenizer.from_pretrained(folder, config=PreTrainedConfig())
    except Exception as err:  # noqa: BLE001 - any backend's error: the model loads, the tokenizer is reported missing
        logger.warning(
            "The adapter at %r has tokenizer files that do not load (%s: %s); `model.tokenizer` is None: pass a "
            "tokenizer yourself.",
            source,
            type(err).__name__,
            err,
        )
        return None


def _load_peft(base_model: torch.nn.Module, folder: str, is_trainable: bool) -> torch.nn.Module:
    """`base_model` with the peft adapter saved in `folder`: wrapped by peft, or loaded into its existing adapter
    layers."""
    from peft import PeftModel, set_peft_model_state_dict
    from peft.utils import load_peft_weights

    if not any(os.path.isfile(os.path.join(folder, n)) for n in (LORA_WEIGHTS_NAME, LORA_BIN_NAME)):
        raise FileNotFoundError(
            f"{folder} has {LORA_CONFIG_NAME} but no {LORA_WEIGHTS_NAME}: the peft adapter is incomplete."
        )
    check_finite(load_peft_weights(folder, device="cpu"), f"The peft weights in {folder}")
    if not is_peft(base_model):
        with peft_on_transformers5():
            config = _read_peft_config(folder, is_trainable)
            return PeftModel.from_pretrained(base_model, folder, config=config, is_trainable=is_trainable)
    result: Any = set_peft_model_state_dict(base_model, load_peft_weights(folder, device="cpu"))
    if result.unexpected_keys:
        raise ValueError(
            f"The peft weights in {folder} do not fit the LoRA layers of the given backbone "
            f"(e.g. {sorted(result.unexpected_keys)[:3]}); pass the plain backbone and let from_pretrained add them."
        )
    return base_model


def load_adapter(
    cls: Callable[[torch.nn.Module, MemoryConfig], Model],
    base_model: torch.nn.Module,
    path_or_id: str | os.PathLike,
    is_trainable: bool = False,
    inplace: bool = False,
    **kwargs: Any,
) -> Model:
    """Wrap `base_model` with a saved adapter (see `MemoryModel.from_pretrained`, which checks first that
    `base_model` can be wrapped)."""
    if not isinstance(is_trainable, bool) or not isinstance(inplace, bool):
        raise TypeError(f"`is_trainable` and `inplace` must be bools, got {is_trainable!r} and {inplace!r}.")
    source = os.fspath(path_or_id)
    download = {k: kwargs.pop(k) for k in hub.DOWNLOAD_KWARGS if k in kwargs}
    folder = hub.adapter_folder(source, **download)
    overrides = kwargs
    config, meta = read_adapter_config(folder, overrides, source)
    check_base(meta, get_backbone_adapter(base_model), source)
    weights = _read_weights(folder, config.method)
    if os.path.isfile(os.path.join(folder, LORA_CONFIG_NAME)):
        if not inplace:
            base_model = copy.deepcopy(base_model)  # peft injects its layers into the model it is given
        base_model = _load_peft(base_model, folder, is_trainable)
    model = cls(base_model, config)
    _load_memory_weights(model, weights, source, meta["overridden"], allow_missing=bool(overrides))
    model.tokenizer = load_tokenizer(folder, source)
    if is_trainable:
        model.train()
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        model.eval()
        model.frozen_for_inference = True
    return model


def _load_memory_weights(
    model: SavableModel,
    weights: dict[str, torch.Tensor],
    source: str,
    overridden: dict[str, tuple[Any, Any]],
    allow_missing: bool,
) -> None:
    """Load the saved memory weights into `model`, or say why they do not fit: a backbone of another width, a config
    override that changes the method's weights (`overridden`: field -> (saved, given)), or a config and a weights file
    of two different saves."""
    expected = model.memory.state_dict()
    method = model.memory_config.method
    given = ", ".join(f"{k}={v[1]!r} (saved: {v[0]!r})" for k, v in sorted(overridden.items()))
    for name, tensor in weights.items():
        if name not in expected or expected[name].shape == tensor.shape:
            continue
        shapes = f"has shape {tuple(tensor.shape)} but this model needs {tuple(expected[name].shape)}"
        width = model.adapter.embed_dim
        if tensor.dim() and tensor.shape[-1] != width and expected[name].shape[-1] == width:
            cause = (
                f"the adapter was trained for a backbone of another width (embedding width {tensor.shape[-1]}, "
                f"this backbone has {width})"
            )
        elif overridden:
            cause = (
                f"the override(s) {given} change the shape of trained weights; leave them out to load the "
                "adapter as it was trained"
            )
        else:
            cause = (
                f"the adapter's {CONFIG_NAME} and {WEIGHTS_NAME} come from different saves (the config "
                "gives other shapes than the weights have); save the adapter again"
            )
        raise ValueError(f"Adapter weight {name!r} of {source!r} {shapes}: {cause}.")
    missing, unexpected = model.memory.load_state_dict(
        {k: v.to(expected[k].dtype) if k in expected else v for k, v in weights.items()}, strict=False
    )
    if unexpected and overridden:
        raise ValueError(
            f"The adapter at {source!r} holds trained weights {sorted(unexpected)} that {method} does not build with "
            f"the override(s) {given}: loading would drop them. Leave out the override(s) to keep them (e.g. a "
            "stage-2 HMT adapter is trained with retrieval: load it with its saved `use_retrieval`)."
        )
    if unexpected:
        raise ValueError(
            f"The adapter at {source!r} holds weights {sorted(unexpected)} that {method} with its saved config does "
            f"not have: {CONFIG_NAME} and {WEIGHTS_NAME} come from different saves; save the adapter again."
        )
    if missing and not allow_missing:
        raise ValueError(f"The adapter at {source!r} lacks weights {sorted(missing)} of {method}.")
    if missing:
        logger.warning("Initialised new memory weights not in the adapter: %s", sorted(missing))
    model.loading_info = {"missing_keys": sorted(missing), "unexpected_keys": []}
