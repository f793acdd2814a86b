"""The memory-off baseline (`MemoryModel.disable_memory`) is one per-call context: it covers forward, step and
generate, stays in its own thread, and lm-eval's `MemoryLM(memory=False)` applies it per call without switching
the model."""

from __future__ import annotations

import threading

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.evaluation.harness import MemoryLM
from hmt_adapters.evaluation.nll import token_nll
from tiny import random_ids, tiny_backbone, tiny_llama, tiny_tokenizer

CASES = {
    "hmt": dict(segment_length=8, sensory_length=2, memory_window=4),
    "transformer_xl": dict(segment_length=8, memory_size=16),
}


def memory_model(method: str) -> ha.MemoryModel:
    return ha.wrap_with_memory(tiny_backbone("llama"), method, **CASES[method]).eval()


@pytest.mark.parametrize("method", sorted(CASES))
def test_generate_inside_disable_memory_reads_each_window_alone(method):
    """Greedy `generate` under `disable_memory()` equals the argmax of the memory-off forward at every step, and
    differs from the memory-on tokens (the prompt spans several segments)."""
    model = memory_model(method)
    model.generation_config.eos_token_id = None  # compare all 8 tokens (no stop at the tiny config's EOS id)
    prompt = random_ids(2, 21, seed=7)
    with model.disable_memory():
        off = model.generate(input_ids=prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
        seq = prompt
        with torch.no_grad():
            for _ in range(8):
                seq = torch.cat([seq, model(input_ids=seq).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(off, seq)
    with torch.no_grad():
        on_logits = model(input_ids=prompt).logits
        with model.disable_memory():
            off_logits = model(input_ids=prompt).logits
    assert not torch.allclose(on_logits[:, 8:], off_logits[:, 8:])  # memory changes the later segments


def test_step_inside_disable_memory_passes_the_state_through():
    model = memory_model("hmt")
    ids = random_ids(2, 20, seed=8)
    with torch.no_grad():
        _, state = model.step(ids[:, :10])
        with model.disable_memory():
            out, after = model.step(ids[:, 10:], state)
            forward = model(input_ids=ids).logits
    assert all(torch.equal(after.tensors[k], state.tensors[k]) for k in state.tensors)
    torch.testing.assert_close(out.logits[:, 6:], forward[:, 16:])  # the window after the pending 16..19 reads alone


def test_disable_memory_in_one_thread_leaves_other_threads_with_memory():
    model = memory_model("hmt")
    ids = random_ids(2, 24, seed=9)
    with torch.no_grad():
        on = model(input_ids=ids).logits
        with model.disable_memory():
            off = model(input_ids=ids).logits
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def baseline():
        with model.disable_memory(), torch.no_grad():
            inside.set()
            done.wait(60)
            seen["off"] = model(input_ids=ids).logits

    thread = threading.Thread(target=baseline)
    thread.start()
    inside.wait(60)
    with torch.no_grad():
        seen["on"] = model(input_ids=ids).logits  # while the other thread is inside its block
    done.set()
    thread.join(60)
    torch.testing.assert_close(seen["on"], on, atol=0, rtol=0)
    torch.testing.assert_close(seen["off"], off, atol=0, rtol=0)


def test_memory_lm_takes_a_bool_and_never_switches_the_users_model():
    tok = tiny_tokenizer()
    model = ha.wrap_with_memory(tiny_llama(len(tok)), "hmt", **CASES["hmt"]).eval()
    with pytest.raises(ValueError, match=r"`memory` must be True or False .* got 'flase'"):
        MemoryLM(model, tokenizer=tok, memory="flase")
    baseline = MemoryLM(model, tokenizer=tok, memory=False, batch_size=1)
    assert model.runtime.memory_enabled  # the model outside the evaluator still reads with memory
    text = "the passkey is 12345 and the door is red " * 3

    class Request:
        args = (text,)

    (scored,) = baseline.loglikelihood_rolling([Request()], disable_tqdm=True)
    ids = torch.tensor([baseline.prefix_token_id] + baseline.tok_encode(text))
    with model.disable_memory():
        expected = -float(token_nll(model, ids).double().sum())
    assert scored == pytest.approx(expected, rel=1e-9)
    assert scored != pytest.approx(-float(token_nll(model, ids).double().sum()), rel=1e-6)
