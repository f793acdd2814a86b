"""Adapter I/O: `memory_config.json` + `memory_adapter.safetensors` (+ the peft LoRA files), Hub upload, model card.

The frozen backbone is never written: a checkpoint is what the memory method (and LoRA) added.
"""

from __future__ import annotations

import logging
import os
import tempfile
from importlib import resources
from typing import TYPE_CHECKING, Any

import torch
from huggingface_hub import HfApi, ModelCard, ModelCardData, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .backbones import unwrap_causal_lm
from .config import CONFIG_NAME, MemoryConfig
from .version import __version__

if TYPE_CHECKING:
    from .model import MemoryModel

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "memory_adapter.safetensors"
LORA_CONFIG_NAME = "adapter_config.json"
LORA_WEIGHTS_NAME = "adapter_model.safetensors"
CARD_TEMPLATE = "memory_adapter_card.md"
LIBRARY_NAME = "hmt-adapters"


def _is_peft(model: torch.nn.Module) -> bool:
    return unwrap_causal_lm(model) is not model


def memory_state_dict(model: "MemoryModel", state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The memory method's weights, keyed as in `model.memory` (taken from `state_dict` when the Trainer passes one)."""
    if state_dict is None:
        return {k: v.detach() for k, v in model.memory.state_dict().items()}
    prefix = "memory."
    return {k[len(prefix):]: v.detach() for k, v in state_dict.items() if k.startswith(prefix)}


def _metadata(model: "MemoryModel") -> dict[str, Any]:
    causal_lm = unwrap_causal_lm(model.backbone)
    return {
        "hmt_adapters_version": __version__,
        "base_model_name_or_path": getattr(causal_lm.config, "_name_or_path", "") or None,
        "base_model_type": model.adapter.model_type,
        "embed_dim": model.adapter.embed_dim,
    }


def save_adapter(
    model: "MemoryModel", directory: str, state_dict: dict[str, torch.Tensor] | None = None, is_main_process: bool = True
) -> None:
    """Write the adapter files into `directory` (only on the main process)."""
    if not is_main_process:
        return
    if os.path.isfile(directory):
        raise ValueError(f"`save_directory` {directory!r} is a file; pass a directory.")
    os.makedirs(directory, exist_ok=True)
    weights = {k: v.contiguous().cpu() for k, v in memory_state_dict(model, state_dict).items()}
    save_file(weights, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt", "method": model.method})
    model.memory_config.save(directory, **_metadata(model))
    if _is_peft(model.backbone):
        lora_state = None
        if state_dict is not None:
            prefix = "backbone."
            lora_state = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        model.backbone.save_pretrained(directory, state_dict=lora_state)


def _resolve(path_or_id: str, filename: str, required: bool = True) -> str | None:
    """Local path of `filename` in a directory or Hub repo (None when optional and absent)."""
    if os.path.isdir(path_or_id):
        path = os.path.join(path_or_id, filename)
        if os.path.isfile(path):
            return path
        if required:
            raise FileNotFoundError(f"{path_or_id!r} has no {filename}; is it a directory written by save_pretrained?")
        return None
    if os.path.exists(path_or_id):
        raise ValueError(f"{path_or_id!r} is a file; pass the directory save_pretrained wrote, or a Hub repo id.")
    try:
        return hf_hub_download(path_or_id, filename)
    except EntryNotFoundError:
        if required:
            raise FileNotFoundError(f"The Hub repo {path_or_id!r} has no {filename}.") from None
        return None


def load_adapter(cls: type["MemoryModel"], base_model: torch.nn.Module, path_or_id: str, **overrides: Any) -> "MemoryModel":
    """Wrap `base_model` with a saved adapter; missing weights are an error unless `overrides` add new parameters."""
    config = MemoryConfig.from_json_file(_resolve(path_or_id, CONFIG_NAME))
    if overrides:
        config = config.replace(**overrides)
    weights_path = _resolve(path_or_id, WEIGHTS_NAME)
    try:
        weights = load_file(weights_path)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{weights_path} is not a readable safetensors file ({err}); the adapter is corrupted.") from err
    lora_config = _resolve(path_or_id, LORA_CONFIG_NAME, required=False)
    if lora_config:
        base_model = _load_lora(base_model, os.path.dirname(lora_config))
    model = cls(base_model, config)
    expected = model.memory.state_dict()
    for name, tensor in weights.items():
        if name in expected and expected[name].shape != tensor.shape:
            raise ValueError(
                f"Adapter weight {name!r} has shape {tuple(tensor.shape)} but this backbone needs "
                f"{tuple(expected[name].shape)}: the adapter was trained for a backbone with another hidden size "
                f"(saved for embedding width {tensor.shape[-1]}, this backbone has {model.adapter.embed_dim})."
            )
    missing, unexpected = model.memory.load_state_dict(
        {k: v.to(expected[k].dtype) if k in expected else v for k, v in weights.items()}, strict=False
    )
    if unexpected:
        raise ValueError(f"The adapter at {path_or_id!r} holds weights {sorted(unexpected)} that {config.method_name} does not have.")
    if missing and not overrides:
        raise ValueError(f"The adapter at {path_or_id!r} lacks weights {sorted(missing)} of {config.method_name}.")
    if missing:
        logger.warning("Initialised new memory weights not in the adapter: %s", sorted(missing))
    model.loading_info = {"missing_keys": sorted(missing), "unexpected_keys": []}
    return model


def _load_lora(base_model: torch.nn.Module, folder: str) -> torch.nn.Module:
    """`base_model` with the LoRA weights saved in `folder`: wrapped by peft, or loaded into its existing LoRA layers."""
    from peft import PeftModel, set_peft_model_state_dict

    if not _is_peft(base_model):
        return PeftModel.from_pretrained(base_model, folder, is_trainable=True)
    weights = load_file(os.path.join(folder, LORA_WEIGHTS_NAME))
    result = set_peft_model_state_dict(base_model, weights)
    if result.unexpected_keys:
        raise ValueError(
            f"The LoRA weights in {folder} do not fit the LoRA layers of the given backbone "
            f"(e.g. {sorted(result.unexpected_keys)[:3]}); pass the plain backbone and let from_pretrained add LoRA."
        )
    return base_model


def render_model_card(model: "MemoryModel", **fields: Any) -> ModelCard:
    """The Hub model card for `model`'s adapter, from the template in `model_cards/`."""
    meta = _metadata(model)
    base = meta["base_model_name_or_path"]
    card_data = ModelCardData(
        library_name=LIBRARY_NAME,
        base_model=base if base and not os.path.isabs(base) else None,
        tags=["hmt-adapters", "memory", "long-context", model.method],
        pipeline_tag="text-generation",
    )
    template = resources.files("hmt_adapters.model_cards").joinpath(CARD_TEMPLATE)
    config = model.memory_config.to_dict()
    return ModelCard.from_template(
        card_data,
        template_str=template.read_text(encoding="utf-8"),
        method=model.method,
        base_model_name=base or "(local backbone)",
        base_model_type=meta["base_model_type"],
        config=config,
        num_memory_parameters=sum(p.numel() for p in model.memory.parameters()),
        has_lora=_is_peft(model.backbone),
        version=__version__,
        **fields,
    )


def push_adapter(
    model: "MemoryModel",
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str | None = None,
    **card_fields: Any,
) -> Any:
    """Save the adapter and its model card to a temporary folder and upload it to `repo_id`."""
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_adapter(model, tmp)
        render_model_card(model, repo_id=repo_id, **card_fields).save(os.path.join(tmp, "README.md"))
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=tmp,
            commit_message=commit_message or f"Upload {model.method} memory adapter",
        )
