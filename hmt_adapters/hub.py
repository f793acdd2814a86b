"""The Hub side of adapters: find an adapter's files (a local folder or a Hub repo downloaded through
`huggingface_hub`), upload a saved adapter with a generated model card.

Every keyword that transformers' or peft's `from_pretrained`/`push_to_hub` accept is either honoured here or refused
with a message naming it and the ones that are honoured: nothing is dropped silently.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from importlib import resources
from typing import TYPE_CHECKING, Any

from huggingface_hub import HfApi, ModelCard, ModelCardData, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from .config import CONFIG_NAME
from .version import __version__

if TYPE_CHECKING:
    import torch

    from .model import MemoryModel

WEIGHTS_NAME = "memory_adapter.safetensors"
LORA_CONFIG_NAME = "adapter_config.json"
LORA_WEIGHTS_NAME = "adapter_model.safetensors"
LORA_BIN_NAME = "adapter_model.bin"
ADAPTER_FILES = (CONFIG_NAME, WEIGHTS_NAME, LORA_CONFIG_NAME, LORA_WEIGHTS_NAME, LORA_BIN_NAME)
# The files a tokenizer's `save_pretrained` may write (any backend); an adapter folder carries them when it was saved
# with a tokenizer (docs/adapters.md, "The tokenizer"). `TOKENIZER_CONFIG_NAME` marks a folder that has one.
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
TOKENIZER_FILES = (
    TOKENIZER_CONFIG_NAME, "tokenizer.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json",
)
CARD_TEMPLATE = "memory_adapter_card.md"
LIBRARY_NAME = "hmt-adapters"

# Keywords of `from_pretrained` that say where the adapter files come from (huggingface_hub's download options).
DOWNLOAD_KWARGS = ("revision", "token", "subfolder", "cache_dir", "local_files_only", "force_download")
# Keywords of transformers' `push_to_hub` that `MemoryModel.push_to_hub` honours.
PUSH_KWARGS = ("commit_message", "commit_description", "private", "token", "revision", "create_pr", "tags")


def refuse_unknown(where: str, kwargs: dict[str, Any], allowed: list[str] | tuple[str, ...], why: str = "") -> None:
    """Raise a `TypeError` naming every keyword of `kwargs` and the `allowed` ones (nothing is ignored silently)."""
    if kwargs:
        raise TypeError(
            f"{where} got keyword argument(s) {sorted(kwargs)} it does not honour{why}; allowed: {sorted(allowed)}."
        )


def adapter_folder(
    path_or_id: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    subfolder: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    force_download: bool = False,
) -> str:
    """The local folder that holds the adapter `path_or_id` names.

    A local directory is used as it is; anything else must be a Hub repo id, whose adapter files (memory config and
    weights, the peft adapter and tokenizer files when present) are downloaded into the HF cache by
    `snapshot_download`.
    """
    name = os.fspath(path_or_id)
    sub = (subfolder or "").strip("/")
    if os.path.isdir(name):
        if revision is not None:
            raise ValueError(f"`revision` applies to Hub repos, but {name!r} is a local directory; leave `revision` "
                             "out.")
        folder = os.path.join(name, sub)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"The adapter directory {name!r} has no subfolder {subfolder!r}.")
        return folder
    if os.path.exists(name):
        raise ValueError(f"{name!r} is a file; pass the directory save_pretrained wrote, or a Hub repo id.")
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise FileNotFoundError(
            f"The adapter directory {name!r} does not exist ({os.path.abspath(name)}), and it is not a Hub repo id "
            "('name' or 'org/name') either."
        ) from None
    patterns = [posixpath.join(sub, f) if sub else f for f in (*ADAPTER_FILES, *TOKENIZER_FILES)]
    where = f"revision {revision or 'main'}" + (f", subfolder {sub!r}" if sub else "")
    cache_dir = None if cache_dir is None else os.fspath(cache_dir)
    try:
        snapshot = snapshot_download(
            name, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only,
            force_download=force_download, allow_patterns=patterns,
        )
    except RevisionNotFoundError as err:
        raise ValueError(f"The Hub repo {name!r} has no revision {revision!r}.") from err
    except RepositoryNotFoundError as err:
        raise FileNotFoundError(
            f"{name!r} is not a local directory (no such path: {os.path.abspath(name)}), and the Hub has no repo "
            f"{name!r} that this token can read ({type(err).__name__})."
        ) from err
    except (LocalEntryNotFoundError, HfHubHTTPError) as err:
        raise FileNotFoundError(
            f"{name!r} is not a local directory (no such path: {os.path.abspath(name)}); as a Hub repo id it is not "
            f"in the cache ({where}) and cannot be downloaded: {err}"
        ) from err
    folder = os.path.join(snapshot, sub)
    if not os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        raise FileNotFoundError(f"The Hub repo {name!r} ({where}) has no {CONFIG_NAME}: it holds no hmt-adapters "
                                "adapter.")
    return folder


def card_base_model(base: str | None) -> str | None:
    """The Hub repo id the card's `base_model` metadata names: `base` itself, the origin of a base this package
    builds (e.g. SmolLM2 from its PyPI GGUF), else None."""
    from .auto import KNOWN_BASES

    if base in KNOWN_BASES:
        return KNOWN_BASES[base][2]
    if not base:
        return None
    try:
        validate_repo_id(base)
    except HFValidationError:
        return None
    return base


def render_model_card(model: MemoryModel, tags: list[str] | None = None, **fields: Any) -> ModelCard:
    """The Hub model card for `model`'s adapter, from the template in `model_cards/` (`fields` fill its slots)."""
    from .adapter_io import base_metadata, is_peft
    from .auto import base_model_code

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
        config=model.memory_config.to_dict(),
        num_memory_parameters=sum(p.numel() for p in model.memory.parameters()),
        has_lora=is_peft(model.backbone),
        version=__version__,
        **fields,
    )


def push_adapter(
    model: MemoryModel,
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
    from .adapter_io import save_adapter

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
