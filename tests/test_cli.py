"""The `hmt-adapters` command end to end on a tiny model: `ask` answers on stdout what `ha.ask` answers, from a file
or standard input, with an adapter or a method, keeps the read with `--state`, and says what is wrong in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hmt_adapters as ha
from hmt_adapters import cli
from tiny import tiny_llama, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = "the cat sat on the mat and the dog lay by the door. " * 20
QUESTIONS = ["Where is the cat?", "And the dog?"]
XL = {"segment_length": 16, "memory_size": 32}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny base model saved as a folder (with its tokenizer) and a Transformer-XL adapter made on it."""
    root = tmp_path_factory.mktemp("cli")
    tok = tiny_tokenizer()
    tiny_llama(len(tok)).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    base = AutoModelForCausalLM.from_pretrained(root / "base")  # records the folder as `base_model_name_or_path`
    ha.wrap_with_memory(base, "transformer_xl", **XL).save_pretrained(root / "adapter", tokenizer=tok)
    (root / "doc.txt").write_text(DOCUMENT, encoding="utf-8")
    return {"root": root, "base": root / "base", "adapter": root / "adapter", "doc": root / "doc.txt"}


def expected(folders) -> list[str]:
    model = cli.auto_dtype(ha.AutoMemoryModelForCausalLM.from_pretrained(str(folders["adapter"])))  # as `--dtype auto`
    with torch.no_grad():
        return ha.ask(model, DOCUMENT, QUESTIONS, max_new_tokens=6)


def hmt_adapters(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "hmt_adapters.cli", *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def questions() -> list[str]:
    return [arg for q in QUESTIONS for arg in ("--question", q)]


def test_ask_prints_one_answer_per_question_from_a_file(folders):
    source = ["--adapter", str(folders["adapter"]), "--file", str(folders["doc"])]
    done = hmt_adapters("ask", *source, *questions(), "--max-new-tokens", "6")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [a.replace("\n", " ") for a in expected(folders)]


def test_ask_reads_standard_input_with_a_method_on_a_base(folders):
    fields = [arg for k, v in XL.items() for arg in ("--option", f"{k}={v}")]
    done = hmt_adapters(
        "ask", "--method", "transformer_xl", "--base", str(folders["base"]), *fields, *questions(),
        "--max-new-tokens", "6", stdin=DOCUMENT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [a.replace("\n", " ") for a in expected(folders)]


def test_state_keeps_the_read_for_the_next_call(folders):
    state = folders["root"] / "state"
    args = ["ask", "--adapter", str(folders["adapter"]), "--file", str(folders["doc"]), "--max-new-tokens", "6"]
    first = hmt_adapters(*args, "--question", QUESTIONS[0], "--state", str(state), "--save-every", "64")
    assert first.returncode == 0, first.stderr[-2000:]
    assert (state / "reading.json").is_file()
    second = hmt_adapters(*args, "--question", QUESTIONS[1], "--state", str(state))
    assert second.returncode == 0, second.stderr[-2000:]
    assert [first.stdout.strip(), second.stdout.strip()] == [a.replace("\n", " ") for a in expected(folders)]


def test_mistakes_are_one_line_naming_what_is_wrong(folders):
    wrong = hmt_adapters("ask", "--method", "xl", "--base", str(folders["base"]), "--question", "q", stdin="text")
    assert wrong.returncode != 0 and "hmt-adapters ask: Unknown" in wrong.stderr and "transformer_xl" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    empty = hmt_adapters("ask", "--adapter", str(folders["adapter"]), "--question", "q", stdin="  \n")
    assert empty.returncode != 0 and "is empty" in empty.stderr
    alone = hmt_adapters("ask", "--method", "infllm", "--question", "q", stdin="text")
    assert alone.returncode != 0 and "--method needs --base" in alone.stderr


def test_help_lists_ask_beside_lm_eval_and_the_console_script_is_declared():
    done = hmt_adapters("--help")
    assert done.returncode == 0 and "ask" in done.stdout and "lm-eval" in done.stdout
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["hmt-adapters"] == "hmt_adapters.cli:main"


@pytest.mark.parametrize("feature", ["AVX512-BF16", None])
def test_auto_dtype_reads_in_bfloat16_only_where_the_cpu_is_fast_at_it(folders, monkeypatch, capsys, feature):
    """`--dtype auto` (the default) casts float32 weights to bfloat16 where the CPU has fast bfloat16 and says so
    once on standard error with the way back; elsewhere, and under `--dtype float32`, the weights stay float32."""
    monkeypatch.setattr(cli, "fast_bf16", lambda: feature)
    args = ["ask", "--adapter", str(folders["adapter"]), "--question", "q"]
    auto = cli.load(cli.build_parser().parse_args(args))
    told = capsys.readouterr().err
    assert next(auto.parameters()).dtype == (torch.bfloat16 if feature else torch.float32)
    if feature:
        assert "reading in bfloat16" in told and feature in told and "--dtype float32" in told
    else:
        assert "bfloat16" not in told
    kept = cli.load(cli.build_parser().parse_args([*args, "--dtype", "float32"]))
    assert next(kept.parameters()).dtype == torch.float32 and "bfloat16" not in capsys.readouterr().err
    if feature:  # the bfloat16 model answers (the reader's dtype follows the weights)
        with torch.no_grad():
            assert len(ha.ask(auto, DOCUMENT, QUESTIONS, max_new_tokens=3)) == 2
