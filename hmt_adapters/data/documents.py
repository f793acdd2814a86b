"""Long documents as a `datasets.Dataset` with one row per document (`text`, `title`), from files or the Hub."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, cast

from datasets import Dataset, load_dataset

TEXT_SUFFIXES = (".txt", ".md")
JSON_SUFFIXES = (".json", ".jsonl")


def _local_files(source: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str] | None:
    """The files `source` names (a file, a folder of text files, or a list of files); None for a Hub dataset name."""
    if not isinstance(source, (str, os.PathLike)):  # a list of files
        paths = [os.fspath(p) for p in source]
    elif os.path.isdir(source):
        paths = sorted(
            os.path.join(source, f) for f in os.listdir(source) if f.endswith(TEXT_SUFFIXES + JSON_SUFFIXES)
        )
        if not paths:
            raise ValueError(f"The folder {os.fspath(source)!r} holds no {TEXT_SUFFIXES + JSON_SUFFIXES} files.")
    elif os.path.exists(source) or os.path.splitext(os.fspath(source))[1] in TEXT_SUFFIXES + JSON_SUFFIXES:
        paths = [os.fspath(source)]
    else:
        return None
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"Document files not found: {missing}.")
    return paths


def load_documents(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    text_column: str = "text",
    split: str = "train",
    **load_kwargs: Any,
) -> Dataset:
    """Load documents: `.txt`/`.md` files (one document per file), `.json`/`.jsonl` files (one per row) or a Hub
    dataset.

    The result has a `text` column (renamed from `text_column`) and, for text files, a `title` column (the file name).
    `load_kwargs` go to `datasets.load_dataset` (e.g. `name=` for a dataset configuration).
    """
    paths = _local_files(source)
    if paths is None:
        documents = load_dataset(os.fspath(cast("str | os.PathLike", source)), split=split, **load_kwargs)
    else:
        kinds = {p.endswith(JSON_SUFFIXES) for p in paths}
        if len(kinds) > 1:
            raise ValueError(f"Mix of text and JSON files in {paths}; load them separately.")
        if kinds == {True}:
            documents = load_dataset("json", data_files=paths, split="train", **load_kwargs)
        else:
            documents = load_dataset("text", data_files=paths, sample_by="document", split="train", **load_kwargs)
            documents = documents.add_column("title", [os.path.splitext(os.path.basename(p))[0] for p in paths])
    if text_column not in documents.column_names:
        raise ValueError(f"The documents have no column {text_column!r}; columns: {documents.column_names}.")
    if text_column != "text":
        documents = documents.rename_column(text_column, "text")
    return documents
