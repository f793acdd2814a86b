"""A tiny byte-level BPE tokenizer (trained in milliseconds) and a tiny Llama of its vocabulary, for the
long-context suite's tests."""

from __future__ import annotations

import functools

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from hmt_adapters.evaluation import tasks
from hmt_adapters.evaluation.haystack import REPEAT_FILLER


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE, vocabulary 320 (any text encodes; decoding round-trips exactly)."""
    corpus = [
        REPEAT_FILLER,
        tasks.PASSKEY_HEAD,
        tasks.RULER_NIAH_HEAD,
        tasks.RULER_VT_TAIL,
        tasks.QA_HEAD,
        " ".join(tasks.PERSONS + tasks.LOCATIONS + tasks.OBJECTS + tasks.MOVES),
    ] * 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def tiny_llama(vocab: int, seed: int = 0, max_positions: int = 4096) -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()
