"""A read that survives a restart: `step(..., state_dir=, save_every=)` saves the state as it reads, a read killed
part way continues from its last save and ends in the state an uninterrupted read reaches, and nothing a kill leaves
half-written is ever read."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

import hmt_adapters as ha
from cases import SEGMENT, wrap
from hmt_adapters.saving import reading_store
from tiny import random_ids, tiny_llama, tiny_tokenizer

CHUNK = 2 * SEGMENT  # save every two segments
TOKENS = 9 * SEGMENT + 3  # 5 chunks, the last one ends inside a segment


class Killed(Exception):
    """What a kill looks like to the read: it stops between two statements."""


def kill_after(monkeypatch, saves: int) -> list[int]:
    """Make the read stop right after its `saves`-th save; returns the tokens each save recorded."""
    recorded: list[int] = []
    save = reading_store.ReadingStore.save

    def counted(self, state, **facts):
        save(self, state, **facts)
        recorded.append(facts["tokens_read"])
        if len(recorded) == saves:
            raise Killed

    monkeypatch.setattr(reading_store.ReadingStore, "save", counted)
    return recorded


def segments_read(monkeypatch, model) -> list[int]:
    """The segments each runtime call reads from now on."""
    calls: list[int] = []
    run = model.runtime.run
    monkeypatch.setattr(model.runtime, "run", lambda ids, *a, **k: calls.append(ids.shape[1]) or run(ids, *a, **k))
    return calls


def assert_same_state(a: ha.MemoryState, b: ha.MemoryState) -> None:
    assert a.segments_seen == b.segments_seen and set(a.tensors) == set(b.tensors)
    for name in a.tensors:
        torch.testing.assert_close(a.tensors[name], b.tensors[name], atol=0, rtol=0, msg=name)
    assert torch.equal(a.pending_ids, b.pending_ids) and torch.equal(a.pending_mask, b.pending_mask)


@pytest.mark.parametrize("method", ["hmt", "infllm", "memorizing_transformer"])
def test_a_read_killed_part_way_continues_from_its_last_save_to_the_uninterrupted_state(method, tmp_path, monkeypatch):
    model = wrap(method, "llama").eval()
    ids = random_ids(2, TOKENS, seed=3)
    with torch.no_grad():
        _, whole = model.step(ids, return_logits=False)
    recorded = kill_after(monkeypatch, saves=3)
    with pytest.raises(Killed):
        model.step(ids, return_logits=False, state_dir=tmp_path, save_every=CHUNK)
    assert recorded == [CHUNK, 2 * CHUNK, 3 * CHUNK]
    monkeypatch.undo()
    calls = segments_read(monkeypatch, model)
    out, resumed = model.step(ids, return_logits=False, state_dir=tmp_path, save_every=CHUNK)
    assert sum(calls) == TOKENS - 3 * CHUNK  # only what the killed read had not saved
    assert out.memory_state is resumed and out.logits is None
    assert_same_state(resumed, whole)
    after = random_ids(2, SEGMENT + 2, seed=4)
    with torch.no_grad():
        expected, _ = model.step(after, whole)
        continued, _ = model.step(after, resumed)
    torch.testing.assert_close(continued.logits, expected.logits, atol=0, rtol=0)


def test_a_finished_read_is_taken_from_the_folder_without_reading(tmp_path, monkeypatch):
    model = wrap("transformer_xl", "llama").eval()
    ids = random_ids(1, TOKENS, seed=5)
    _, first = model.step(ids, return_logits=False, state_dir=tmp_path)  # save_every=None: saved once, at the end
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("part-")) == ["part-000000.safetensors"]
    calls = segments_read(monkeypatch, model)
    _, again = model.step(ids, return_logits=False, state_dir=tmp_path)
    assert calls == []
    assert_same_state(again, first)


def test_a_kill_while_saving_leaves_the_previous_save_whole(tmp_path, monkeypatch):
    model = wrap("hmt", "llama").eval()
    ids = random_ids(1, TOKENS, seed=6)
    with torch.no_grad():
        _, whole = model.step(ids, return_logits=False)
    replace = os.replace

    def cut(src, dst):  # the third save's part is written, its manifest never replaces the second's
        if str(dst).endswith(reading_store.MANIFEST) and len(os.listdir(tmp_path)) > 0 and cut.manifests == 2:
            raise Killed
        cut.manifests += str(dst).endswith(reading_store.MANIFEST)
        replace(src, dst)

    cut.manifests = 0
    monkeypatch.setattr(reading_store.os, "replace", cut)
    with pytest.raises(Killed):
        model.step(ids, return_logits=False, state_dir=tmp_path, save_every=CHUNK)
    monkeypatch.undo()
    manifest = json.loads((tmp_path / reading_store.MANIFEST).read_text())
    assert manifest["facts"]["tokens_read"] == 2 * CHUNK  # the second save, whole
    calls = segments_read(monkeypatch, model)
    _, resumed = model.step(ids, return_logits=False, state_dir=tmp_path, save_every=CHUNK)
    assert sum(calls) == TOKENS - 2 * CHUNK
    assert_same_state(resumed, whole)
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert leftovers == [] and set(json.loads((tmp_path / reading_store.MANIFEST).read_text())["parts"].values()) == {
        n for n in os.listdir(tmp_path) if n.startswith("part-")
    }


def test_a_save_writes_only_what_is_new_since_the_last(tmp_path):
    """InfLLM's blocks, once cut, are written once: the first blocks stay in the first part however often the read
    is saved (a long read's saves cost the new blocks, not the whole store again)."""
    model = wrap("infllm", "llama").eval()
    model.step(random_ids(1, TOKENS, seed=7), return_logits=False, state_dir=tmp_path, save_every=CHUNK)
    parts = json.loads((tmp_path / reading_store.MANIFEST).read_text())["parts"]
    first_blocks = [name for name in parts if name.startswith("tensors.block.k.0.0")]
    assert first_blocks and {parts[name] for name in first_blocks} == {"part-000000.safetensors"}
    assert len(set(parts.values())) > 1  # later saves wrote the rest


def test_a_folder_holding_another_document_starts_over_with_a_warning(tmp_path, caplog):
    model = wrap("rmt", "llama").eval()
    model.step(random_ids(1, TOKENS, seed=8), return_logits=False, state_dir=tmp_path, save_every=CHUNK)
    ids = random_ids(1, TOKENS, seed=9)
    with caplog.at_level(logging.WARNING, logger="hmt_adapters.resume"):
        _, state = model.step(ids, return_logits=False, state_dir=tmp_path, save_every=CHUNK)
    assert "starts over" in caplog.text
    with torch.no_grad():
        _, fresh = model.step(ids, return_logits=False)
    assert_same_state(state, fresh)


def test_ask_with_a_state_dir_answers_as_without_and_reads_the_document_once(tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    model = ha.wrap_with_memory(tiny_llama(len(tok)), "transformer_xl", segment_length=16, memory_size=32).eval()
    document = "the cat sat on the mat and the dog lay by the door. " * 12
    plain = ha.ask(model, document, ["Where is the cat?", "And the dog?"], tokenizer=tok, max_new_tokens=4)
    kept = ha.ask(model, document, ["Where is the cat?"], tokenizer=tok, max_new_tokens=4, state_dir=tmp_path)
    calls = segments_read(monkeypatch, model)
    again = ha.ask(model, document, "And the dog?", tokenizer=tok, max_new_tokens=4, state_dir=tmp_path)
    assert kept == plain[:1] and again == plain[1]
    document_tokens = len(tok(document)["input_ids"])
    assert (
        document_tokens > 8 * 16 and sum(calls) < 3 * 16
    )  # the question's segments only: the document came from the folder


def test_a_resumable_read_refuses_what_it_cannot_keep(tmp_path):
    model = wrap("rmt", "llama").eval()
    ids = random_ids(1, TOKENS)
    with pytest.raises(ValueError, match="`save_every=16` needs `state_dir`"):
        model.step(ids, return_logits=False, save_every=16)
    with pytest.raises(ValueError, match=r"got \['return_logits=True'\]\. Pass `return_logits=False`"):
        model.step(ids, state_dir=tmp_path)
    with pytest.raises(ValueError, match=r"got \['state', 'labels'\]"):
        model.step(ids, model.init_memory(1), labels=ids, return_logits=False, state_dir=tmp_path)
    with pytest.raises(ValueError, match="`save_every` must be a number of tokens >= 1"):
        model.step(ids, return_logits=False, state_dir=tmp_path, save_every=0)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file; pass a folder"):
        model.step(ids, return_logits=False, state_dir=tmp_path / "file")
