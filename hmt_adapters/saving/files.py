"""Every file name an adapter folder or a saved state uses, and the version of the folder format."""

from __future__ import annotations

# Version of the adapter folder layout and of the metadata in memory_config.json. Files without the key were written
# by hmt-adapters 0.1.0 (format 0): they load, checked against whatever facts they record. Format 2 guards the folder
# against loaders that would drop the memory (`GUARD_NAME`, `MARKED_PEFT_TYPE` in adapter_io.py); formats 0 and 1
# load unchanged.
FORMAT_VERSION = 2

CONFIG_NAME = "memory_config.json"
# Keys `save_pretrained` writes beside the config fields; they describe the checkpoint, not the method.
METADATA_KEYS = (
    "format_version",
    "hmt_adapters_version",
    "base_model_name_or_path",
    "base_model_architecture",
    "base_model_type",
    "embed_dim",
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
)
WEIGHTS_NAME = "memory_adapter.safetensors"
LORA_CONFIG_NAME = "adapter_config.json"
LORA_WEIGHTS_NAME = "adapter_model.safetensors"
LORA_BIN_NAME = "adapter_model.bin"
ADAPTER_FILES = (CONFIG_NAME, WEIGHTS_NAME, LORA_CONFIG_NAME, LORA_WEIGHTS_NAME, LORA_BIN_NAME)
# Files of an earlier save that a new one may not write (a save without peft after one with it): removed on save.
PEFT_FILES = (LORA_CONFIG_NAME, LORA_WEIGHTS_NAME, LORA_BIN_NAME)
# The files a tokenizer's `save_pretrained` may write (any backend); an adapter folder carries them when it was saved
# with a tokenizer (docs/adapters.md, "The tokenizer"). `TOKENIZER_CONFIG_NAME` marks a folder that has one.
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
TOKENIZER_FILES = (
    TOKENIZER_CONFIG_NAME,
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
# A `config.json` whose `model_type` no loader knows, so that transformers refuses the folder (adapter_io.write_guard).
GUARD_NAME = "config.json"
CARD_TEMPLATE = "memory_adapter_card.md"  # in the package `hmt_adapters.model_cards`

STATE_NAME = "memory_state.safetensors"  # the usual name of a `MemoryState.save` file (any path works)
# safetensors metadata `hmt_adapters_file`: what a weights file holds
ADAPTER_FILE_KIND = "memory_adapter"
STATE_FILE_KIND = "memory_state"
