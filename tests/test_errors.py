"""Bad inputs and unsupported combinations raise errors that say what is wrong and what would work."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.method import MemoryMethod
from hmt_adapters.registry import _METHODS
from tiny import MAX_POSITIONS, random_ids, tiny_backbone


@dataclass
class _AttentionOnlyConfig(ha.MemoryConfig):
    method = "test_attention_only"


class _AttentionOnly(MemoryMethod):
    config_class = _AttentionOnlyConfig
    needs_attention = True


@pytest.fixture
def attention_method():
    ha.register_method("test_attention_only", _AttentionOnlyConfig, _AttentionOnly)
    yield "test_attention_only"
    _METHODS.pop("test_attention_only")


@pytest.mark.parametrize("family", ["mamba", "rwkv"])
def test_attention_methods_on_recurrent_backbones_name_method_backbone_and_alternatives(family, attention_method):
    with pytest.raises(NotImplementedError) as err:
        ha.wrap_with_memory(tiny_backbone(family), attention_method, segment_length=8)
    text = str(err.value)
    assert attention_method in text and family in text and "'hmt'" in text and "'rmt'" in text


def test_windows_that_do_not_fit_the_positions_fail_at_wrap_time():
    with pytest.raises(ValueError, match=r"window of 67 positions.*exceeds the backbone.s 64 positions.*at most 30"):
        ha.wrap_with_memory(tiny_backbone("opt"), "hmt", segment_length=MAX_POSITIONS - 31, sensory_length=32)


@pytest.mark.parametrize(
    ("method", "field", "value"),
    [("unimix", "memory_tokens", 40), ("rmt", "num_memory_tokens", 40), ("hmt", "sensory_length", 70)],
)
def test_memory_slots_that_fill_the_positions_alone_name_their_field(method, field, value):
    """Lowering `segment_length` cannot help when the memory slots alone exceed the positions: the error names
    the field that sizes them instead of a segment length below 1."""
    with pytest.raises(ValueError, match=rf"exceeds the backbone.s 64 positions.*slots alone.*lower `{field}`") as err:
        ha.wrap_with_memory(tiny_backbone("llama"), method, segment_length=16, **{field: value})
    assert "at most" not in str(err.value)


def test_wrap_rejects_unknown_methods_and_non_models():
    with pytest.raises(ValueError, match="Unknown memory method 'xl'"):
        ha.wrap_with_memory(tiny_backbone("llama"), "xl")
    with pytest.raises(TypeError, match="method name"):
        ha.wrap_with_memory(tiny_backbone("llama"), 3)
    with pytest.raises(TypeError, match="Hugging Face causal LM"):
        ha.wrap_with_memory(torch.nn.Linear(2, 2), "rmt")


def test_bad_forward_inputs():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    ids = random_ids(2, 10)
    with pytest.raises(ValueError, match=r"\[batch, length >= 1\].*\(10,\)"):
        model(input_ids=ids[0])
    with pytest.raises(ValueError, match=r"\[batch, length >= 1\].*\(2, 0\)"):
        model(input_ids=ids[:, :0])
    with pytest.raises(ValueError, match=r"must lie in \[0, 95\].*got values in \[96, 96\]"):
        model(input_ids=torch.full((1, 3), 96))
    with pytest.raises(ValueError, match="integer token ids"):
        model(input_ids=ids.float())
    with pytest.raises(
        ValueError, match=r"`attention_mask` must have the shape of `input_ids` \(2, 10\), got \(2, 9\)"
    ):
        model(input_ids=ids, attention_mask=torch.ones(2, 9))
    with pytest.raises(ValueError, match=r"`labels` must have the shape"):
        model(input_ids=ids, labels=ids[:, 1:])


def test_bad_streaming_state():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    other = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=8, sensory_length=2)
    with pytest.raises(ValueError, match="streams but the chunk has batch size 2"):
        model.step(random_ids(2, 4), model.init_memory(3))
    with pytest.raises(ValueError, match="belongs to method 'hmt'"):
        model.step(random_ids(1, 4), other.init_memory(1))
    with pytest.raises(TypeError, match="MemoryState"):
        model.step(random_ids(1, 4), {"memory": torch.zeros(1)})
    with pytest.raises(ValueError, match="`batch_size` must be an integer >= 1, got 0"):
        model.init_memory(0)


def test_rwkv_refuses_padded_batches():
    model = ha.wrap_with_memory(tiny_backbone("rwkv"), "hmt", segment_length=8, sensory_length=2)
    ids = random_ids(2, 12)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with pytest.raises(ValueError, match="RWKV ignores `attention_mask`"):
        model(input_ids=ids, attention_mask=mask)
