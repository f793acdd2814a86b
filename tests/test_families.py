"""Every method on 53 Hugging Face causal-LM families (tiny random configs): each cell either matches the bare
backbone with memory disabled and passes the method's round trips, or is refused with an error naming the method,
the family and the reason; and on every family that takes attention memory, memory reads are exact (Transformer-XL
with memory covering the document == the bare backbone). The support matrix in docs/support_matrix.md is this
matrix (`tools/results/support_matrix.json`)."""

from __future__ import annotations

import functools
import json
import os

import pytest
import torch
import torch.nn.functional as F
import transformers

import hmt_adapters as ha
from cases import METHOD_CASES
from tiny import (
    FAMILY_NAMES,
    FAMILY_VOCAB,
    HYBRID_ATTENTION_LAYERS,
    REFUSED,
    RELEASE_DEPENDENT,
    STATE_OUTSIDE_ATTENTION,
    family_backbone,
    layer_overrides,
    memory_read_error,
)

SEGMENT = 8
METHODS = tuple(METHOD_CASES)
MATRIX_JSON = os.path.join(os.path.dirname(__file__), "..", "tools", "results", "support_matrix.json")

INPUT_LEVEL = ("rmt", "hmt")


def expected_refusal(method: str, family: str) -> str | None:
    return None if method in INPUT_LEVEL else REFUSED.get(family)


CELLS = [(m, f) for f in FAMILY_NAMES for m in METHODS]
SUPPORTED = [(m, f) for m, f in CELLS if expected_refusal(m, f) is None]
ATTENTION_LEVEL = tuple(m for m in METHODS if m not in INPUT_LEVEL)


def lean_cells() -> list[tuple[str, str]]:
    """Heavier round trips (save/load, generate): each family with an input-level method (rmt/hmt alternating) and
    an attention-level one (rotating through all six; the other input-level method where they are refused)."""
    cells = []
    for i, family in enumerate(FAMILY_NAMES):
        second = ATTENTION_LEVEL[i % len(ATTENTION_LEVEL)]
        if expected_refusal(second, family):
            second = INPUT_LEVEL[(i + 1) % 2]
        cells += [(INPUT_LEVEL[i % 2], family), (second, family)]
    return cells


LEAN = lean_cells()


def ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, FAMILY_VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@functools.cache
def backbone(family: str) -> torch.nn.Module:
    """One tiny backbone per family, shared by its method wrappers (the memory attention delegates when unused)."""
    return family_backbone(family)


@functools.cache
def bare_logits(family: str) -> torch.Tensor:
    """The bare backbone's logits on each 8-token segment of `ids(2, 19)` alone, before any wrapping."""
    x = ids(2, 2 * SEGMENT + 3)
    with torch.no_grad():
        return torch.cat(
            [backbone(family)(input_ids=x[:, s : s + SEGMENT]).logits for s in range(0, x.shape[1], SEGMENT)], 1
        )


@functools.cache
def wrapped(method: str, family: str) -> ha.MemoryModel:
    bare_logits(family)
    kwargs = {"segment_length": SEGMENT, **METHOD_CASES[method], **layer_overrides(method, family)}
    return ha.wrap_with_memory(backbone(family), method, **kwargs).eval()


@pytest.mark.parametrize("method,family", CELLS)
def test_disabled_memory_equals_the_bare_backbone_or_the_cell_is_refused_with_its_reason(method, family):
    reason = expected_refusal(method, family)
    if reason is not None:
        with pytest.raises(NotImplementedError) as err:
            wrapped(method, family)
        message = str(err.value)
        assert f"'{method}'" in message and f"'{backbone(family).config.model_type}'" in message and reason in message
        return
    model = wrapped(method, family)
    with torch.no_grad(), model.disable_memory():
        logits = model(input_ids=ids(2, 2 * SEGMENT + 3)).logits
    torch.testing.assert_close(logits, bare_logits(family), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method,family", SUPPORTED)
def test_loss_gradients_and_streaming(method, family):
    model = wrapped(method, family)
    x = ids(2, 4 * SEGMENT, seed=1)
    model.zero_grad()
    out = model(input_ids=x, labels=x)
    hand = F.cross_entropy(out.logits[:, :-1].reshape(-1, FAMILY_VOCAB), x[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, hand, atol=1e-5, rtol=1e-5)
    params = dict(model.memory.named_parameters())  # K/V-store methods (transformer_xl, trams, ...) have none
    if params:
        out.loss.backward()
    for name, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    with torch.no_grad():
        state, parts, start = model.init_memory(2), [], 0
        for size in (5, 11, 3, 13):
            step, state = model.step(x[:, start : start + size], state)
            parts.append(step.logits)
            start += size
    torch.testing.assert_close(torch.cat(parts, dim=1), out.logits.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method,family", LEAN)
def test_save_load_and_greedy_generation(method, family, tmp_path):
    model = wrapped(method, family)
    prompt = ids(2, 2 * SEGMENT - 1, seed=2)
    out = model.generate(
        input_ids=prompt,
        max_new_tokens=SEGMENT + 2,
        min_new_tokens=SEGMENT + 2,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        teacher = model(input_ids=out.sequences[:, :-1]).logits[:, prompt.shape[1] - 1 :]
    torch.testing.assert_close(torch.stack(out.logits, dim=1), teacher, atol=3e-4, rtol=1e-3)
    teacher[..., model.generation_config.eos_token_id or 0] = -torch.inf  # min_new_tokens masks eos
    assert torch.equal(out.sequences[:, prompt.shape[1] :], teacher.argmax(-1))
    model.save_pretrained(tmp_path)
    loaded = ha.MemoryModel.from_pretrained(family_backbone(family), str(tmp_path)).eval()
    x = ids(2, 3 * SEGMENT, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=x).logits, model(input_ids=x).logits, atol=0, rtol=0)


@pytest.mark.parametrize("family", sorted(HYBRID_ATTENTION_LAYERS))
@pytest.mark.parametrize("method", ["transformer_xl", "memorizing_transformer", "elastic", "melodi", "infllm", "armt"])
def test_hybrids_take_attention_memory_in_their_attention_layers_by_default_and_refuse_others(method, family):
    """A method's default layers (every layer, the middle and last, 3/4 depth, ...) pick among a hybrid's attention
    layers; a layer without attention named explicitly is a `ValueError` naming the attention layers."""
    base = family_backbone(family)
    model = ha.wrap_with_memory(base, method, segment_length=SEGMENT, **METHOD_CASES[method])
    memory = model.memory
    layers = {*getattr(memory, "layers", ()), *getattr(memory, "memory_layers", ())}
    layers |= {*getattr(memory, "short_term_layers", ()), getattr(memory, "long_term_layer", None)} - {None}
    assert layers == set(HYBRID_ATTENTION_LAYERS[family])
    field = dict(short_term_layers=[0], long_term_layer=0) if method == "melodi" else dict(memory_layers=[0])
    with pytest.raises(ValueError, match=rf"attention layers of this hybrid '{family}' backbone, \[1\]; got \[0"):
        ha.wrap_with_memory(base, method, segment_length=SEGMENT, **METHOD_CASES[method], **field)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "phi", "qwen3_moe", "mamba2", "falcon_h1", "jamba"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_backbones_train_in_their_dtype(family, dtype):
    methods = INPUT_LEVEL if REFUSED.get(family) else ("hmt", "unimix", "melodi")  # methods with parameters
    for method in methods:
        kwargs = {"segment_length": SEGMENT, **METHOD_CASES[method], **layer_overrides(method, family)}
        model = ha.wrap_with_memory(family_backbone(family, dtype=dtype), method, **kwargs)
        x = ids(1, 2 * SEGMENT + 3)
        out = model(input_ids=x, labels=x)
        assert out.logits.dtype == dtype and torch.isfinite(out.loss)
        out.loss.backward()
        for p in model.memory_parameters():
            assert p.dtype == dtype and p.grad is not None and torch.isfinite(p.grad).all()


# families whose attention takes memory and whose whole state is attention: memory covering the document is a full read
MEMORY_READ_FAMILIES = [f for f in FAMILY_NAMES if not REFUSED.get(f) and f not in STATE_OUTSIDE_ATTENTION]
MEMORY_READ_TOLERANCE = 1e-5  # fp32 noise is ~1e-7; a key re-rotated with another family's RoPE is off by ~1e-3


@pytest.mark.parametrize("family", MEMORY_READ_FAMILIES)
def test_memory_reads_are_exact_xl_covering_the_document_equals_the_bare_backbone(family):
    """A family is supported only when memory keys are what its own attention computes at their positions: its own
    RoPE function (interleaved pairs in Cohere, GLM, Helium, ERNIE 4.5, GPT-J, CodeGen; partial rotary), QK-norm,
    MQA, learned positions, MoE, scaled logits."""
    assert memory_read_error(family) < MEMORY_READ_TOLERANCE


def test_the_readme_support_matrix_is_this_matrix():
    """`tools/results/support_matrix.json` (rendered into docs/support_matrix.md) records exactly these cell
    outcomes and, per family, whether memory reads were checked exact."""
    with open(MATRIX_JSON) as f:
        recorded = json.load(f)
    # the file is this matrix on the release it records; on another release, the families whose outcome depends on
    # the release (tests/tiny.py RELEASE_DEPENDENT) are compared only where it records them
    other = () if recorded["transformers"] == transformers.__version__ else RELEASE_DEPENDENT
    expected = {f"{m}/{f}": ("refused" if expected_refusal(m, f) else "yes") for m, f in CELLS if f not in other}
    cells = {key: cell["outcome"] for key, cell in recorded["cells"].items() if key.split("/")[1] not in other}
    assert cells == expected
    reads = {f: "exact" for f in MEMORY_READ_FAMILIES}
    reads.update({f: "refused" for f in REFUSED})
    reads.update({f: "state outside attention" for f in STATE_OUTSIDE_ATTENTION})
    recorded_reads = {f: entry["outcome"] for f, entry in recorded["memory_reads"].items() if f not in other}
    assert recorded_reads == {f: outcome for f, outcome in reads.items() if f not in other}


def test_layers_that_reuse_earlier_layers_keys_and_values_are_refused():
    """Gemma 4 (as Gemma 3n) can make its last layers reuse the keys and values of earlier ones, which per-layer
    memory does not follow: refused by name (the matrix's Gemma 4 has none and reads memory exactly)."""
    shared = dict(num_hidden_layers=3, num_kv_shared_layers=1)  # layer 2 reuses layer 1's keys and values
    shared["layer_types"] = ["sliding_attention", "full_attention", "full_attention"]
    with pytest.raises(NotImplementedError, match="reuse the keys and values of earlier ones"):
        ha.wrap_with_memory(family_backbone("gemma4_text", config_fields=shared), "armt", segment_length=SEGMENT)


@pytest.mark.parametrize("method", INPUT_LEVEL + ("infllm",))
def test_per_layer_token_embeddings_are_refused_naming_the_field(method):
    """Gemma 4's per-layer inputs are looked up by token id, which memory slots lack: refused before any work."""
    base = family_backbone("gemma4_text", config_fields=dict(hidden_size_per_layer_input=16))
    with pytest.raises(NotImplementedError, match=r"config\.hidden_size_per_layer_input=16"):
        ha.wrap_with_memory(base, method, segment_length=SEGMENT, **METHOD_CASES[method])
