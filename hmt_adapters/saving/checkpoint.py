"""What a training checkpoint of a `MemoryModel` holds: the trainable state, never the frozen backbone.

The HF `Trainer` resumes by reading `model.safetensors` from a `checkpoint-<step>` folder (and DeepSpeed by reading its
engine checkpoint) and calling `model.load_state_dict`. These helpers decide which entries belong in such a state dict
(memory weights and buffers, LoRA or any other trainable backbone weight) and check an incoming one, so that a
checkpoint of another method, config or backbone fails with a clear error instead of a warning.
"""

from __future__ import annotations

import os
import re

import torch
from safetensors.torch import save_file
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import SAFE_WEIGHTS_NAME

from .savable import SavableModel

MEMORY_PREFIX = "memory."
TRAINER_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-\d+$")


def trainable_keys(model: SavableModel) -> set[str]:
    """State-dict keys a checkpoint must hold: every `memory.*` entry and every trainable backbone parameter."""
    keys = {k for k in model.state_dict(keep_vars=True) if k.startswith(MEMORY_PREFIX)}
    keys.update(f"{model.base_model_prefix}.{n}" for n, p in model.backbone.named_parameters() if p.requires_grad)
    return keys


def frozen_keys(model: SavableModel) -> set[str]:
    """State-dict keys of the frozen backbone: never written to a checkpoint, so never missing from one."""
    return set(model.state_dict(keep_vars=True)) - trainable_keys(model)


def check_state_dict(model: SavableModel, state_dict: dict[str, torch.Tensor]) -> None:
    """Raise a `ValueError` when a state dict holding memory weights was written for another method, config or
    backbone.

    A state dict without any `memory.*` key is left to the caller (it is backbone weights, not a memory checkpoint).
    """
    if not any(k.startswith(MEMORY_PREFIX) for k in state_dict):
        return
    own = model.state_dict(keep_vars=True)
    missing = sorted(trainable_keys(model) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    if missing or unexpected:
        raise ValueError(
            f"This checkpoint does not fit the '{model.method}' model: it lacks {missing or 'nothing'} and holds "
            f"unknown weights {unexpected or 'none'}. It was written for another memory method, config or LoRA setup "
            "(a stage-1 HMT checkpoint has no retrieval weights: start stage 2 with "
            "`MemoryModel.from_pretrained(base, stage1_dir, is_trainable=True, use_retrieval=True)`, not "
            "`resume_from_checkpoint`)."
        )
    for key, value in state_dict.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ValueError(
                f"Checkpoint weight {key!r} has shape {tuple(value.shape)} but this model's has "
                f"{tuple(own[key].shape)}: "
                f"the checkpoint was written for another backbone (this one is '{model.adapter.model_type}' with "
                f"embedding width {model.adapter.embed_dim})."
            )


def is_trainer_checkpoint(directory: str | os.PathLike) -> bool:
    """Whether `directory` is named like a `Trainer` checkpoint (`checkpoint-<step>`)."""
    return bool(TRAINER_CHECKPOINT.match(os.path.basename(os.path.normpath(directory))))


def save_trainer_weights(
    model: SavableModel, directory: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None
) -> str:
    """Write the trainable state under the model's own key names to `model.safetensors`, the file `Trainer` resumes
    from."""
    source = model.state_dict() if state_dict is None else state_dict
    keys = trainable_keys(model)
    weights = {k: v.detach().contiguous().cpu() for k, v in source.items() if k in keys}
    path = os.path.join(directory, SAFE_WEIGHTS_NAME)
    save_file(weights, path, metadata={"format": "pt", "method": model.method})
    return path
