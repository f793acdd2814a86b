"""benchmarks/trained_memory.py: a run's report becomes one line per sample and reader, collected again it replaces
its own lines."""

from __future__ import annotations

import json

import trained_memory


def report(correct: list[bool], alone: list[bool]) -> dict:
    samples = lambda hits: [{"depth": i / 2, "exact": h, "answer_nll": 0.1} for i, h in enumerate(hits)]  # noqa: E731
    return {
        "args": {"task": "passkey", "segment_length": 128, "lr": 3e-4, "batch_size": 4, "model": "smollm2"},
        "memory_config": {"method": "armt"},
        "provenance": {"git_commit": "abc", "device": "cpu"},
        "steps": 300,
        "accuracy": {
            "2": {"segments": 2, "per_sample": samples(correct), "memory_disabled": {"per_sample": samples(alone)}}
        },
    }


def test_a_report_becomes_one_line_per_sample_and_reader_and_a_run_replaces_its_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(trained_memory, "OUT", tmp_path / "trained_memory.jsonl")
    run = tmp_path / "armt-run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(report([True, True, False], [False, False, False])))
    trained_memory.main([str(run)])
    rows = [json.loads(line) for line in (tmp_path / "trained_memory.jsonl").read_text().splitlines()]
    assert [(r["method"], r["score"]) for r in rows] == [("armt", 1.0), ("armt", 1.0), ("armt", 0.0)] + [
        ("none", 0.0)
    ] * 3
    assert {r["segments"] for r in rows} == {2} and rows[0]["trained_steps"] == 300 and rows[0]["commit"] == "abc"
    assert {r["trains"] for r in rows} == {"memory"}  # neither --lora nor --train-backbone
    (run / "report.json").write_text(json.dumps(report([True, True, True], [False, False, False])))
    trained_memory.main([str(run)])
    rows = [json.loads(line) for line in (tmp_path / "trained_memory.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and sum(r["score"] for r in rows if r["method"] == "armt") == 3


def test_a_training_free_reader_on_the_same_prompts_gets_its_own_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(trained_memory, "OUT", tmp_path / "trained_memory.jsonl")
    run = tmp_path / "armt-qa2"
    run.mkdir()
    data = report([True, False], [False, False])
    data["args"]["task"] = "qa2"
    data["accuracy"]["2"]["readers"] = {"infllm": {"per_sample": data["accuracy"]["2"]["per_sample"][::-1]}}
    (run / "report.json").write_text(json.dumps(data))
    trained_memory.main([str(run)])
    rows = [json.loads(line) for line in (tmp_path / "trained_memory.jsonl").read_text().splitlines()]
    assert [(r["method"], r["reader"], r["score"]) for r in rows] == [
        ("armt", "trained", 1.0),
        ("armt", "trained", 0.0),
        ("none", "memory disabled", 0.0),
        ("none", "memory disabled", 0.0),
        ("infllm", "training-free", 0.0),
        ("infllm", "training-free", 1.0),
    ]
    assert {r["task"] for r in rows} == {"qa2"}


def test_each_line_says_what_the_run_trained_beside_the_backbone():
    assert trained_memory.trains({"lora": True, "train_backbone": False}) == "memory + LoRA"
    assert trained_memory.trains({"lora": False, "train_backbone": True}) == "memory + backbone"
    assert trained_memory.trains({}) == "memory"
