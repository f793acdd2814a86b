"""`MemoryModel`: a causal LM wrapped with a memory method, and `wrap_with_memory`, the one-call entry point."""

from __future__ import annotations

import contextlib
import contextvars
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation.stopping_criteria import MaxLengthCriteria
from transformers.modeling_outputs import BaseModelOutput

from . import resume
from .attention import use_memory_attention
from .backbones import get_backbone_adapter, is_peft, unwrap_causal_lm
from .backbones.wrapping import check_causal_lm
from .compat import CACHE_KWARG, cache_kwargs, one_cache
from .config import MemoryConfig
from .outputs import MemoryCausalLMOutput
from .registry import available_methods, get_method, method_for_config
from .runtime import IGNORE_INDEX, SegmentRuntime, progress, resolve_keep_logits, shift_targets
from .runtime.generation import MemoryGenerationCache, check_generation_options, padding_handled
from .runtime.packing import Packing
from .runtime.stream import read_stream
from .saving import adapter_io, card, checkpoint, hub
from .state import STATE_SIGNATURE, MemoryState, check_state


def _methods_without_attention() -> list[str]:
    return [m for m in available_methods() if not get_method(m).needs_attention]


# The MemoryModel whose call (in this thread / task) passed `fused_lm_head=True`: TRL's fused LM head
# (`trl.trainer.utils.add_fused_lm_head`, see docs/training.md) reads the LM head's inputs from `model.base_model`.
_FUSED_CALL: contextvars.ContextVar[MemoryModel | None] = contextvars.ContextVar("hmt_fused_lm_head", default=None)

PEFT_ORDER = (
    "peft adapters go on the backbone before the memory: `wrap_with_memory(get_peft_model(base, peft_config), ...)` "
    "(or `hmt_adapters.training.add_lora(base)`), then pass that MemoryModel to the trainer without `peft_config`"
)


class MemoryBody:
    """The memory model up to its LM head, as a fused LM head calls `model.base_model` (docs/training.md).

    Called with `input_ids` and `attention_mask`, it reads the document segment by segment from an empty memory, as
    `MemoryModel.forward` does, and returns the tensors the LM head reads (`last_hidden_state`, `[B, T, d]`, zero at
    padding), so a per-token log-probability computed from them equals the one from `forward`'s logits.
    """

    def __init__(self, model: MemoryModel):
        self.model = model

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutput:
        if kwargs:
            why = (
                " (`position_ids` come from padding-free batches, e.g. TRL's `padding_free=True` or "
                "`packing_strategy='bfd'`: memory reads each row as one document; use padded batches)"
                if "position_ids" in kwargs
                else ""
            )
            raise ValueError(
                f"A memory model's body takes `input_ids` and `attention_mask` only, got {sorted(kwargs)}{why}."
            )
        return BaseModelOutput(last_hidden_state=self.model.hidden_states(input_ids, attention_mask))


# what `MemoryModel.forward` takes (named when it refuses another HF causal-LM argument)
FORWARD_TAKES = (
    " It takes input_ids, attention_mask, labels, num_items_in_batch, return_logits, return_dict and use_cache."
)


def refuse_hf_arguments(given: dict[str, Any], where: str, takes: str = "") -> None:
    """A `ValueError` naming the HF causal-LM arguments `where` (a `MemoryModel` verb) does not take, where one is
    given (None is HF's "not given" and False an output not asked for, both of which wrappers pass along); `takes`:
    what it takes instead."""
    names = sorted(name for name, value in given.items() if value is not None and value is not False)
    if not names:
        return
    hint = ""
    if "output_hidden_states" in names:
        hint = " For the states the LM head reads use `model.hidden_states(input_ids, attention_mask)`."
    elif "inputs_embeds" in names:
        hint = " Pass `input_ids`: each method embeds its segments itself, and some read the ids (InfLLM's matching)."
    raise ValueError(
        f"{where} does not take {names}: it reads `input_ids` [B, T] segment by segment and places every segment "
        f"itself.{takes}{hint}"
    )


class MemoryModel(PreTrainedModel, GenerationMixin):
    """A segment-recurrent, memory-augmented causal LM around a Hugging Face backbone.

    The backbone (`base_model`, possibly a peft `PeftModel`) is frozen by default; `memory_parameters()` are the
    trainable memory weights. `save_pretrained` writes only the adapter (memory weights, config, LoRA if present).
    `tokenizer` is the tokenizer that goes with the model, or None: `from_pretrained` and
    `AutoMemoryModelForCausalLM` set it (docs/adapters.md, "The tokenizer"), you may set it, and `save_pretrained`
    writes it into the adapter folder.
    """

    base_model_prefix = "backbone"
    main_input_name = "input_ids"
    accepts_loss_kwargs = True  # Trainer passes `num_items_in_batch` for exact gradient-accumulation loss
    supports_gradient_checkpointing = True  # per segment, see `activation_checkpointing_enable`
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def __init__(self, base_model: nn.Module, memory_config: MemoryConfig, freeze_backbone: bool = True):
        check_wrappable(base_model)
        adapter = get_backbone_adapter(base_model)
        causal_lm, config = adapter.model, adapter.config
        attn_implementation = getattr(config, "_attn_implementation_internal", None)
        super().__init__(config)
        config._attn_implementation_internal = attn_implementation  # the shared backbone config stays as it was
        self.loss_type = "ForCausalLM"  # labels are shifted inside: Trainer counts targets over labels[..., 1:]
        self.backbone: Any = base_model  # any HF causal LM, peft-wrapped or not
        self.adapter = adapter
        self._added_token_rows: tuple[int, int] | None = None  # (before, after) of `resize_token_embeddings`
        entry = method_for_config(memory_config)
        if entry.needs_attention:
            self.adapter.check_attention_memory(entry.name, _methods_without_attention())
            use_memory_attention(causal_lm)
        self.memory_config = memory_config
        self.memory = entry.method_cls(memory_config, self.adapter)
        self.memory.check_backbone()
        self.runtime = SegmentRuntime(self.memory, self.adapter)
        if freeze_backbone:
            self._freeze_backbone()
        if getattr(causal_lm, "generation_config", None) is not None:
            self.generation_config = GenerationConfig.from_dict(causal_lm.generation_config.to_dict())
        param = next(causal_lm.parameters())
        self.memory.to(device=param.device, dtype=param.dtype if param.is_floating_point() else None)
        self.tokenizer: Any = None
        self.frozen_for_inference = False  # set by `from_pretrained` without `is_trainable` (see `_check_trainable`)
        self.loading_info: dict[str, list[str]] = {"missing_keys": [], "unexpected_keys": []}  # `from_pretrained`'s

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`nn.Module.__call__`; a call with `fused_lm_head=True` (TRL's fused LM head, docs/training.md) sees
        `base_model` as the memory body (`MemoryBody`) for its duration: the head reads hidden states with memory."""
        if not kwargs.get("fused_lm_head"):
            return super().__call__(*args, **kwargs)
        token = _FUSED_CALL.set(self)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _FUSED_CALL.reset(token)

    @property
    def base_model(self) -> nn.Module:
        """The backbone (a causal LM, or the peft model around it); inside a `fused_lm_head=True` call, the memory
        body whose `last_hidden_state` is what the LM head reads."""
        if _FUSED_CALL.get() is self:
            return MemoryBody(self)  # type: ignore[return-value]
        return self.backbone

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "peft_config":  # what peft's tuners set on the model they inject into (get_peft_model, add_adapter)
            raise TypeError(
                "peft cannot wrap a MemoryModel: it would freeze the memory and save only its own weights. "
                f"{PEFT_ORDER}. This MemoryModel now holds peft's layers; rebuild it from the backbone."
            )
        super().__setattr__(name, value)

    def add_adapter(self, *args: Any, **kwargs: Any) -> None:
        """Refused: transformers' peft integration would freeze and drop the memory (see `PEFT_ORDER`)."""
        raise TypeError(f"MemoryModel.add_adapter is not supported: {PEFT_ORDER}.")

    def load_adapter(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]  # refuses any call
        """Refused: memory adapters load with `MemoryModel.from_pretrained` / `AutoMemoryModelForCausalLM`."""
        raise TypeError(
            "MemoryModel.load_adapter is not supported: load a saved memory adapter (with its LoRA) with "
            "MemoryModel.from_pretrained(base, folder) or AutoMemoryModelForCausalLM.from_pretrained(folder)."
        )

    def get_output_embeddings(self) -> nn.Module | None:
        """The backbone's LM head."""
        return self.adapter.model.get_output_embeddings()

    def get_input_embeddings(self) -> nn.Module:
        """The backbone's token embeddings."""
        return self.adapter.model.get_input_embeddings()

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> nn.Embedding:
        """The backbone's `resize_token_embeddings` (new tokens after the backbone's, e.g. for a tokenizer with added
        special tokens): its embeddings and LM head grow, the shared config with them; the memory reads embeddings,
        not the vocabulary, so it is unchanged. The added rows are the backbone's: `save_pretrained` says that they
        are not in the adapter."""
        before = self.adapter.vocab_size
        embeddings = self.adapter.model.resize_token_embeddings(*args, **kwargs)
        first = before if self._added_token_rows is None else self._added_token_rows[0]
        after = self.adapter.vocab_size
        self._added_token_rows = (first, after) if after > first else None
        return embeddings

    def _freeze_backbone(self) -> None:
        """Freeze every backbone weight except what peft marked trainable (LoRA, IA3, LoHa, ... and
        `modules_to_save`)."""
        keep_peft = is_peft(self.backbone)
        for p in self.backbone.parameters():
            if not (keep_peft and p.requires_grad):
                p.requires_grad_(False)

    def _check_and_adjust_experts_implementation(  # type: ignore[override]  # None: the backbone's own choice
        self, experts_implementation: str | None
    ) -> str | None:
        """MoE experts run inside the backbone, which chose their implementation: the wrapper keeps it as is."""
        return experts_implementation

    def _init_weights(self, module: nn.Module) -> None:
        """Weights come from the backbone and the method; nothing is re-initialised."""

    # ---- public API ------------------------------------------------------------------------------------------

    @property
    def method(self) -> str:
        return self.memory_config.method

    def memory_parameters(self) -> Iterator[nn.Parameter]:
        """The trainable memory parameters (not the backbone, not LoRA)."""
        return (p for p in self.memory.parameters() if p.requires_grad)

    def get_nb_trainable_parameters(self) -> tuple[int, int]:
        """`(trainable, all)` parameter counts of the whole model (memory, backbone and its LoRA), as peft's
        `PeftModel.get_nb_trainable_parameters` reports them."""
        trainable = total = 0
        for p in self.parameters():
            count = int(getattr(p, "ds_numel", 0) or p.numel())  # DeepSpeed ZeRO-3 partitions keep the full count
            total += count
            trainable += count if p.requires_grad else 0
        return trainable, total

    def print_trainable_parameters(self) -> None:
        """Print the trainable and all parameters, as peft's `print_trainable_parameters` does."""
        trainable, total = self.get_nb_trainable_parameters()
        share = 100 * trainable / total
        print(f"trainable params: {trainable:,d} || all params: {total:,d} || trainable%: {share:.4f}")

    def merge_and_unload(
        self, progressbar: bool = False, safe_merge: bool = False, adapter_names: list[str] | None = None
    ) -> MemoryModel:
        """Merge the backbone's peft adapter (LoRA, ...) into its base weights and return a MemoryModel on the merged
        plain causal LM with the same memory (weights, config, train/eval mode, `requires_grad`).

        peft's own `merge_and_unload` does the merge (its keywords pass through); the outputs are those of the model
        before the merge, up to the rounding of the merged weights. This model's backbone is left unusable, as peft's
        verb leaves a peft model. `save_pretrained` on the result writes a memory-only adapter; the merged base is
        yours to save (`merged.base_model.save_pretrained(dir)`) and to pass to `MemoryModel.from_pretrained`. The
        merged base's `_name_or_path` is cleared, so the adapter records no base and `AutoMemoryModelForCausalLM`
        never loads it onto the unmerged base it came from (docs/training.md, "peft's verbs").
        """
        if not is_peft(self.backbone):
            raise ValueError("The backbone carries no peft adapter to merge: `merge_and_unload` needs one.")
        merged = self.backbone.merge_and_unload(
            progressbar=progressbar, safe_merge=safe_merge, adapter_names=adapter_names
        )
        merged.config._name_or_path = ""
        trainable = {n for n, p in self.memory.named_parameters() if p.requires_grad}
        new = type(self)(merged, self.memory_config.replace())
        new.memory.load_state_dict(self.memory.state_dict())
        for name, param in new.memory.named_parameters():
            param.requires_grad_(name in trainable)
        new.train(self.training)
        new.tokenizer = self.tokenizer
        new._added_token_rows = self._added_token_rows  # still the backbone's, still not in the adapter
        return new

    def init_memory(self, batch_size: int, device: torch.device | str | None = None) -> MemoryState:
        """The empty memory state for `batch_size` streams."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` must be an integer >= 1, got {batch_size!r}.")
        param = next(self.adapter.model.parameters())
        device = torch.device(device) if device is not None else param.device
        tensors = self.memory.init_state(batch_size, device, param.dtype)
        return MemoryState(self.method, tensors, extras={STATE_SIGNATURE: self._state_signature()})

    @contextlib.contextmanager
    def disable_memory(self) -> Iterator[None]:
        """Run the backbone on each segment alone (no memory): the same-window baseline.

        Covers every call made inside the block in this thread (or asyncio task): `forward`, `step` (the state passes
        through unchanged) and `generate` (the prompt and the generated tokens read in windows of `segment_length`
        with no memory). Other threads' calls on the same model keep their memory meanwhile.
        """
        with self.runtime.memory_disabled():
            yield

    @contextlib.contextmanager
    def disable_progress(self) -> Iterator[None]:
        """No progress bar for this model's reads inside the block (this thread or asyncio task). Elsewhere `step`,
        `generate` (its prompt) and `ask` show one on a terminal while they read more than a few segments; a pipe,
        a log file and `transformers.utils.logging.disable_progress_bar()` get none (docs/generation.md,
        "Progress")."""
        with progress.quiet(self.runtime):
            yield

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        return_logits: bool | None = None,
        cache: MemoryGenerationCache | None = None,
        return_dict: bool = True,
        past_key_values: MemoryGenerationCache | None = None,
        use_cache: bool | None = None,
        **unsupported: Any,
    ) -> MemoryCausalLMOutput:
        """Read `input_ids` `[B, T]` (any T >= 1) segment by segment from an empty memory.

        `loss` is the causal-LM loss over the whole input (labels -100 ignored); the last position of segment n
        predicts the first token of segment n+1. `logits` `[B, T, V]` has one row per input token; `return_logits=None`
        keeps them except in a Trainer training step (train mode, gradients, labels and `num_items_in_batch`).
        Inside `generate`, `cache` is the generation cache (`past_key_values`, its name before transformers 5.24,
        is accepted too): `input_ids` are then only the new tokens, `attention_mask` covers the whole sequence, and
        `logits` hold the last position only. `use_cache` (what trainers such as TRL pass) changes nothing: outside
        `generate` a memory model returns no cache. Other arguments of HF causal LMs (`inputs_embeds`,
        `position_ids`, `output_hidden_states`, ...) are refused by name unless None (`refuse_hf_arguments`).
        """
        refuse_hf_arguments(unsupported, "MemoryModel.forward", FORWARD_TAKES)
        if input_ids is None:
            raise ValueError("`input_ids` must be a [batch, length >= 1] tensor of token ids, got None.")
        if not return_dict:
            raise ValueError(
                "MemoryModel always returns a MemoryCausalLMOutput; `return_dict=False` is not supported."
            )
        cache = one_cache(cache, past_key_values)
        if cache is not None:
            return self._read_for_generation(input_ids, attention_mask, cache)
        ids, mask = self._check_inputs(input_ids, attention_mask)
        self._check_trainable(labels)
        packing = Packing.of(mask)
        targets = None
        if labels is not None:
            targets = shift_targets(packing.pack(self._check_labels(labels, ids), IGNORE_INDEX))
        state = self.init_memory(ids.shape[0], ids.device)
        keep = resolve_keep_logits(return_logits, self.training, labels is not None, num_items_in_batch)
        result = self.runtime.run(packing.pack(ids), packing.packed_mask, targets, state, keep_logits=keep)
        return MemoryCausalLMOutput(
            loss=self._loss(result.loss_sum, result.num_tokens, num_items_in_batch) if labels is not None else None,
            logits=packing.unpack(result.logits) if keep and result.logits is not None else None,
        ).with_num_tokens(result.num_tokens if labels is not None else None)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """What the LM head reads for each token, `[B, T, d]` (zero at padding), as `forward` reads the input.

        `self.adapter.logits(hidden_states(ids, mask))` equals `forward(ids, mask).logits` at every real token.
        """
        ids, mask = self._check_inputs(input_ids, attention_mask)
        packing = Packing.of(mask)
        state = self.init_memory(ids.shape[0], ids.device)
        result = self.runtime.run(packing.pack(ids), packing.packed_mask, None, state, keep_hidden=True)
        assert result.logits is not None  # the hidden states, with keep_hidden
        return packing.unpack(result.logits)

    def step(
        self,
        input_ids: torch.Tensor,
        state: MemoryState | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        return_logits: bool = True,
        *,
        state_dir: str | os.PathLike | None = None,
        save_every: int | None = None,
    ) -> tuple[MemoryCausalLMOutput, MemoryState]:
        """Feed the next chunk of a stream; chunk-by-chunk logits equal one `forward` over the concatenation.

        Each row is its own stream: its tokens are the ones `attention_mask` marks, and a segment closes when the
        row has `segment_length` of them, so rows padded differently still give their unpadded results. Tokens of a
        segment that the chunk leaves unfinished stay pending in the returned state (per row) and are read again
        with the next chunk when the segment closes. With `labels`, the loss covers next-token targets inside the
        chunk. Under gradients the state keeps at most `bptt_depth` segments of graph; with `bptt_depth=None` the
        incoming state is detached, so gradients flow through the segments of one call and a stream's graph never
        grows past one chunk. `return_logits=False` (as in `forward`) returns no logits and runs the LM head only
        where `labels` need it: reading a long document into memory then costs the backbone's body alone.

        With `state_dir`, a read that survives a restart: the document is read from an empty memory in chunks of
        `save_every` tokens (whole segments; None: one chunk) and the state saved into the folder after each; called
        again on the same tokens (after a kill, or to ask more), it continues from the last save (docs/generation.md,
        "A read that survives a restart"). It keeps no logits and no loss: pass `return_logits=False`.
        """
        ids, mask = self._check_inputs(input_ids, attention_mask)
        if state_dir is not None or save_every is not None:
            return self._resumable_step(ids, mask, state, labels, return_logits, state_dir, save_every)
        self._check_trainable(labels)
        if state is None:
            state = self.init_memory(ids.shape[0], ids.device)
        self._check_state(state, ids.shape[0])
        if torch.is_grad_enabled() and self.memory_config.bptt_depth is None:
            state = state.detach()
        checked = None if labels is None else self._check_labels(labels, input_ids)
        with progress.reading(self.runtime, state.pending_length + ids.shape[1], self.memory_config.segment_length):
            result = read_stream(self.runtime, state, ids, mask, checked, keep_logits=return_logits)
        out = MemoryCausalLMOutput(
            loss=self._loss(result.loss_sum, result.num_tokens, None) if labels is not None else None,
            logits=result.logits,
            memory_state=result.state,
        ).with_num_tokens(result.num_tokens if labels is not None else None)
        return out, result.state

    def _resumable_step(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        state: MemoryState | None,
        labels: Any,
        return_logits: bool,
        state_dir: str | os.PathLike | None,
        save_every: int | None,
    ) -> tuple[MemoryCausalLMOutput, MemoryState]:
        """`step(..., state_dir=...)`: its arguments checked, then `resume.read_resumable`."""
        if state_dir is None:
            raise ValueError(f"`save_every={save_every!r}` needs `state_dir`: the folder the reading state goes to.")
        if save_every is not None and (
            isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1
        ):
            raise ValueError(
                f"`save_every` must be a number of tokens >= 1 (or None: save at the end), got {save_every!r}."
            )
        given = {"state": state is not None, "labels": labels is not None, "return_logits=True": return_logits}
        if any(given.values()):
            raise ValueError(
                f"A read with `state_dir` starts from an empty memory and keeps no logits or loss; got "
                f"{[name for name, set_ in given.items() if set_]}. Pass `return_logits=False` and no `state` or "
                "`labels` (to continue a state of your own, call `step` without `state_dir`)."
            )
        with torch.no_grad():
            new_state = resume.read_resumable(self, ids, mask, state_dir, save_every)
        return MemoryCausalLMOutput(memory_state=new_state), new_state

    # ---- Trainer glue ----------------------------------------------------------------------------------------

    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1, offload: bool = False
    ) -> None:
        """Turn on per-segment checkpointing (what `TrainingArguments(gradient_checkpointing=True)` calls).

        Each segment is recomputed in backward (non-reentrant), so memory stays flat in the number of segments;
        `offload=True` also turns on `offload_activations`. Layer selection does not apply to whole segments.
        """
        kwargs = dict(activation_checkpointing_kwargs or {})
        if kwargs.pop("use_reentrant", False) or kwargs:
            raise ValueError(
                "Per-segment checkpointing is always non-reentrant and takes no options; got "
                f"{activation_checkpointing_kwargs!r} "
                "(allowed: None or {'use_reentrant': False})."
            )
        if every_n_layers != 1:
            raise ValueError(
                f"`every_n_layers` must be 1: memory models checkpoint whole segments, got {every_n_layers}."
            )
        self.memory_config.gradient_checkpointing = True
        self.memory_config.offload_activations = self.memory_config.offload_activations or offload

    def activation_checkpointing_disable(self) -> None:
        """Turn off per-segment checkpointing."""
        self.memory_config.gradient_checkpointing = False

    def gradient_checkpointing_enable(  # type: ignore[override]  # adds `offload`
        self, gradient_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1, offload: bool = False
    ) -> None:
        """The name transformers before 5.23 (and its `Trainer`) use for `activation_checkpointing_enable`."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, every_n_layers, offload)

    def gradient_checkpointing_disable(self) -> None:
        self.activation_checkpointing_disable()

    @property
    def is_activation_checkpointing(self) -> bool:
        return self.memory_config.gradient_checkpointing

    def load_state_dict(  # type: ignore[override]  # a state dict of tensors only
        self, state_dict: dict[str, torch.Tensor], strict: bool = True, assign: bool = False
    ):
        """Load a full or a training-checkpoint state dict (the `Trainer` and DeepSpeed resume through this).

        A checkpoint never holds the frozen backbone, so its absence is not reported. Memory weights, when present,
        must be exactly this model's (same method, config, LoRA and widths) even with `strict=False`: the `Trainer`
        loads with `strict=False` and would only warn about a checkpoint of another model.
        """
        checkpoint.check_state_dict(self, state_dict)
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        missing = sorted(set(result.missing_keys) - checkpoint.frozen_keys(self))
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}: missing {missing}, unexpected "
                f"{result.unexpected_keys}."
            )
        return type(result)(missing, result.unexpected_keys)

    # ---- generation ------------------------------------------------------------------------------------------

    def _get_stopping_criteria(self, generation_config: GenerationConfig, *args: Any, **kwargs: Any) -> Any:
        """transformers' stopping criteria without the backbone's position limit: a memory model reads any length
        in segments whose positions restart (docs/generation.md), so the "exceeded the model's predefined maximum
        length" reminder of `MaxLengthCriteria` does not apply."""
        criteria = super()._get_stopping_criteria(generation_config, *args, **kwargs)  # type: ignore[misc]
        for criterion in criteria:
            if isinstance(criterion, MaxLengthCriteria):
                criterion.max_position_embeddings = None
        return criteria

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        memory_state: MemoryState | None = None,
        **kwargs: Any,
    ) -> Any:
        """HF `generate` with memory: the prompt is read segment by segment, decoding uses the backbone's cache.

        Works: greedy and sampling (temperature, top-k/p, min-p, repetition penalty, ...), beam search and beam
        sampling (`num_beams`; each beam carries its own memory), `num_return_sequences`, logits processors and
        stopping criteria, eos/`max_new_tokens`/`min_new_tokens`, streamers, `output_scores`/`output_logits`,
        `return_dict_in_generate`, and padded batches (each row is read from its first real token, so a padded row
        generates what it generates alone). Refused with a `ValueError`: assisted and prompt-lookup decoding,
        contrastive search, DoLa, group and constrained beam search, `cache_implementation`, hidden states and
        attentions in the output. `memory_state` continues from an earlier state (e.g. a document encoded once with
        `step`). With `return_dict_in_generate=True`, the output's generation cache (`output.cache`;
        `output.past_key_values` before transformers 5.24) has `memory_state()`, the state after the sequence.
        """
        refuse_hf_arguments({"inputs_embeds": kwargs.get("inputs_embeds")}, "MemoryModel.generate")
        ids, mask = self._check_inputs(input_ids, attention_mask)
        config, _ = self._prepare_generation_config(generation_config, **kwargs)  # type: ignore[misc]
        check_generation_options(config, kwargs)
        given = one_cache(kwargs.pop("cache", None), kwargs.pop("past_key_values", None))
        if given is not None:
            kwargs.update(cache_kwargs(given))
        elif config.use_cache:
            state = memory_state if memory_state is not None else self.init_memory(ids.shape[0], ids.device)
            self._check_state(state, ids.shape[0])
            kwargs.update(cache_kwargs(MemoryGenerationCache(self.runtime, state)))
        elif memory_state is not None:
            raise ValueError("`memory_state` needs the generation cache; do not pass `use_cache=False` with it.")
        with padding_handled():
            return super().generate(input_ids=ids, attention_mask=mask, generation_config=generation_config, **kwargs)

    def _expand_inputs_for_generation(
        self,
        expand_size: int = 1,
        is_encoder_decoder: bool = False,
        input_ids: torch.LongTensor | None = None,
        **model_kwargs: Any,
    ) -> tuple[torch.LongTensor, dict[str, Any]]:
        """HF's row expansion (beams, `num_return_sequences`), applied to the memory cache as well."""
        cache = model_kwargs.get(CACHE_KWARG)
        input_ids, model_kwargs = super()._expand_inputs_for_generation(  # type: ignore[misc]
            expand_size, is_encoder_decoder, input_ids, **model_kwargs
        )
        if isinstance(cache, MemoryGenerationCache) and expand_size > 1:
            cache.batch_repeat_interleave(expand_size)
        return input_ids, model_kwargs

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.Tensor,
        cache: MemoryGenerationCache | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: MemoryGenerationCache | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Inputs for one generation step: the tokens the cache has not read (all of them without a cache).

        HF's own step arguments (`next_sequence_length`, `use_cache`, `cache_position`, output flags) do not apply:
        the cache knows what it has read, and memory models return logits only.
        """
        cache = one_cache(cache, past_key_values)
        if cache is None:
            return {"input_ids": input_ids, "attention_mask": attention_mask}
        new = input_ids[:, cache.get_seq_length() :]
        return {"input_ids": new, "attention_mask": attention_mask, **cache_kwargs(cache)}

    def _read_for_generation(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, cache: MemoryGenerationCache
    ) -> MemoryCausalLMOutput:
        ids, _ = self._check_inputs(input_ids, None)
        if attention_mask is None:
            mask = torch.ones_like(ids)
        else:
            mask = (attention_mask[:, -ids.shape[1] :].to(ids.device) != 0).long()
        with progress.reading(self.runtime, ids.shape[1], self.memory_config.segment_length, "Reading the prompt"):
            logits = cache.read(ids, mask)
        return MemoryCausalLMOutput(logits=logits, **cache_kwargs(cache))

    # ---- adapter I/O -----------------------------------------------------------------------------------------

    def save_pretrained(  # type: ignore[override]  # the adapter only: its own options
        self,
        save_directory: str | os.PathLike,
        state_dict: dict | None = None,
        is_main_process: bool = True,
        push_to_hub: bool = False,
        safe_serialization: bool = True,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        """Write `memory_config.json`, `memory_adapter.safetensors` and (with peft) the peft adapter files, atomically.

        Every file is written to a temporary folder first and the complete folder replaces an earlier save in one
        rename, so an error or a kill while saving leaves the earlier save whole and a reader never sees a mix;
        peft files of an earlier save that this one does not write are removed, other files in the folder are kept.
        With `push_to_hub=True` the adapter is also uploaded; the
        keywords of `push_to_hub` (`repo_id`, default: the folder name, `commit_message`, `revision`, `create_pr`,
        ...) then apply. In a `Trainer` checkpoint folder (`checkpoint-<step>`) `model.safetensors` is added: the
        trainable weights under this model's key names, the only file `resume_from_checkpoint` reads. `tokenizer`
        (default: `self.tokenizer`, the one the model was loaded with) is saved into the same folder in the same swap,
        so that `AutoMemoryModelForCausalLM`, `MemoryModel.from_pretrained` and `AutoTokenizer.from_pretrained(dir)`
        find it.
        """
        if safe_serialization is not True:
            raise ValueError(
                f"hmt-adapters writes safetensors only; `safe_serialization` must be True, got {safe_serialization!r}."
            )
        push_kwargs = {k: kwargs.pop(k) for k in ("repo_id", *hub.PUSH_KWARGS) if k in kwargs}
        hub.refuse_unknown(
            "MemoryModel.save_pretrained",
            kwargs,
            [
                "state_dict",
                "is_main_process",
                "push_to_hub",
                "safe_serialization",
                "tokenizer",
                "repo_id",
                *hub.PUSH_KWARGS,
            ],
            " (adapter files are never sharded or converted)",
        )
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        if push_kwargs and not push_to_hub:
            raise ValueError(f"{sorted(push_kwargs)} only apply with `push_to_hub=True`.")
        if self._added_token_rows is not None and is_main_process:
            before, after = self._added_token_rows
            warnings.warn(
                f"The token embeddings grew from {before} to {after} rows (`resize_token_embeddings`): those rows are "
                "the backbone's, and the memory adapter does not hold them (a LoRA holds them only where its peft "
                "config lists the embeddings in `modules_to_save`); to load it, resize the base to the same size and "
                "restore their values.",
                UserWarning,
                stacklevel=2,
            )
        adapter_io.save_adapter(
            self,
            save_directory,
            state_dict=state_dict,
            is_main_process=is_main_process,
            trainer_weights=checkpoint.is_trainer_checkpoint(save_directory),
            tokenizer=tokenizer,
        )
        if push_to_hub and is_main_process:
            repo_id = push_kwargs.pop("repo_id", os.path.basename(os.path.normpath(os.fspath(save_directory))))
            card.push_adapter(self, repo_id, state_dict=state_dict, tokenizer=tokenizer, **push_kwargs)

    @classmethod
    def from_pretrained(  # type: ignore[override]  # a base model plus an adapter, not a checkpoint
        cls,
        base_model: nn.Module,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        is_trainable: bool = False,
        inplace: bool = False,
        **kwargs: Any,
    ) -> MemoryModel:
        """Wrap `base_model` with the adapter saved in a local directory or a Hub repo, as peft's `from_pretrained`.

        By default the model is for inference: in eval mode (dropout off), memory and peft weights frozen;
        `is_trainable=True` gives trainable memory and peft weights in train mode. `base_model` itself is not
        changed: when the adapter has a peft part (LoRA) it is loaded into a copy, unless `inplace=True` (no copy:
        peft's layers go into `base_model`). Either way its parameters get `requires_grad=False`, as with peft.
        Hub keywords: `revision`, `token`, `subfolder`, `cache_dir`, `local_files_only`, `force_download`; any other
        keyword must be a field of the adapter's config and overrides it (e.g. `use_retrieval=True`).
        """
        check_wrappable(base_model)
        return adapter_io.load_adapter(
            cls, base_model, pretrained_model_name_or_path, is_trainable=is_trainable, inplace=inplace, **kwargs
        )

    def create_model_card(
        self,
        repo_id: str | None = None,
        tags: list[str] | None = None,
        results: str | None = None,
        training: str | None = None,
    ) -> Any:
        """The model card `push_to_hub` uploads (a `huggingface_hub.ModelCard`: `.save(path)` writes the README of an
        adapter folder): method, base model, config, how to load it; `results` and `training` are markdown sections,
        `repo_id` the name its loading snippet uses."""
        return card.render_model_card(self, tags=tags, repo_id=repo_id, results=results, training=training)

    def push_to_hub(  # type: ignore[override]  # the adapter only: its own options
        self,
        repo_id: str,
        *,
        commit_message: str | None = None,
        commit_description: str | None = None,
        private: bool | None = None,
        token: str | bool | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        tags: list[str] | None = None,
        results: str | None = None,
        training: str | None = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Upload the adapter files and a generated model card to `repo_id` (transformers' keywords; `results` and
        `training` are markdown sections of the card; `tokenizer`, default `self.tokenizer`, is uploaded with the
        adapter); returns the commit info."""
        hub.refuse_unknown(
            "MemoryModel.push_to_hub",
            kwargs,
            [*hub.PUSH_KWARGS, "results", "training", "tokenizer"],
            " (adapter files are never sharded)",
        )
        return card.push_adapter(
            self,
            repo_id,
            commit_message=commit_message,
            commit_description=commit_description,
            private=private,
            token=token,
            revision=revision,
            create_pr=create_pr,
            tags=tags,
            results=results,
            training=training,
            tokenizer=self.tokenizer if tokenizer is None else tokenizer,
        )

    # ---- checks ----------------------------------------------------------------------------------------------

    def _check_inputs(self, input_ids: Any, attention_mask: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or min(input_ids.shape) < 1:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(
                f"`input_ids` must be a [batch, length >= 1] tensor of token ids with batch >= 1, got {shape}."
            )
        if input_ids.is_floating_point():
            raise ValueError(f"`input_ids` must hold integer token ids, got dtype {input_ids.dtype}.")
        vocab = self.adapter.vocab_size
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
            raise ValueError(
                f"`input_ids` must lie in [0, {vocab - 1}] (the backbone's vocabulary), got values in "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]."
            )
        if attention_mask is None:
            return input_ids, torch.ones_like(input_ids)
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            shape = (
                tuple(attention_mask.shape)
                if isinstance(attention_mask, torch.Tensor)
                else type(attention_mask).__name__
            )
            raise ValueError(
                f"`attention_mask` must have the shape of `input_ids` {tuple(input_ids.shape)}, got {shape}."
            )
        return input_ids, (attention_mask.to(input_ids.device) != 0).long()  # transformers' rule: nonzero attends

    @staticmethod
    def _check_labels(labels: Any, input_ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(labels, torch.Tensor) or labels.shape != input_ids.shape:
            shape = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
            raise ValueError(f"`labels` must have the shape of `input_ids` {tuple(input_ids.shape)}, got {shape}.")
        return labels.to(input_ids.device).long()

    def _check_trainable(self, labels: Any) -> None:
        """Refuse a training loss (labels, train mode, gradients on) on a model `from_pretrained` froze for inference
        while nothing was unfrozen since: its `backward` would fail with torch's "element 0 of tensors does not
        require grad", which does not say why (docs/adapters.md, "Eval mode by default")."""
        if labels is None or not self.training or not torch.is_grad_enabled() or not self.frozen_for_inference:
            return
        if any(p.requires_grad for p in self.parameters()):
            return
        raise RuntimeError(
            "No parameter of this model requires grad: it was loaded for inference (MemoryModel.from_pretrained and "
            "AutoMemoryModelForCausalLM freeze the memory and LoRA weights by default, as peft does), so this "
            "training loss would fail in backward ('element 0 of tensors does not require grad'). Load it with "
            "`is_trainable=True` to train it; to compute a loss without training, use `model.eval()` or "
            "`torch.no_grad()`."
        )

    def _state_signature(self) -> dict[str, Any]:
        """What a memory state depends on: the method's config (not its runtime switches) and the backbone's sizes."""
        config = {k: v for k, v in self.memory_config.saved_fields().items() if k != "bptt_depth"}
        return {**config, **self.adapter.facts()}

    def _check_state(self, state: MemoryState, batch_size: int) -> None:
        dtype = next(self.adapter.model.parameters()).dtype
        check_state(
            state,
            self.method,
            self._state_signature(),
            lambda tensors: self.memory.state_differences(tensors, dtype),
            batch_size,
        )

    @staticmethod
    def _loss(loss_sum: torch.Tensor, num_tokens: torch.Tensor, num_items_in_batch: Any) -> torch.Tensor:
        """Token-weighted mean cross-entropy (divided by `num_items_in_batch` under gradient accumulation).

        As transformers' `ForCausalLMLoss`: without targets (labels all -100) the mean is nan (0 / 0), the sum
        divided by `num_items_in_batch` is 0.
        """
        if num_items_in_batch is not None:
            denom = torch.as_tensor(num_items_in_batch, device=loss_sum.device, dtype=loss_sum.dtype)
        else:
            denom = num_tokens.to(loss_sum.dtype)
        return loss_sum / denom


def check_wrappable(model: nn.Module) -> None:
    """Refuse, before any work, a backbone memory cannot wrap: a `MemoryModel`, or what
    `backbones.wrapping.check_causal_lm` refuses (a bidirectional or encoder-decoder model, a prompt-learning peft
    model)."""
    inner = unwrap_causal_lm(model)
    if isinstance(model, MemoryModel) or isinstance(inner, MemoryModel):
        raise TypeError(
            f"This is already a MemoryModel ('{(model if isinstance(model, MemoryModel) else inner).method}'); wrap "
            "its backbone (`model.backbone`) instead, or load another adapter with MemoryModel.from_pretrained."
        )
    check_causal_lm(model)


def wrap_with_memory(
    model: nn.Module, method_or_config: str | MemoryConfig, *, freeze_backbone: bool = True, **overrides: Any
) -> MemoryModel:
    """Wrap a Hugging Face causal LM with a memory method.

    `method_or_config` is a method string (`"rmt"`, `"hmt"`, ...) whose config is built from `overrides`, or a
    config object (`overrides` then replace its fields). The backbone is frozen unless `freeze_backbone=False`.
    """
    check_wrappable(model)
    if isinstance(method_or_config, MemoryConfig):
        config = method_or_config.replace(**overrides) if overrides else method_or_config
    elif isinstance(method_or_config, str):
        config = get_method(method_or_config).make_config(method_or_config, **overrides)
    else:
        raise TypeError(
            f"`method_or_config` must be a method name {available_methods()} or a MemoryConfig, got "
            f"{type(method_or_config).__name__}."
        )
    return MemoryModel(model, config, freeze_backbone=freeze_backbone)
