"""The plain HF `Trainer` on a `MemoryModel`: adapter-only checkpoints, exact resume, save/load, checkpointing
switch."""

from __future__ import annotations

import os

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import Trainer, TrainingArguments

import hmt_adapters as ha
from hmt_adapters.data import WindowCollator
from hmt_adapters.saving.checkpoint import trainable_keys
from tiny import random_ids, tiny_backbone

HMT = dict(segment_length=8, sensory_length=2, memory_window=4)


def hmt_model(family: str = "llama", **kw) -> ha.MemoryModel:
    return ha.wrap_with_memory(tiny_backbone(family), "hmt", **{**HMT, **kw})


# transformers' current name for the switch (`gradient_checkpointing`, its older name, is now a deprecated alias)
CHECKPOINTING = next(
    n for n in ("activation_checkpointing", "gradient_checkpointing") if n in TrainingArguments.__dataclass_fields__
)


def train(model: ha.MemoryModel, out, max_steps: int = 4, resume: str | None = None, **args) -> list[float]:
    data = Dataset.from_dict({"input_ids": random_ids(8, 24).tolist()})
    arguments = TrainingArguments(
        str(out),
        max_steps=max_steps,
        save_steps=2,
        logging_steps=1,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        **args,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=data, data_collator=WindowCollator())
    trainer.train(resume_from_checkpoint=resume)
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_checkpoints_hold_the_adapter_and_save_model_reloads(tmp_path):
    model = hmt_model()
    train(model, tmp_path, max_steps=2)
    checkpoint = tmp_path / "checkpoint-2"
    weights = load_file(checkpoint / "model.safetensors")
    assert set(weights) == trainable_keys(model) and all(k.startswith("memory.") for k in weights)
    assert {"memory_config.json", "memory_adapter.safetensors", "optimizer.pt"} <= set(os.listdir(checkpoint))
    Trainer(model=model, args=TrainingArguments(str(tmp_path), report_to="none", use_cpu=True)).save_model(
        str(tmp_path / "final")
    )
    assert sorted(os.listdir(tmp_path / "final")) == [
        "config.json",
        "memory_adapter.safetensors",
        "memory_config.json",
        "training_args.bin",
    ]
    reloaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path / "final")).eval()
    ids = random_ids(2, 30, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits, atol=0, rtol=0)


def test_two_steps_resumed_for_two_more_equal_four_straight_steps(tmp_path):
    straight = hmt_model()
    losses = train(straight, tmp_path / "a")
    resumed = hmt_model()
    resumed_losses = train(resumed, tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed_losses[2:] == pytest.approx(losses[2:], abs=1e-6)
    for name, value in straight.memory.state_dict().items():
        torch.testing.assert_close(resumed.memory.state_dict()[name], value, atol=1e-6, rtol=1e-5)


def test_trainer_gradient_checkpointing_switches_per_segment_checkpointing_and_offload(tmp_path):
    plain = train(hmt_model(), tmp_path / "a", max_steps=2)
    model = hmt_model()
    checkpointed = train(model, tmp_path / "b", max_steps=2, **{CHECKPOINTING: True})
    assert model.memory_config.gradient_checkpointing and model.is_activation_checkpointing
    assert not model.memory_config.offload_activations
    assert checkpointed == pytest.approx(plain, abs=1e-6)
    both = hmt_model()
    offloaded = train(
        both, tmp_path / "c", max_steps=2, **{CHECKPOINTING: True, f"{CHECKPOINTING}_kwargs": {"offload": True}}
    )
    assert both.memory_config.gradient_checkpointing and both.memory_config.offload_activations
    assert offloaded == pytest.approx(plain, abs=1e-6)
    model.activation_checkpointing_disable()
    assert not model.memory_config.gradient_checkpointing
    with pytest.raises(ValueError, match="non-reentrant"):
        model.activation_checkpointing_enable({"use_reentrant": True})


@pytest.mark.parametrize(
    "other, message",
    [
        (lambda: hmt_model(use_retrieval=False), "another memory method, config.*use_retrieval=True"),
        (lambda: ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8), "another memory method"),
        (lambda: ha.wrap_with_memory(tiny_backbone("llama", hidden_size=48), "hmt", **HMT), "another backbone"),
    ],
)
def test_resuming_a_checkpoint_of_another_method_or_backbone_is_a_clear_error(tmp_path, other, message):
    train(other(), tmp_path / "a", max_steps=2)
    with pytest.raises(ValueError, match=message):
        train(hmt_model(), tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-2"))
    assert not (tmp_path / "b").exists() or not any(
        p.name.startswith("checkpoint") for p in (tmp_path / "b").iterdir()
    )


def test_load_state_dict_accepts_a_full_state_dict_and_reports_only_trainable_gaps():
    model, other = hmt_model(), hmt_model()
    assert model.load_state_dict(other.state_dict()) is not None
    result = model.load_state_dict({k: v for k, v in other.state_dict().items() if k.startswith("memory.")})
    assert result.missing_keys == [] and result.unexpected_keys == []


def test_trainer_steps_run_the_head_only_on_supervised_segments_and_evaluation_keeps_logits(tmp_path):
    model = hmt_model()
    calls = []
    model.adapter.model.get_output_embeddings().register_forward_hook(lambda *_: calls.append(1))
    ids = random_ids(4, 24)
    labels = torch.full_like(ids, -100)
    labels[:, 17:] = ids[:, 17:]  # predictions inside the last of 3 segments only
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})
    arguments = TrainingArguments(
        str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=4,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        prediction_loss_only=False,
    )
    trainer = Trainer(
        model=model, args=arguments, train_dataset=data, eval_dataset=data, data_collator=WindowCollator()
    )
    trainer.train()
    assert len(calls) == 2  # one supervised segment per step, not three
    prediction = trainer.predict(data)
    assert prediction.predictions.shape == (4, 24, 96) and len(calls) == 2 + 3  # the logits, not a tuple


def test_window_collator_honours_each_rows_attention_mask():
    """Rows padded before the collator (`datasets.map` with `padding="max_length"`) train on their real tokens only:
    the loss equals the one of the same rows unpadded, whatever the padding holds."""
    model = hmt_model().eval()
    rows = [random_ids(1, n, seed=n)[0].tolist() for n in (19, 12)]
    padded = [
        {"input_ids": r + [7] * (24 - len(r)), "attention_mask": [1] * len(r) + [0] * (24 - len(r))} for r in rows
    ]
    batch = WindowCollator()(padded)
    assert torch.equal(batch["labels"][1, 12:], torch.full((12,), -100))
    plain = WindowCollator()([{"input_ids": r} for r in rows])
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).loss, model(**plain).loss, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match=r"Row 0: `attention_mask` has shape \(3,\) but `input_ids` has \(24,\)"):
        WindowCollator()([{"input_ids": padded[0]["input_ids"], "attention_mask": [1, 1, 1]}])


def test_compute_metrics_receives_the_logits_as_from_any_causal_lm(tmp_path):
    """`EvalPrediction.predictions` is the `[rows, tokens, vocab]` logits array, not a (logits, num_tokens) tuple."""
    model = hmt_model().eval()
    data = Dataset.from_dict({"input_ids": random_ids(4, 20, seed=5).tolist()})
    seen = {}

    def compute_metrics(pred):
        seen["predictions"] = pred.predictions
        top1 = pred.predictions[:, :-1].argmax(-1)
        return {"accuracy": float((top1 == pred.label_ids[:, 1:]).mean())}

    args = TrainingArguments(str(tmp_path), per_device_eval_batch_size=2, report_to="none", use_cpu=True)
    metrics = Trainer(
        model=model, args=args, eval_dataset=data, data_collator=WindowCollator(), compute_metrics=compute_metrics
    ).evaluate()
    ids = torch.tensor(data["input_ids"])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    assert not isinstance(seen["predictions"], tuple)
    torch.testing.assert_close(torch.from_numpy(seen["predictions"]), expected, atol=1e-5, rtol=1e-5)
    assert metrics["eval_accuracy"] == pytest.approx(float((expected[:, :-1].argmax(-1) == ids[:, 1:]).float().mean()))
