"""Every tiny model and tokenizer the tests build (no downloads): one random causal LM per backbone family used
by the method cases (`tiny_backbone`); the family matrix's 53 Hugging Face causal-LM families (`family_backbone`:
hidden 32, 2 layers, vocab 128, each family's own quirk switched on, such as partial rotary, QK-norm, MQA, logit
scaling, multipliers, MoE, hybrid layers, so that a skipped family difference shows); and a byte-level BPE tokenizer
with a Llama of its vocabulary for the long-context suite (`tiny_tokenizer`, `tiny_llama`)."""

from __future__ import annotations

import copy
import functools
import importlib

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MambaConfig,
    MistralConfig,
    OPTConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    RwkvConfig,
)

from hmt_adapters.backbones.family import INTERFACE_NAME
from hmt_adapters.evaluation import tasks
from hmt_adapters.evaluation.haystack import REPEAT_FILLER

VOCAB = 96
MAX_POSITIONS = 64

# the shape every tiny attention model shares (the family matrix adds each family's quirk to it)
_DIMS = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=MAX_POSITIONS,
)
_GPT2_STYLE = dict(n_embd=32, n_layer=2, n_head=4, n_positions=MAX_POSITIONS)
_NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

CONFIGS = {
    "llama": LlamaConfig(vocab_size=VOCAB, **_DIMS),
    "qwen2": Qwen2Config(vocab_size=VOCAB, **_DIMS),
    "mistral": MistralConfig(vocab_size=VOCAB, **_DIMS),
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
    "gpt2": GPT2Config(vocab_size=VOCAB, **_GPT2_STYLE, **_NO_DROPOUT, bos_token_id=0, eos_token_id=0),
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


# ---- the family matrix ------------------------------------------------------------------------------------------
FAMILY_VOCAB = 128  # the family matrix's vocabulary

_COMMON = dict(
    vocab_size=FAMILY_VOCAB,
    **_DIMS,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)

_DELTA_NET = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)

# model_type -> overrides of _COMMON (each family's own quirk where it has one)
FAMILY_CONFIGS: dict[str, dict] = {
    "llama": {},
    "mistral": dict(sliding_window=6),
    "qwen2": {},
    "qwen3": dict(head_dim=8),  # QK-norm
    "gemma": dict(head_dim=8),  # embeddings scaled by sqrt(d) inside the body
    "gemma2": dict(head_dim=8, sliding_window=6, final_logit_softcapping=3.0),
    "gemma3_text": dict(head_dim=8, sliding_window=6, final_logit_softcapping=3.0),  # per-layer-type RoPE, QK-norm
    "phi": dict(partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0),
    "phi3": dict(resid_pdrop=0.0, embd_pdrop=0.0),  # fused qkv_proj
    "gpt_neox": dict(rotary_pct=0.5, hidden_dropout=0.0, attention_dropout=0.0),
    "gptj": dict(_GPT2_STYLE, rotary_dim=4, **_NO_DROPOUT),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2),
    "bloom": dict(n_layer=2, n_head=4),  # ALiBi
    "stablelm": dict(partial_rotary_factor=0.5),
    "olmo": {},
    "olmo2": {},  # post-norm layers, QK-norm over the full width
    "granite": dict(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3),
    "cohere": dict(logit_scale=0.5),  # interleaved RoPE
    "starcoder2": dict(residual_dropout=0.0, embedding_dropout=0.0),
    "smollm3": dict(no_rope_layers=[1, 0]),  # layer 1 without RoPE (NoPE)
    "gpt_bigcode": dict(_GPT2_STYLE, multi_query=True, **_NO_DROPOUT),
    "opt": dict(ffn_dim=64, word_embed_proj_dim=16, dropout=0.0, layerdrop=0.0),  # projected embedding width
    "gpt2": dict(_GPT2_STYLE, **_NO_DROPOUT),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=8),
    "jamba": dict(
        num_experts=2,
        attn_layer_offset=1,
        attn_layer_period=2,
        expert_layer_offset=1,
        expert_layer_period=2,
        mamba_d_state=8,
        mamba_dt_rank=4,
    ),
    "mamba": dict(state_size=8, use_mambapy=True),
    "mamba2": dict(num_heads=4, head_dim=16, state_size=8, n_groups=1, expand=2),
    "falcon_mamba": dict(state_size=8, use_mambapy=True),
    "rwkv": dict(attention_hidden_size=32, context_length=MAX_POSITIONS),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1),
    "falcon_h1": dict(
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_ssm=64,
        mamba_d_state=8,
        mamba_n_groups=1,
        head_dim=8,
        lm_head_multiplier=0.5,
        embedding_multiplier=2.0,
    ),
    "lfm2": dict(layer_types=["conv", "full_attention"], block_ff_dim=64, block_auto_adjust_ff_dim=False),
    "glm": dict(partial_rotary_factor=0.5),  # interleaved pairs with cos/sin narrowed inside its RoPE, partial rotary
    "glm4": dict(partial_rotary_factor=0.5),  # the same, plus norms after attention and MLP
    "helium": dict(head_dim=8),  # interleaved pairs
    "ernie4_5": {},  # interleaved pairs
    "hunyuan_v1_dense": dict(head_dim=8),  # QK-norm after RoPE
    "codegen": dict(_GPT2_STYLE, rotary_dim=4, n_ctx=MAX_POSITIONS, **_NO_DROPOUT),  # GPT-J's RoPE, fused qkv_proj
    "deepseek_v3": dict(  # multi-head latent attention (keys 12 wide per head, values 8), MoE from layer 1
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    ),
    "gpt_oss": dict(  # sink logits, YaRN (its attention factor scales cos/sin) half the head wide, MoE
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=6,
        rope_parameters=dict(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0
        ),
    ),
    "llama4_text": dict(  # RoPE as complex frequencies on interleaved pairs, QK-norm, a NoPE layer, MoE
        head_dim=8, num_local_experts=2, intermediate_size_mlp=64, no_rope_layers=[1, 0], use_qk_norm=True
    ),
    "gemma4_text": dict(  # its full-attention layers: wider heads, fewer of them, values = keys; no per-layer inputs
        head_dim=8,
        global_head_dim=16,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        sliding_window=6,
        hidden_size_per_layer_input=0,
    ),
    "qwen3_5_text": dict(head_dim=8, layer_types=["linear_attention", "full_attention"], **_DELTA_NET),
    "qwen3_next": dict(  # Gated DeltaNet layers beside gated full attention, MoE
        head_dim=8,
        layer_types=["linear_attention", "full_attention"],
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        **_DELTA_NET,
    ),
    "nemotron_h": dict(  # one `mixer` per layer: Mamba2, then attention
        hybrid_override_pattern="M*", mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=1, head_dim=8
    ),
    "granitemoehybrid": dict(  # Granite 4.0: Mamba2 and attention layers, MoE, Granite's multipliers
        layer_types=["mamba", "attention"],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=8,
        mamba_n_groups=1,
        num_local_experts=2,
        num_experts_per_tok=1,
        shared_intermediate_size=32,
    ),
    "olmo3": dict(sliding_window=6),
    "seed_oss": dict(head_dim=8),  # biased q/k/v
    "exaone4": dict(sliding_window=6),  # post-norm layers, QK-norm
    "ministral3": dict(head_dim=8),
    "cohere2": dict(sliding_window=6),  # interleaved RoPE on its sliding layers only
    "zamba2": dict(  # Mamba2 layers and a transformer block shared between its hybrid layers
        layers_block_type=["mamba", "hybrid"],
        mamba_d_state=8,
        n_mamba_heads=4,
        mamba_ngroups=1,
        use_mamba_kernels=False,
        chunk_size=8,
    ),
}

FAMILY_NAMES = tuple(FAMILY_CONFIGS)


def _config(family: str, fields: dict | None):
    """The family's config, `fields` replacing the matrix's before the config derives anything from them; GQA heads
    only where the family has them (an unknown field would just sit there)."""
    common = dict(_COMMON)
    if not hasattr(AutoConfig.for_model(family), "num_key_value_heads"):
        common.pop("num_key_value_heads")
    return AutoConfig.for_model(family, **{**common, **FAMILY_CONFIGS[family], **(fields or {})})


def family_backbone(
    family: str, seed: int = 0, dtype: torch.dtype = torch.float32, config_fields: dict | None = None, **overrides
) -> torch.nn.Module:
    """A freshly initialised tiny `*ForCausalLM` of `family` in eval mode (`config_fields` build its config,
    `overrides` are set on the built one).

    Norm weights are drawn at random around their initial value, as training leaves them: a norm initialised to the
    identity hides where it sits (a norm after RoPE commutes with the rotation only while its weight is constant)."""
    config = _config(family, config_fields)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight") and param.dim() == 1:
                param.add_(torch.empty_like(param).uniform_(-0.5, 0.5))
    return model.to(dtype).eval()


# family -> what its refusal of attention-level methods must say (input-level methods work everywhere)
REFUSED = {
    "hunyuan_v1_dense": "not its RoPE rotation of the same keys",
    "deepseek_v3": "multi-head latent attention",
    "zamba2": "shared between layers",
    "bloom": "ALiBi",
    "mamba": "no attention layers",
    "mamba2": "no attention layers",
    "falcon_mamba": "no attention layers",
    "rwkv": "no attention layers",
}


def bypasses_attention_interface(family: str) -> bool:
    """Whether the installed transformers runs this family's attention outside its attention interface."""
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    return not hasattr(module, INTERFACE_NAME)


# transformers 5.24 moved GPT-J and CodeGen onto the attention interface, 5.25 Falcon; on earlier releases they are
# refused
RELEASE_DEPENDENT = ("gptj", "codegen", "falcon")
REFUSED.update({f: "attention interface" for f in RELEASE_DEPENDENT if bypasses_attention_interface(f)})


# hybrids: the layers with attention, which attention-level memory must be given explicitly
HYBRID_ATTENTION_LAYERS = {
    "jamba": [1],
    "bamba": [1],
    "lfm2": [1],
    "qwen3_5_text": [1],
    "qwen3_next": [1],
    "nemotron_h": [1],
    "granitemoehybrid": [1],
}


def layer_overrides(method: str, family: str) -> dict:
    """Memory-layer arguments that put `method`'s memory on a hybrid's attention layers (none elsewhere)."""
    layers = HYBRID_ATTENTION_LAYERS.get(family)
    if layers is None or method in ("rmt", "hmt"):
        return {}
    if method == "melodi":
        return dict(short_term_layers=layers, long_term_layer=layers[0])
    return dict(memory_layers=layers)


# families with state outside attention (SSM / convolution layers) that restarts every segment: a memory over the
# attention layers cannot make them read the whole document, so the exactness check below has nothing to compare with
STATE_OUTSIDE_ATTENTION = (
    "jamba",
    "bamba",
    "lfm2",
    "falcon_h1",
    "qwen3_5_text",
    "qwen3_next",
    "nemotron_h",
    "granitemoehybrid",
)


def memory_read_error(family: str, segment: int = 8, config_fields: dict | None = None) -> float:
    """Largest |logit| difference between Transformer-XL with memory covering the document and the bare backbone
    reading the whole document at the positions each token was read at: the stream positions on RoPE families (memory
    keys are re-rotated at their true distance), the segment's own positions on learned-position ones (OPT, GPT-2:
    a key keeps the position it was computed at). Sliding windows are widened to the document: this checks memory
    reads, not window semantics. fp32 noise is ~1e-7; an inexact re-rotation shows as ~1e-3."""
    import hmt_adapters as ha

    base = family_backbone(family, config_fields=config_fields, sliding_window=MAX_POSITIONS)
    ids = torch.randint(0, FAMILY_VOCAB, (2, 3 * segment + 3), generator=torch.Generator().manual_seed(0))
    model = ha.wrap_with_memory(base, "transformer_xl", segment_length=segment, memory_size=MAX_POSITIONS).eval()
    stream = torch.arange(ids.shape[1])
    rope = model.adapter.rotary(stream[None], model.adapter.embed(ids[:, :1]))
    positions = (stream if rope is not None else stream % segment).expand_as(ids)
    with torch.no_grad(), model.disable_memory():  # the bare backbone (the memory attention delegates unchanged)
        ref = base(input_ids=ids, position_ids=positions).logits
    with torch.no_grad():
        return float((model(input_ids=ids).logits - ref).abs().max())


# ---- the long-context suite -------------------------------------------------------------------------------------
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
    config = LlamaConfig(vocab_size=vocab, **{**_DIMS, "max_position_embeddings": max_positions})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()
