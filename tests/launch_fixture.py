"""A tiny Llama with a byte-level BPE tokenizer saved as a model folder, and a folder of text documents, for
launches."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from tiny import CONFIGS

WORDS = "the memory reads a long document segment by segment and keeps what matters for later tokens".split()


def write_documents(folder: Path, n: int = 3, words: int = 400) -> list[str]:
    """`n` text files of pseudo-random words (deterministic)."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    texts = []
    for d in range(n):
        picks = torch.randint(0, len(WORDS), (words,), generator=gen).tolist()
        texts.append(" ".join(WORDS[i] for i in picks))
        (folder / f"doc{d}.txt").write_text(texts[-1])
    return texts


def write_tiny_model(folder: Path, texts: list[str], vocab: int = 300) -> None:
    """A 2-layer Llama (width 32) and a BPE tokenizer trained on `texts`, saved with `save_pretrained`."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab, min_frequency=1, special_tokens=["<eos>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<eos>", pad_token="<eos>")
    config = copy.deepcopy(CONFIGS["llama"])
    config.vocab_size, config.max_position_embeddings = len(tokenizer), 128
    config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
