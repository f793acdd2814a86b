"""benchmarks/render_docs.py: the README headline's rows of lm-eval's own RULER tasks land in the columns of the
reader and length lm-eval ran, and nowhere else; the perplexity tables compare each trained memory with every run."""

from __future__ import annotations

import math

import render_docs


def test_ruler_rows_fill_the_columns_lm_eval_ran_and_mark_the_rest(monkeypatch):
    def cell(reader, length, task, samples, mean, low, high):
        return {
            "reader": reader,
            "length": length,
            "task": task,
            "samples": samples,
            "mean": mean,
            "low": low,
            "high": high,
        }

    cells = [
        cell("bare", 4096, "niah_single_1", 10, 1.0, 0.72, 1.0),
        cell("infllm", 32768, "niah_single_1", 4, 0.75, 0.3, 0.95),
        cell("infllm", 32768, "ruler_vt", 10, 0.1, 0.02, 0.4),
    ]
    monkeypatch.setattr(render_docs, "load", lambda name: {"cells": cells} if name == "lm_eval_ruler" else None)
    rows = render_docs.ruler_headline_rows()
    assert [r.split(" | ")[0] for r in rows] == ["| lm-eval `niah_single_1`", "| lm-eval `ruler_vt`"]
    columns = [(reader, length) for _, reader, length in render_docs.HEADLINE_COLUMNS]
    single = rows[0].strip("| ").split(" | ")[1:]
    assert len(single) == len(columns)
    for (reader, length), cell in zip(columns, single):
        if (reader, length) == ("backbone", 4096):
            assert cell == "1.00 (n=10) [0.72, 1.00]"
        elif (reader, length) == ("infllm", 32768):
            assert cell == "0.75 (n=4) [0.30, 0.95]"
        else:
            assert cell == "-"
    vt = rows[1].strip("| ").split(" | ")[1:]
    assert vt.count("-") == len(columns) - 1 and vt[columns.index(("infllm", 32768))].startswith("0.10")


def test_full_attention_readers_are_named_not_described_by_infllm_fields():
    """A YaRN or llama.cpp record's `config` holds its own settings: the caption names what it reads and lists no
    InfLLM field for it, while an InfLLM variant keeps its fields."""
    rows = [
        {"reader": "yarn", "config": {"context": 8192, "rope_parameters": {"factor": 2.0}}},
        {"reader": "llama_cpp", "config": {"context": 8192}},
        {"reader": "infllm-w1024", "config": {"window": 1024}},
    ]
    assert set(render_docs.variant_fields(rows)) == {"infllm-w1024"}
    caption = render_docs.full_attention_readers(rows)
    assert "`yarn`: the bare model with transformers' YaRN" in caption and "`llama_cpp`: llama.cpp" in caption
    assert "llama_cpp_yarn" not in caption


def test_each_trained_memory_gets_its_perplexity_against_every_other_run(monkeypatch):
    def run(at_1k: float, at_2k: float) -> dict:
        return {"ppl": {"1024": {"bin": at_1k}, "2048": {"bin": at_2k}}}

    data = {
        "documents": [{"title": "Persuasion", "tokens": 2048}],
        "window": 288,
        "stride": 64,
        "provenance": {"git_commit": "0" * 40, "device": "cpu", "machine": "x86_64"},
        "runs": {"baseline_sliding_window": run(40.0, 30.0), "hmt": run(41.0, 33.0), "armt": run(39.0, 27.0)},
    }
    monkeypatch.setattr(render_docs, "load", lambda name: data if name == "ppl_vs_length_austen" else None)
    text = render_docs.ppl("austen")()
    assert "| `armt` | 39.00 | 27.00 |" in text
    assert "`hmt` perplexity at C = 2048: +10.0% against `baseline_sliding_window`, +22.2% against `armt`" in text
    assert "`armt` perplexity at C = 2048: -10.0% against `baseline_sliding_window`, -18.2% against `hmt`" in text


def test_runs_that_kept_their_nlls_get_a_paired_interval(monkeypatch):
    """Two runs with `nll_blocks` pair stretch by stretch over the last bin only: the interval brackets the ratio of
    the bin's stretches (not of the whole passage), and a run without them gets the ratio alone."""

    def run(before: float, bin_nlls: list[float], keep: bool = True) -> dict:
        row = {"ppl": {"2048": {"bin": math.exp(sum(bin_nlls) / len(bin_nlls))}}}
        if keep:
            row["per_document"] = [{"nll_blocks": [before] * 4 + bin_nlls}]
        return row

    data = {
        "documents": [{"title": "Persuasion", "tokens": 2048}],
        "window": 288,
        "stride": 64,
        "provenance": {"git_commit": "0" * 40, "device": "cpu", "machine": "x86_64"},
        "runs": {
            "baseline_sliding_window": run(0.0, [3.0] * 4),
            "armt": run(9.0, [2.9, 2.8, 2.9, 2.8]),  # 0.1-0.2 nats better in the bin, far worse before it
            "baseline": run(0.0, [3.0] * 4, keep=False),
        },
    }
    monkeypatch.setattr(render_docs, "load", lambda name: data if name == "ppl_vs_length_austen" else None)
    text = render_docs.ppl("austen")()
    line = next(x for x in text.splitlines() if x.startswith("`armt` perplexity"))
    # the ratio exp(-0.15) - 1 = -13.9%; the bootstrap's extremes exp(-0.2) - 1 = -18.1% and exp(-0.1) - 1 = -9.5%
    assert "-13.9% [-18.1%, -9.5%] against `baseline_sliding_window`" in line, line
    assert "-13.9% against `baseline` (negative" in line, line
    assert "stretches of 256 tokens" in text
