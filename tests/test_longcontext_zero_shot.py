"""Zero-shot readers (`--methods` of the long-context benchmark): every registered method wraps the bare backbone
untrained, shares its weights, answers a prompt, records its store; unknown names and policies are refused, naming
the options."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.evaluation import Reader, answer_rows, make_samples
from hmt_adapters.evaluation.zero_shot import memory_policies, zero_shot_fields, zero_shot_readers
from hmt_adapters.registry import get_method
from hmt_adapters.training import token_nll
from tiny import tiny_llama, tiny_tokenizer


def test_every_method_builds_a_zero_shot_reader_that_answers():
    tok = tiny_tokenizer()
    base = tiny_llama(len(tok))
    samples = make_samples("passkey", tok, 160, 1, haystack="repeat")
    methods = ha.available_methods()
    assert all(get_method(m).untrained for m in methods)  # every method says what is untrained: no row without it
    readers, info = zero_shot_readers(base, methods, segment_length=32, memory="cover", cover=160)
    assert [r.name for r in readers] == [f"{m} (zero-shot)" for m in methods]
    weights = {p.data_ptr() for p in base.parameters()}
    for reader in readers:  # own module tree, the backbone's own weights
        assert isinstance(reader.model, ha.MemoryModel) and reader.model.base_model is not base
        assert {p.data_ptr() for p in reader.model.base_model.parameters()} == weights
    rows = answer_rows(readers, samples, tok, progress=False)
    assert [r["reader"] for r in rows] == [r.name for r in readers]
    assert all(isinstance(r["prediction"], str) and r["score"] in (0.0, 1.0) for r in rows)
    assert info["memorizing_transformer (zero-shot)"]["config"]["memory_size"] == 160
    assert info["hmt (zero-shot)"]["config"]["memory_window"] == 300  # the preset already covers 160 / 32 segments
    assert info["trams (zero-shot)"]["config"]["select_size"] == 4 * 32
    assert all(i["memory"] == "cover" and i["untrained"] for i in info.values())


def test_transformer_xl_with_a_store_covering_the_prompt_is_full_attention():
    """Zero-shot XL reads the backbone's own keys/values at their true distances: with the whole prompt in its store it
    scores every token as the bare backbone does over the whole prompt (the wrapper changes nothing else)."""
    tok = tiny_tokenizer()
    base = tiny_llama(len(tok))
    ids = torch.tensor(make_samples("passkey", tok, 192, 1, haystack="repeat")[0].input_ids)
    (xl,), _ = zero_shot_readers(base, ["transformer_xl"], segment_length=32, memory="cover", cover=192)
    with torch.no_grad():
        logits = base(input_ids=ids[None]).logits[0]
    full = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")
    torch.testing.assert_close(token_nll(xl.model, ids), full, rtol=1e-4, atol=1e-4)
    (preset,), info = zero_shot_readers(base, ["transformer_xl"], segment_length=32)  # one past segment only
    assert info["transformer_xl (zero-shot)"]["config"]["memory_size"] is None
    assert (token_nll(preset.model, ids) - full).abs().max() > 1e-3
    prompt = ids.tolist()
    assert Reader("plain", base).generate(prompt, 3, tok.eos_token_id) == xl.generate(prompt, 3, tok.eos_token_id)


def test_memory_policies_per_method_and_bad_values_name_the_options():
    methods = ["transformer_xl", "trams"]
    mixed = memory_policies(["cover", "transformer_xl=preset"], methods)
    assert mixed == {"transformer_xl": "preset", "trams": "cover"}
    assert memory_policies([], methods) == {"transformer_xl": "preset", "trams": "preset"}
    with pytest.raises(ValueError, match=r"'huge'.*allowed: \['preset', 'cover'\]"):
        memory_policies(["huge"], methods)
    with pytest.raises(ValueError, match="'rmt', which is not among the methods run"):
        memory_policies(["rmt=cover"], methods)
    with pytest.raises(ValueError, match="needs `cover`"):
        zero_shot_fields("trams", memory="cover")
    with pytest.raises(ValueError, match=r"Unknown memory method 'xl'; available methods: \[.*'transformer_xl'"):
        zero_shot_fields("xl")
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match=r"Unknown memory method\(s\) \['xl'\]; available methods: \[.*'hmt'"):
        zero_shot_readers(tiny_llama(len(tok)), ["hmt", "xl"])
