"""lm-eval on a tiny wrapped model through the documented integration (`MemoryLM`, local task files) gives the
project's own numbers: rolling log-likelihood = -sum of `token_nll`, generation = `MemoryModel.generate`."""

from __future__ import annotations

import os

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.evaluation import make_samples
from hmt_adapters.training import token_nll
from tiny import tiny_llama, tiny_tokenizer

lm_eval = pytest.importorskip("lm_eval", reason="the `eval` extra (lm-eval) is part of `make install`")
from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from hmt_adapters.evaluation.harness import MemoryLM, write_lm_eval_tasks  # noqa: E402

SEGMENT = 16


def _model(tok) -> ha.MemoryModel:
    return ha.wrap_with_memory(
        tiny_llama(len(tok)), "hmt", segment_length=SEGMENT, sensory_length=3, memory_window=4, retrieval_dim=16
    ).eval()


def _run(lm, folder: str, task: str) -> list:
    manager = TaskManager(include_path=folder, include_defaults=False)  # local task files only
    out = simple_evaluate(model=lm, tasks=[task], task_manager=manager, log_samples=True, bootstrap_iters=0)
    return sorted(out["samples"][task], key=lambda s: s["doc_id"])


def test_rolling_loglikelihood_equals_the_projects_nll(tmp_path):
    tok = tiny_tokenizer()
    model = _model(tok)
    texts = [tok.decode(s.input_ids) for s in make_samples("passkey", tok, 180, 2, haystack="repeat")]
    folder = write_lm_eval_tasks(str(tmp_path), {}, tok, books={"book": texts})
    expected = [
        -float(
            token_nll(model, torch.tensor([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"]))
            .double()
            .sum()
        )
        for t in texts
    ]
    assert all(len(tok(t)["input_ids"]) > 8 * SEGMENT for t in texts)  # many segments: memory is carried
    results = _run(MemoryLM(model, tokenizer=tok, batch_size=1), folder, "hmt_book")
    assert [s["resps"][0][0] for s in results] == pytest.approx(expected, rel=1e-6)
    requests = [Instance("loglikelihood_rolling", s["doc"], (t,), 0) for s, t in zip(results, texts)]
    plain = HFLM(pretrained=model, tokenizer=tok, max_length=100_000, batch_size=1)  # lm-eval's own path: same numbers
    assert plain.loglikelihood_rolling(requests, disable_tqdm=True) == pytest.approx(expected, rel=1e-5)
    with model.disable_memory():  # the same-window baseline scores differently: memory is what was measured
        alone = plain.loglikelihood_rolling(requests, disable_tqdm=True)
    assert max(abs(a - b) for a, b in zip(alone, expected)) > 0.05


def test_generate_until_reads_across_segments_with_memory(tmp_path):
    tok = tiny_tokenizer()
    model = _model(tok)
    samples = make_samples("passkey", tok, 200, 2, haystack="repeat")
    folder = write_lm_eval_tasks(str(tmp_path), {"passkey": samples}, tok)
    results = _run(MemoryLM(model, tokenizer=tok, batch_size=1), folder, "hmt_passkey")
    for sample, result in zip(samples, results):
        ids = torch.tensor([tok(tok.decode(sample.input_ids), add_special_tokens=False)["input_ids"]])
        assert ids.shape[1] > 10 * SEGMENT
        new = model.generate(
            input_ids=ids,
            max_new_tokens=sample.extra["max_new_tokens"],
            do_sample=False,
            pad_token_id=tok.eos_token_id,
        )[0, ids.shape[1] :]
        expected = tok.decode(new, skip_special_tokens=False).split(tok.eos_token)[0]
        assert result["resps"][0][0] == expected
        assert result["score"] == float(expected.strip()[:5] == sample.answers[0])
        assert result["doc"]["length"] == 200 and result["doc"]["inserts"][0]["position"] == sample.inserts[0].position


def test_registered_model_type_needs_an_adapter_for_a_backbone_name():
    with pytest.raises(ValueError, match="`adapter`"):
        MemoryLM("smollm2")
    with pytest.raises(TypeError, match="MemoryModel or a backbone name"):
        MemoryLM(tiny_llama(8), tokenizer=tiny_tokenizer())


def saved_model_and_book_task(tmp_path):
    """A tiny memory model saved as backbone + adapter folders, and a one-book perplexity task exported for lm-eval:
    `(tokenizer, model, backbone folder, adapter folder, book texts, task folder)`."""
    tok = tiny_tokenizer()
    model = _model(tok)
    backbone, adapter = tmp_path / "backbone", tmp_path / "adapter"
    model.backbone.save_pretrained(backbone)
    tok.save_pretrained(backbone)
    model.save_pretrained(str(adapter))
    texts = [tok.decode(make_samples("passkey", tok, 160, 1, haystack="repeat")[0].input_ids)]
    folder = write_lm_eval_tasks(str(tmp_path / "tasks"), {}, tok, books={"book": texts})
    return tok, model, backbone, adapter, texts, folder


def test_registered_model_type_builds_backbone_and_adapter_from_model_args(tmp_path):
    tok, model, backbone, adapter, texts, folder = saved_model_and_book_task(tmp_path)
    out = simple_evaluate(
        model="hmt-adapters",
        model_args=f"pretrained={backbone},adapter={adapter}",
        tasks=["hmt_book"],
        task_manager=TaskManager(include_path=folder, include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    ids = [tok.bos_token_id] + tok(texts[0], add_special_tokens=False)["input_ids"]
    expected = -float(token_nll(model, torch.tensor(ids)).double().sum())
    assert out["samples"]["hmt_book"][0]["resps"][0][0] == pytest.approx(expected, rel=1e-6)


def test_exported_tasks_hold_no_absolute_paths_and_run_after_the_folder_moves(tmp_path, monkeypatch):
    """The YAMLs name their data relative to the folder: moved elsewhere and run from another directory, the task
    still scores the same documents (the project's NLL)."""
    import shutil

    tok = tiny_tokenizer()
    model = _model(tok)
    texts = [tok.decode(make_samples("passkey", tok, 160, 1, haystack="repeat")[0].input_ids)]
    written = write_lm_eval_tasks(str(tmp_path / "written"), {}, tok, books={"book": texts})
    for name in os.listdir(written):
        with open(os.path.join(written, name)) as fh:
            assert str(tmp_path) not in fh.read(), name
    moved = shutil.move(written, str(tmp_path / "elsewhere" / "tasks"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    out = simple_evaluate(
        model=MemoryLM(model, tokenizer=tok),
        tasks=["hmt_book"],
        task_manager=TaskManager(include_path=moved, include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    ids = [tok.bos_token_id] + tok(texts[0], add_special_tokens=False)["input_ids"]
    expected = -float(token_nll(model, torch.tensor(ids)).double().sum())
    assert out["samples"]["hmt_book"][0]["resps"][0][0] == pytest.approx(expected, rel=1e-6)


def test_the_hmt_lm_eval_command_is_lm_evals_cli_with_the_model_type(tmp_path, monkeypatch, capsys):
    """pyproject's `hmt-lm-eval` script runs lm-eval's own command line with `--model hmt-adapters` known (lm-eval
    0.4 has no entry point for external model types)."""
    import importlib
    import sys
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as fh:
        target = tomllib.load(fh)["project"]["scripts"]["hmt-lm-eval"]
    module, func = target.split(":")
    tok, model, backbone, adapter, texts, folder = saved_model_and_book_task(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "hmt-lm-eval",
            "--model",
            "hmt-adapters",
            "--model_args",
            f"pretrained={backbone},adapter={adapter}",
            "--tasks",
            "hmt_book",
            "--include_path",
            folder,
            "--device",
            "cpu",
            "--batch_size",
            "1",
        ],
    )
    getattr(importlib.import_module(module), func)()
    assert "hmt_book" in capsys.readouterr().out
