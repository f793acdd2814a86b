"""The recall task: sample layout, scoring, and the curriculum of `train_recall`."""

from types import SimpleNamespace

import pytest
import torch

from hmt_adapters.tasks import RecallTask, train_recall
from hmt_adapters.tasks.recall import FIRST_DIGIT, FIRST_NOISE, KEY, QUERY


def test_sample_places_key_first_and_supervises_only_the_answer():
    task = RecallTask(segment_length=8, num_digits=4, vocab_size=64)
    batch = task.sample(16, gap=3, generator=torch.Generator().manual_seed(0))
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == labels.shape == (16, 5 * 8)
    for row in range(16):
        offset = int((ids[row, :8] == KEY).nonzero())
        key = ids[row, offset + 1 : offset + 5]
        assert torch.equal(key, ids[row, -4:])
        assert ((key >= FIRST_DIGIT) & (key < FIRST_NOISE)).all()
        assert not (ids[row, 8:-5] < FIRST_NOISE).any()
    assert (ids[:, -5] == QUERY).all()
    assert torch.equal(labels[:, -4:], ids[:, -4:])
    assert (labels[:, :-4] == -100).all()


class _Oracle(torch.nn.Module):
    """Predicts the true next token (or, with `constant`, always the first digit)."""

    def __init__(self, vocab: int, constant: bool = False):
        super().__init__()
        self.vocab, self.constant = vocab, constant

    def forward(self, input_ids):
        target = torch.full_like(input_ids, FIRST_DIGIT) if self.constant else input_ids.roll(-1, dims=1)
        return SimpleNamespace(logits=torch.nn.functional.one_hot(target, self.vocab).float())


def test_accuracy_scores_perfect_and_constant_predictors():
    task = RecallTask(vocab_size=64)
    assert task.accuracy(_Oracle(64), gap=2) == (1.0, 1.0)
    digit, exact = task.accuracy(_Oracle(64, constant=True), gap=2)
    assert 0.05 < digit < 0.15 and exact < 0.01


@pytest.mark.parametrize(
    "kwargs, name", [({"segment_length": 5}, "segment_length"), ({"vocab_size": 20}, "vocab_size")]
)
def test_invalid_task_names_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RecallTask(**kwargs)


class _Scalar(torch.nn.Module):
    """A model with one parameter whose loss is the parameter squared; records the gap of every batch."""

    def __init__(self, segment_length: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.segment_length, self.gaps = segment_length, []

    def forward(self, input_ids, labels):
        self.gaps.append(input_ids.shape[1] // self.segment_length - 2)
        return SimpleNamespace(loss=self.weight**2)


def test_curriculum_advances_revisits_earlier_gaps_and_stops_after_two_passes(monkeypatch):
    task = RecallTask()
    scores = iter([0.5, 0.96, 0.4, 0.97, 0.96, 0.99])
    monkeypatch.setattr(task, "accuracy", lambda model, gap, batch_size: (1.0, next(scores)))
    model = _Scalar(task.segment_length)
    history = train_recall(model, task, gaps=(0, 2, 5), max_steps=100, eval_every=2)
    assert [h["gap"] for h in history] == [0, 0, 2, 2, 5, 5]
    assert history[-1]["step"] == 12
    assert model.gaps[:4] == [0, 0, 0, 0]
    assert model.gaps[5::2] == [2, 2, 5, 5]
    assert model.gaps[4] == model.gaps[6] == 0 and set(model.gaps[8::2]) <= {0, 2}
    assert model.weight.item() < 1.0
