"""benchmarks/real_text.py: the parts of the real-text comparison that can be wrong without failing loudly (the
held-out split, the position buckets, the training windows, equal starting points and the sliding-window baseline)."""

from __future__ import annotations

import math

import pytest
import torch

import real_text as rt  # noqa: E402

VOCAB = 96


@pytest.fixture(scope="module")
def split() -> dict:
    return rt.documents()


def test_held_out_documents_are_exactly_the_named_ones_and_never_trained_on(split):
    held = {(c, t) for c, t, _ in split["held_out"]}
    assert held == {("austen", "Persuasion"), ("kjv", "Jeremiah"), ("essays", "worked"), ("essays", "popular")}
    train_titles = {(c, t) for c, t, _ in split["train"]}
    assert not held & train_titles
    assert len(train_titles) == len(split["train"]) == 5 + 65 + 47  # every other document trains, once
    train_texts = {text for _, _, text in split["train"]}
    for _, title, text in split["held_out"]:
        assert text not in train_texts
        probe = text[len(text) // 2 : len(text) // 2 + 300]  # a passage from its middle occurs in no training text
        assert not any(probe in t for t in train_texts), title


def test_position_buckets_partition_the_targets_and_weight_back_to_the_mean():
    nll = torch.rand(3000, generator=torch.Generator().manual_seed(0)) * 5
    stats = rt.bucket_stats(nll)
    # target i predicts the token at position i + 1: positions 1..511 | 512..2047 | 2048..3000
    assert [s["tokens"] for s in stats.values()] == [511, 1536, 953]
    weighted = sum(s["tokens"] * math.log(s["ppl"]) for s in stats.values()) / nll.numel()
    assert weighted == pytest.approx(float(nll.double().mean()), rel=1e-12)
    assert sum(s["nll_sum"] for s in stats.values()) == pytest.approx(float(nll.double().sum()), rel=1e-12)
    pooled = rt.pooled({"a": stats, "b": rt.bucket_stats(nll[:600])})
    late = stats["2048-8192"]
    assert pooled["2048-8192"] == pytest.approx(late["ppl"])  # the short document adds nothing late
    assert pooled["0-512"] == pytest.approx(stats["0-512"]["ppl"])  # same first 511 targets twice


def test_training_windows_are_whole_document_slices_in_a_seeded_order():
    docs = [list(range(1000, 1000 + 1300)), list(range(5000, 5000 + 600)), list(range(9000, 9100))]
    windows = rt.training_windows(docs, 7, seed=3)
    assert windows.shape == (7, rt.WINDOW)
    tiles = {tuple(docs[0][:512]), tuple(docs[0][512:1024]), tuple(docs[1][:512])}  # the short document gives none
    assert {tuple(w) for w in windows.tolist()} == tiles  # 3 windows, shuffled again after each pass
    assert torch.equal(windows, rt.training_windows(docs, 7, seed=3))
    assert not torch.equal(windows, rt.training_windows(docs, 7, seed=4))


def test_every_run_starts_from_the_same_backbone_weights():
    reference = rt.build("full_attention", VOCAB).state_dict()
    for name in rt.RUNS:
        model = rt.build(name, VOCAB, rt.init_seed(name))
        backbone = model.adapter.model if hasattr(model, "adapter") else model
        weights = backbone.state_dict()
        same = all(torch.equal(weights[k], v) for k, v in reference.items())
        assert same == (name != "sliding_window_seed1"), name


def test_every_run_trains_on_the_same_tokens():
    windows = torch.randint(0, VOCAB, (6, 2 * rt.SEGMENT), generator=torch.Generator().manual_seed(0))
    for name in ("sliding_window", "rmt"):
        seen = []
        model = rt.build(name, VOCAB)
        forward = model.forward
        model.forward = lambda input_ids, labels: seen.append(input_ids) or forward(input_ids=input_ids, labels=labels)  # noqa: B023 (this iteration)
        row = rt.train(model, windows, batch=2)
        assert row["steps"] == 3
        assert torch.equal(torch.cat(seen), windows)


def test_one_layer_sliding_window_equals_full_attention_on_each_hand_cut_window(monkeypatch):
    monkeypatch.setitem(rt.BACKBONE, "num_hidden_layers", 1)
    windowed, full = rt.build("sliding_window", VOCAB).eval(), rt.build("full_attention", VOCAB).eval()
    ids = torch.randint(0, VOCAB, (3 * rt.SEGMENT + 17,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = windowed(input_ids=ids[None]).logits[0]
        for t in (0, 5, rt.SEGMENT - 1, rt.SEGMENT, rt.SEGMENT + 30, ids.numel() - 1):
            cut = ids[max(0, t - rt.SEGMENT + 1) : t + 1]  # the token and the SEGMENT - 1 before it
            torch.testing.assert_close(logits[t], full(input_ids=cut[None]).logits[0, -1], atol=2e-5, rtol=1e-4)
        assert not torch.allclose(logits[-1], full(input_ids=ids[None]).logits[0, -1], atol=1e-3)  # the mask matters


def test_sliding_window_evaluation_equals_one_forward_over_the_whole_document():
    windowed = rt.build("sliding_window", VOCAB).eval()
    layers = windowed.config.num_hidden_layers
    ids = torch.randint(0, VOCAB, (3 * rt.WINDOW + 17,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = windowed(input_ids=ids[None]).logits[0]
        receptive = layers * (rt.SEGMENT - 1) + 1  # each layer reaches SEGMENT - 1 tokens further back
        t = ids.numel() - 1
        torch.testing.assert_close(
            windowed(input_ids=ids[None, t - receptive + 1 :]).logits[0, -1], logits[t], atol=2e-5, rtol=1e-4
        )
    expected = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")
    torch.testing.assert_close(rt.document_nll("sliding_window", windowed, ids)["nll"], expected, atol=2e-5, rtol=1e-4)


def test_readme_marks_each_ordering_with_its_two_numbers_and_the_noise():
    def row(late: float) -> dict:
        ppl = {"0-512": 300.0, "512-2048": 290.0, rt.LATE: late}
        return {
            "ppl": ppl,
            "per_document": {"d": {rt.LATE: {"ppl": late}}},
            "parameters": 1,
            "memory_floats": None,
            "train_seconds": 1.0,
            "description": "x",
        }

    late = {
        "sliding_window": 100.0,
        "sliding_window_seed1": 102.0,
        "hmt": 90.0,
        "rmt": 95.0,
        "trams": 101.0,
        "transformer_xl": 101.0,
        "elastic": 110.0,
        "memorizing_transformer": 100.0,
    }
    runs = {name: row(value) for name, value in late.items()}
    data = {"settings": rt.settings(2, 2, 0), "data": {"held_out": {"d": 10}}, "runs": runs, "provenance": {}}
    text = rt.readme_section(data)
    assert "| `hmt` | 1 | - | 1 | 300.00 | 290.00 | 90.00 | -10.0% |" in text
    assert "differ by 2.0%" in text
    assert "`hmt` 90.00 vs `rmt` 95.00: **reproduced**" in text  # 5% apart: outside the 2% noise
    assert "`trams` 101.00 vs `transformer_xl` 101.00: **reproduced (within noise)**" in text  # <= holds at equality
    assert "`elastic` 110.00 vs `memorizing_transformer` 100.00: **not reproduced**" in text
    assert "UniMix" not in text  # orderings without both runs are left out
