"""Tiny random causal LMs built from configs (no downloads), one per backbone family."""

from __future__ import annotations

import copy

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MambaConfig,
    MistralConfig,
    OPTConfig,
    Qwen2Config,
    RwkvConfig,
)

VOCAB = 96
MAX_POSITIONS = 64

CONFIGS = {
    "llama": LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
    ),
    "qwen2": Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
    ),
    "mistral": MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
    ),
    # word_embed_proj_dim != hidden_size: memory lives in the 16-wide embedding space
    "opt": OPTConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        word_embed_proj_dim=16,
        max_position_embeddings=MAX_POSITIONS,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        layerdrop=0.0,
    ),
    "gpt2": GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=MAX_POSITIONS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    ),
    "mamba": MambaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        state_size=8,
        num_hidden_layers=2,
        expand=2,
        conv_kernel=4,
        use_mambapy=True,
    ),
    "rwkv": RwkvConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        attention_hidden_size=32,
        intermediate_size=64,
        context_length=MAX_POSITIONS,
    ),
}

FAMILIES = tuple(CONFIGS)
ATTENTION_FAMILIES = ("llama", "qwen2", "mistral", "opt", "gpt2")
RECURRENT_FAMILIES = ("mamba", "rwkv")


def tiny_backbone(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A freshly initialised tiny `*ForCausalLM` of `family` (config deep-copied: construction mutates it)."""
    config = copy.deepcopy(CONFIGS[family])
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).float()


def random_ids(batch: int, length: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen)
