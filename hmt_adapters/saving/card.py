"""The Hub model card of an adapter and its upload: `push_to_hub` saves the adapter to a temporary folder with a
card rendered from the template in `hmt_adapters.model_cards`, and uploads the folder."""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from typing import TYPE_CHECKING, Any

from huggingface_hub import HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..backbones import is_peft
from ..backbones.pretrained import KNOWN_BASES, base_model_code
from ..version import __version__
from .adapter_io import base_metadata, save_adapter
from .files import CARD_TEMPLATE
from .savable import SavableModel

if TYPE_CHECKING:
    import torch

LIBRARY_NAME = "hmt-adapters"


def card_base_model(base: str | None) -> str | None:
    """The Hub repo id the card's `base_model` metadata names: `base` itself, the origin of a base this package
    builds (e.g. SmolLM2 from its PyPI GGUF), else None."""
    if base in KNOWN_BASES:
        return KNOWN_BASES[base][2]
    if not base:
        return None
    try:
        validate_repo_id(base)
    except HFValidationError:
        return None
    return base


def render_model_card(model: SavableModel, tags: list[str] | None = None, **fields: Any) -> ModelCard:
    """The Hub model card for `model`'s adapter, from the template in `hmt_adapters/model_cards/` (`fields` fill its
    slots)."""
    meta = base_metadata(model)
    base = meta["base_model_name_or_path"]
    card_data = ModelCardData(
        library_name=LIBRARY_NAME,
        base_model=card_base_model(base),
        tags=["hmt-adapters", "memory", "long-context", model.method, *(tags or [])],
        pipeline_tag="text-generation",
    )
    template = resources.files("hmt_adapters.model_cards").joinpath(CARD_TEMPLATE)
    return ModelCard.from_template(
        card_data,
        template_str=template.read_text(encoding="utf-8"),
        method=model.method,
        base_model_name=base or "(local backbone)",
        base_model_code=base_model_code(base),
        base_model_type=meta["base_model_type"],
        config=model.memory_config.saved_fields(),  # what the adapter is, not how one process ran it
        num_memory_parameters=sum(p.numel() for p in model.memory.parameters()),
        has_lora=is_peft(model.backbone),
        version=__version__,
        **fields,
    )


def push_adapter(
    model: SavableModel,
    repo_id: str,
    *,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: str | bool | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    tags: list[str] | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    results: str | None = None,
    training: str | None = None,
    tokenizer: Any = None,
) -> Any:
    """Save the adapter and its model card to a temporary folder and upload it to `repo_id` (branch `revision`,
    as a pull request with `create_pr`), as transformers' `push_to_hub` does, with `tokenizer`'s files when given;
    returns the commit info."""
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision is not None and not revision.startswith("refs/pr"):
        try:
            api.create_branch(repo_id=repo_id, branch=revision, exist_ok=True)
        except HfHubHTTPError as err:  # no right to branch: a PR onto an existing branch may still work
            if not (create_pr and err.response is not None and err.response.status_code == 403):
                raise
    with tempfile.TemporaryDirectory() as tmp:
        save_adapter(model, tmp, state_dict=state_dict, tokenizer=tokenizer)
        card = render_model_card(model, tags=tags, repo_id=repo_id, results=results, training=training)
        card.save(os.path.join(tmp, "README.md"))
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=tmp,
            commit_message=commit_message or f"Upload {model.method} memory adapter",
            commit_description=commit_description,
            revision=revision,
            create_pr=create_pr,
        )
