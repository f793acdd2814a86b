"""Where an adapter's files come from: a local folder, or a Hub repo downloaded through `huggingface_hub` (the
upload and the model card are in card.py).

Every keyword that transformers' or peft's `from_pretrained`/`push_to_hub` accept is either honoured here or refused
with a message naming it and the ones that are honoured: nothing is dropped silently.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from .files import ADAPTER_FILES, CONFIG_NAME, TOKENIZER_FILES

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
            raise ValueError(
                f"`revision` applies to Hub repos, but {name!r} is a local directory; leave `revision` out."
            )
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
    try:
        snapshot = snapshot_download(
            name,
            revision=revision,
            token=token,
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            local_files_only=local_files_only,
            force_download=force_download,
            allow_patterns=patterns,
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
        raise FileNotFoundError(
            f"The Hub repo {name!r} ({where}) has no {CONFIG_NAME}: it holds no hmt-adapters adapter."
        )
    return folder
