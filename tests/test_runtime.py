"""The segment runtime: spans, targets across segment boundaries, memory-saving switches, tails."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.memory import append_tail
from hmt_adapters.runtime import offload, segment_spans, shift_targets
from hmt_adapters.training import add_lora
from tiny import random_ids, tiny_backbone


def test_segment_spans_cover_the_input_with_a_ragged_last_segment():
    assert segment_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert segment_spans(8, 4) == [(0, 4), (4, 8)]
    assert segment_spans(3, 4) == [(0, 3)]


def test_targets_shift_across_segment_boundaries():
    labels = torch.tensor([[5, 6, 7, -100, 9]])
    assert shift_targets(labels).tolist() == [[6, 7, -100, 9, -100]]


def test_tails_keep_the_last_real_tokens_right_aligned():
    ids, mask = torch.tensor([[1, 2, 3]]), torch.tensor([[1, 1, 0]])
    tail_ids, tail_mask = append_tail(
        torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long), ids, mask, 4
    )
    assert tail_mask.tolist() == [[0, 0, 1, 1]] and tail_ids[:, 2:].tolist() == [[1, 2]]
    tail_ids, tail_mask = append_tail(
        tail_ids, tail_mask, torch.tensor([[7, 8, 9]]), torch.ones(1, 3, dtype=torch.long), 4
    )
    assert tail_ids.tolist() == [[2, 7, 8, 9]] and tail_mask.tolist() == [[1, 1, 1, 1]]


SWITCHES = [
    dict(),
    dict(offload_activations=True),
    dict(gradient_checkpointing=True),
    dict(offload_activations=True, gradient_checkpointing=True),
]


@pytest.mark.parametrize(
    "method,kw", [("hmt", dict(sensory_length=3, memory_window=4)), ("rmt", dict(num_memory_tokens=2))]
)
def test_offload_and_checkpointing_give_the_same_loss_and_gradients(method, kw, monkeypatch):
    packed = []
    original_pack = offload.ActivationOffload._pack

    def counting_pack(self, t):
        packed.append(offload._storage_ptr(t) in self.param_ptrs)
        return original_pack(self, t)

    monkeypatch.setattr(offload.ActivationOffload, "_pack", counting_pack)
    ids = random_ids(2, 5 * 8 + 3)
    results = []
    for switches in SWITCHES:
        model = ha.wrap_with_memory(tiny_backbone("llama"), method, segment_length=8, **kw, **switches)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.memory.named_parameters()}))
    assert packed and not all(packed), "the offload hooks never saw an activation"
    ref_loss, ref_grads = results[0]
    for loss, grads in results[1:]:
        torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], atol=1e-6, rtol=1e-5)


def test_num_items_in_batch_divides_the_summed_loss():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    ids = random_ids(2, 20)
    out = model(input_ids=ids, labels=ids)
    summed = model(input_ids=ids, labels=ids, num_items_in_batch=1).loss
    torch.testing.assert_close(summed / out.num_tokens, out.loss)


def test_streaming_loss_covers_targets_inside_each_chunk():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=8, sensory_length=2).eval()
    ids = random_ids(1, 20)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        out, _ = model.step(ids[:, 12:], model.step(ids[:, :12])[1], labels=ids[:, 12:])
    ref = torch.nn.functional.cross_entropy(logits[0, 12:-1], ids[0, 13:])
    torch.testing.assert_close(out.loss, ref, atol=1e-5, rtol=1e-4)


def test_state_detaches_moves_and_survives_a_disk_round_trip(tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=8, sensory_length=2).eval()
    ids = random_ids(2, 30)
    with torch.no_grad():
        _, state = model.step(ids[:, :19])
        expected, _ = model.step(ids[:, 19:], state)
    state.save(tmp_path / "state.safetensors")
    restored = ha.MemoryState.load(tmp_path / "state.safetensors")
    assert restored.segments_seen == 2 and restored.pending_length == 3
    with torch.no_grad():
        again, _ = model.step(ids[:, 19:], restored.to("cpu").detach())
    torch.testing.assert_close(again.logits, expected.logits, atol=0, rtol=0)


def test_offload_hooks_leave_parameters_small_and_host_tensors_in_place():
    layer = torch.nn.Linear(64, 64)
    hooks = offload.ActivationOffload([layer], min_bytes=0)
    assert hooks._pack(layer.weight) is layer.weight
    assert hooks._pack(layer.weight.t()) is not None and offload._storage_ptr(layer.weight.t()) in hooks.param_ptrs
    host = torch.randn(128, 128)
    assert hooks._pack(host) is host  # already in CPU memory
    big = offload.ActivationOffload([layer])
    assert big.min_bytes == offload.MIN_OFFLOAD_BYTES


def last_segment_labels(ids: torch.Tensor, segment_length: int, first: int | None = None) -> torch.Tensor:
    """Labels of the HMT reference's protocol: targets only for predictions made inside the last segment."""
    labels = torch.full_like(ids, -100)
    start = ids.shape[1] - segment_length + 1 if first is None else first
    labels[:, start:] = ids[:, start:]
    return labels


def count_head_calls(model: ha.MemoryModel) -> list[int]:
    calls = []
    model.adapter.model.get_output_embeddings().register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_a_stream_in_short_chunks_runs_the_head_once_per_token_with_the_forward_logits():
    """Pending tokens are read again to rebuild their segment, but their logits came with their own chunk: the LM
    head sees each streamed token once (at chunks of a quarter segment it saw 2.5x as many), the logits unchanged."""
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=8, sensory_length=2).eval()
    ids = random_ids(2, 24)
    rows = []
    head = model.adapter.model.get_output_embeddings()
    head.register_forward_hook(lambda _module, args, _out: rows.append(args[0].shape[1]))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        rows.clear()
        state, parts = None, []
        for start in range(0, 24, 2):
            out, state = model.step(ids[:, start : start + 2], state)
            parts.append(out.logits)
    assert sum(rows) == 24 and state.pending_length == 0
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-4)
    state = model.init_memory(2)
    with pytest.raises(ValueError, match="logits_from=3"):
        model.runtime.run(ids, torch.ones_like(ids), ids, state, logits_from=3)
    with torch.no_grad():  # every column left out: the segments are read, no logits come back
        assert model.runtime.run(ids, torch.ones_like(ids), None, state, logits_from=24).logits is None
    with pytest.raises(ValueError, match=r"\[0, 24\].*got 25"):
        model.runtime.run(ids, torch.ones_like(ids), None, state, logits_from=25)


@pytest.mark.parametrize("switches", SWITCHES, ids=["plain", "offload", "checkpoint", "both"])
def test_last_segment_loss_skips_the_head_of_unsupervised_segments_with_the_same_loss_and_gradients(switches):
    ids = random_ids(2, 5 * 8)
    labels = last_segment_labels(ids, 8)
    results = []
    for keep in (True, False):
        backbone = add_lora(tiny_backbone("llama"), rank=2, dropout=0.0)
        model = ha.wrap_with_memory(backbone, "hmt", segment_length=8, sensory_length=3, memory_window=4, **switches)
        calls = count_head_calls(model)
        out = model(input_ids=ids, labels=labels, return_logits=keep)
        forward_calls = len(calls)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        for group in ("memory.", "lora_B"):  # gradients reach the memory and LoRA through the unsupervised segments
            assert sum(float(g.abs().sum()) for n, g in grads.items() if group in n) > 0
        results.append((out.loss.detach(), out.num_tokens, grads, (forward_calls, len(calls))))
        assert (out.logits is None) == (not keep)
    (loss, count, grads, calls), (skip_loss, skip_count, skip_grads, skip_calls) = results
    recompute = 2 if switches.get("gradient_checkpointing") else 1  # checkpointing runs the supervised segment again
    assert calls[0] == 5 and skip_calls == (1, recompute)
    assert count == skip_count == 2 * 7
    torch.testing.assert_close(skip_loss, loss, atol=0, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(skip_grads[name], grad, atol=1e-7, rtol=1e-6)


def test_a_segment_with_one_target_keeps_its_head_and_a_segment_nothing_reads_is_skipped():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    ids = random_ids(1, 4 * 8)
    calls = count_head_calls(model)
    model(input_ids=ids, labels=last_segment_labels(ids, 8, first=24), return_logits=False)  # position 23 predicts 24
    assert len(calls) == 2
    ran = []
    model.adapter.body_module.register_forward_hook(lambda *_: ran.append(1))
    with model.disable_memory():  # no memory to write: unsupervised segments are not run at all
        out = model(input_ids=ids, labels=last_segment_labels(ids, 8), return_logits=False)
    assert len(ran) == 1 and int(out.num_tokens) == 7


def test_a_batch_without_any_target_still_has_a_differentiable_loss():
    """As transformers: the mean over no target is nan; the Trainer's sum / num_items_in_batch is a zero backward can
    run."""
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    ids = random_ids(2, 24)
    labels = torch.full_like(ids, -100)
    assert torch.isnan(model(input_ids=ids, labels=labels).loss)
    out = model(input_ids=ids, labels=labels, num_items_in_batch=4)
    out.loss.backward()
    assert float(out.loss.detach()) == 0 and int(out.num_tokens) == 0
    assert all(float(p.grad.abs().sum()) == 0 for p in model.memory_parameters())


def test_logits_are_kept_except_in_a_trainer_training_step():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    ids = random_ids(2, 20)
    assert model.training and model(input_ids=ids, labels=ids).logits.shape == (2, 20, 96)  # the public contract
    assert model(input_ids=ids, labels=ids, num_items_in_batch=10).logits is None  # what Trainer.training_step passes
    assert model(input_ids=ids, labels=ids, num_items_in_batch=10, return_logits=True).logits.shape == (2, 20, 96)
    with torch.no_grad():  # Trainer.prediction_step: no gradients, logits for prediction_loss_only=False
        assert model.eval()(input_ids=ids, labels=ids, num_items_in_batch=10).logits.shape == (2, 20, 96)


@pytest.mark.parametrize("method", ["rmt", "transformer_xl"])
def test_logits_without_gradients_are_written_into_one_tensor_equal_to_the_concatenated_segments(method):
    """Without gradients each segment's logits are copied into one `[B, T, V]` tensor (`SegmentRows`); with them
    they are concatenated. Both give the same rows, a ragged last segment and a padded row included, and the
    hidden states (`keep_hidden`) are joined the same way."""
    model = ha.wrap_with_memory(tiny_backbone("llama"), method, segment_length=8).eval()
    ids = random_ids(2, 21)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding: packed, then unpacked
    with torch.no_grad():
        written = model(input_ids=ids, attention_mask=mask).logits
        hidden = model.hidden_states(ids, mask)
    joined = model(input_ids=ids, attention_mask=mask).logits  # gradients on: the segments concatenated
    assert joined.requires_grad == (method == "rmt")  # Transformer-XL has no parameter of its own to train
    assert not written.requires_grad and written.shape == (2, 21, 96)
    torch.testing.assert_close(written, joined.detach(), atol=0, rtol=0)
    real = mask.bool()
    torch.testing.assert_close(model.adapter.logits(hidden)[real], written[real], atol=1e-5, rtol=1e-5)


def test_offload_under_bf16_autocast_moves_no_parameter_cast_and_keeps_gradients(monkeypatch):
    """Autocast casts fp32 weights to bf16 on every use and linear layers save the cast: those must stay in place."""
    monkeypatch.setattr(offload.ActivationOffload, "host_device_types", ())  # meter CPU tensors as if on a GPU
    monkeypatch.setattr(offload, "MIN_OFFLOAD_BYTES", 0)
    moved = []
    original_pack = offload.ActivationOffload._pack

    def metering_pack(self, t):
        packed = original_pack(self, t)
        if packed is not t:
            moved.append(t.detach().clone())
        return packed

    monkeypatch.setattr(offload.ActivationOffload, "_pack", metering_pack)
    ids = random_ids(2, 4 * 8)
    results = []
    for switches in (dict(), dict(offload_activations=True)):
        torch.manual_seed(0)
        model = ha.wrap_with_memory(
            add_lora(tiny_backbone("llama"), rank=2, dropout=0.0),
            "hmt",
            segment_length=8,
            sensory_length=3,
            memory_window=4,
            **switches,
        )
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    params = [p.detach() for p in model.parameters()]

    def is_cast_of_a_parameter(t):  # by value: the tensor equals some parameter cast to its dtype (or its transpose)
        views = [t, t.mT] if t.dim() == 2 else [t]
        return any(
            v.shape == p.shape and v.dtype != p.dtype and torch.equal(v, p.to(v.dtype)) for v in views for p in params
        )

    assert len(moved) > 50 and {t.dtype for t in moved} >= {torch.bfloat16, torch.float32}
    assert not [tuple(t.shape) for t in moved if is_cast_of_a_parameter(t)]
    (ref_loss, ref_grads), (loss, grads) = results
    torch.testing.assert_close(loss, ref_loss, atol=0, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=0, rtol=0)


def test_parameter_casts_are_recognised_in_and_out_of_the_graph():
    frozen, trainable = torch.nn.Linear(8, 16).requires_grad_(False), torch.nn.Parameter(torch.randn(4, 8))
    hooks = offload.ActivationOffload([frozen, torch.nn.ParameterList([trainable])], min_bytes=0)
    cast = frozen.weight.to(torch.bfloat16)
    assert hooks.is_parameter_cast(cast) and hooks.is_parameter_cast(cast.t())
    assert hooks.is_parameter_cast(trainable.to(torch.bfloat16).t())
    activation = torch.randn(3, 16, 8, requires_grad=True)
    assert not hooks.is_parameter_cast(activation.to(torch.bfloat16))
    assert not hooks.is_parameter_cast(torch.randn(16, 8))
    assert not hooks.is_parameter_cast((trainable * 2).to(torch.bfloat16))  # computed from a weight: an activation
