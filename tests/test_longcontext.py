"""The long-context suite builds what it says: exact lengths in tokens, needles at the recorded positions and depths,
answers present exactly once, exact scoring, and readers that see what they claim to see."""

from __future__ import annotations

import random

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.evaluation import (
    TASKS,
    Insert,
    Reader,
    accuracy_table,
    answer_rows,
    book_nll,
    build_sample,
    load_haystack,
    make_samples,
    score,
)
from hmt_adapters.evaluation.tasks import (
    PASSKEY_HEAD,
    PASSKEY_QUESTIONS,
    passkey,
    passkey_update,
    qa,
    variable_tracking,
)
from hmt_adapters.training import token_nll
from tiny import tiny_llama, tiny_tokenizer

HAYSTACKS = ("repeat", "essays")


@pytest.mark.parametrize("haystack", HAYSTACKS)
@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("length", [600, 2000])
def test_samples_have_the_length_and_positions_asked(task, length, haystack):
    tok = tiny_tokenizer()
    for sample in make_samples(task, tok, length, 3, seed=7, haystack=haystack):
        assert len(sample.input_ids) == sample.length == length
        text = tok.decode(sample.input_ids)
        for insert in sample.inserts:  # each insert's tokens sit exactly at its recorded position
            placed = sample.input_ids[insert.position : insert.position + insert.num_tokens]
            assert placed == tok(" " + insert.text, add_special_tokens=False)["input_ids"]
        positions = [i.position for i in sample.inserts]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        if sample.extra["metric"] != "first_word":  # retrieval answers occur nowhere but in their needles
            needle_text = " ".join(i.text for i in sample.inserts)
            for answer in sample.answers:
                assert text.count(answer) == needle_text.count(answer) >= 1
        if task in ("passkey", "niah_single", "niah_multikey", "niah_multivalue"):
            assert all(text.count(a) == 1 for a in sample.answers)


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_needle_lands_at_the_depth_asked(depth):
    tok = tiny_tokenizer()
    hay = load_haystack("essays", tok)
    longest_piece = max(len(p) for p in hay.pieces)
    sample = passkey(tok, 3000, seed=3, depth=depth)
    needle = sample.inserts[0]
    head = len(tok(PASSKEY_HEAD, add_special_tokens=False)["input_ids"])
    tail = sample.length - needle.position - needle.num_tokens  # filler after the needle + question
    question = len(tok("\nWhat is the pass key? The pass key is", add_special_tokens=False)["input_ids"])
    filler = sample.length - head - needle.num_tokens - question
    assert abs((needle.position - head) - depth * filler) <= longest_piece / 2 + 1
    assert tail >= question


def test_build_sample_keeps_insert_order_and_rejects_too_short_lengths():
    tok = tiny_tokenizer()
    hay = load_haystack("repeat", tok)
    inserts = [Insert("First fact.", 0.9), Insert("Second fact.", 0.1)]  # asked out of order: order is kept
    build_sample(tok, hay, 500, "Head.\n", inserts, "\nTail", random.Random(0), task="t", answers=["x"], query="q")
    assert inserts[0].position < inserts[1].position
    with pytest.raises(ValueError, match="too short"):
        build_sample(
            tok,
            hay,
            20,
            "Head " * 10,
            [Insert("Fact.", 0.5)],
            "Tail",
            random.Random(0),
            task="t",
            answers=["x"],
            query="q",
        )


def _solve_babi(facts: list[str], question: str) -> str:
    """An independent bAbI reader: replays the facts and answers the question."""
    place, holder, trail = {}, {}, {}
    for fact in facts:
        words = fact.rstrip(".").split()
        person = words[0]
        if "picked up" in fact:
            holder[words[-1]] = person
            trail.setdefault(words[-1], []).append(place.get(person))
        else:
            place[person] = words[-1]
            for obj, who in holder.items():
                if who == person:
                    trail[obj].append(words[-1])
    words = question.rstrip("?").split()
    if question.startswith("Where is the"):
        return place[holder[words[-1]]]
    if question.startswith("Where is"):
        return place[words[-1]]
    obj, last = words[3], words[-1]
    assert trail[obj][-1] == last
    return trail[obj][-2]


def test_qa_answers_follow_from_the_facts():
    tok = tiny_tokenizer()
    for kind in (1, 2, 3):
        for seed in range(30):
            sample = qa(tok, 800, kind=kind, seed=seed, haystack="repeat")
            facts = [i.text for i in sample.inserts]
            assert sample.answers[0] == _solve_babi(facts, sample.query)
            support = [facts[i] for i in sample.extra["supporting_facts"]]
            assert len(support) == kind and any(sample.answers[0] in fact for fact in support)
            # the supporting facts alone give the same answer
            assert _solve_babi(support, sample.query) == sample.answers[0]


def test_variable_tracking_chain_is_in_order():
    tok = tiny_tokenizer()
    sample = variable_tracking(tok, 1000, seed=1, haystack="repeat")
    names = sample.answers
    assert sample.inserts[0].text == f"VAR {names[0]} = {sample.query}."
    assert [i.text for i in sample.inserts[1:]] == [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]


def test_the_passkey_asked_by_number_shares_no_word_of_the_needle_but_its_key_and_place():
    """`question="number"`: the same key at the same depth, the prompt ending in a question whose only word in common
    with the needle is "the" (a reader matching the question's words has nothing to find)."""
    tok = tiny_tokenizer()
    plain, number = (passkey(tok, 600, seed=4, depth=0.3, haystack="repeat", question=q) for q in PASSKEY_QUESTIONS)
    assert plain.answers == number.answers and plain.inserts[0].text == number.inserts[0].text
    assert tok.decode(number.input_ids).endswith(PASSKEY_QUESTIONS["number"])
    words = lambda text: set(text.lower().replace("?", " ").replace(".", " ").split())  # noqa: E731
    assert words(number.inserts[0].text) & words(PASSKEY_QUESTIONS["number"]) == {"the"}
    assert len(number.input_ids) == 600
    with pytest.raises(ValueError, match=r"`question` must be one of \['pass key', 'number'\], got 'digits'"):
        passkey(tok, 600, question="digits")


def test_passkey_update_asks_for_the_last_key_set():
    tok = tiny_tokenizer()
    sample = passkey_update(tok, 1500, seed=2, updates=3)
    keys = [*sample.extra["stale"], sample.answers[0]]
    assert len(set(keys)) == 3 and [i.depth for i in sample.inserts] == sorted(i.depth for i in sample.inserts)
    assert sample.inserts[0].text.startswith(f"The pass key is {keys[0]}.")
    assert [i.text.split(" is now ")[1].split(".")[0] for i in sample.inserts[1:]] == keys[1:]
    assert sample.extra["supporting_facts"] == [2]  # the last statement: the one the answer rests on
    assert tok.decode(sample.input_ids).endswith("What is the pass key now? The pass key is now")
    with pytest.raises(ValueError, match="updates"):
        passkey_update(tok, 1500, updates=0)


@pytest.mark.parametrize("updates", [1, 3, 6])
def test_keep_clear_leaves_the_last_tokens_without_a_statement(updates):
    """`keep_clear=n`: every statement ends before the prompt's last `n` tokens (a segment reader's last window holds
    none), spread over the rest in order; without it the statements reach the end, as before."""
    tok, length, clear = tiny_tokenizer(), 1024, 128
    ends = []
    for seed in range(8):
        sample = passkey_update(tok, length, seed=seed, updates=updates, keep_clear=clear)
        assert len(sample.input_ids) == length
        assert all(i.position + i.num_tokens <= length - clear for i in sample.inserts)
        assert [i.position for i in sample.inserts] == sorted(i.position for i in sample.inserts)
        ends.append(sample.inserts[-1].position + sample.inserts[-1].num_tokens)
    assert max(ends) > length - clear - 200  # the depths span the allowed filler, not a fixed slice of it
    unclear = [passkey_update(tok, length, seed=s, updates=updates).inserts[-1] for s in range(8)]
    assert max(i.position + i.num_tokens for i in unclear) > length - clear  # the default reaches the last window
    with pytest.raises(ValueError, match="keep_clear.*1024 tokens"):
        passkey_update(tok, length, updates=updates, keep_clear=length)


def test_bad_arguments_name_the_allowed_values():
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="Unknown task 'nope'.*passkey"):
        make_samples("nope", tok, 500, 1)
    with pytest.raises(ValueError, match="Unknown haystack 'nope'"):
        passkey(tok, 500, haystack="nope")
    with pytest.raises(ValueError, match="Unknown metric"):
        score("nope", "1", ["1"])


def test_scoring_is_exact():
    assert score("first_number", " 12345. Remember", ["12345"]) == 1.0
    assert score("first_number", " 1234 5", ["12345"]) == 0.0
    assert score("first_word", " Kitchen.", ["kitchen"]) == 1.0
    assert score("first_word", " the kitchen", ["kitchen"]) == 0.0
    assert score("all_contained", "AB and cd", ["ab", "CD", "ef"]) == pytest.approx(2 / 3)


def test_window_reader_sees_only_its_window_and_memory_reader_sees_everything():
    tok = tiny_tokenizer()
    base = tiny_llama(len(tok))
    sample = passkey(tok, 200, seed=0, haystack="repeat")
    window = Reader("window", base, window=32)
    changed = list(sample.input_ids)
    changed[:100] = [tok.eos_token_id] * 100  # outside the window: the answer cannot change
    assert window.generate(sample.input_ids, 6, tok.eos_token_id) == window.generate(changed, 6, tok.eos_token_id)
    full = Reader("full", base, max_length=150)
    assert not full.fits(200)
    model = ha.wrap_with_memory(tiny_llama(len(tok)), "rmt", segment_length=16, num_memory_tokens=2).eval()
    Reader("rmt", model)  # a memory model reads it all: tokens far outside any window change the last predictions
    late = token_nll(model, torch.tensor(sample.input_ids))[-20:], token_nll(model, torch.tensor(changed))[-20:]
    assert (late[0] - late[1]).abs().max() > 1e-4
    with pytest.raises(ValueError, match="MemoryModel reads the whole prompt"):
        Reader("bad", model, window=8)


def test_answer_rows_and_table_record_query_position_and_skips():
    tok = tiny_tokenizer()
    samples = make_samples("passkey", tok, 300, 2, haystack="repeat")
    readers = [Reader("full", tiny_llama(len(tok)), max_length=299), Reader("window", tiny_llama(len(tok)), window=64)]
    rows = answer_rows(readers, samples, tok, progress=False)
    assert [r["reader"] for r in rows] == ["full", "window"] * 2
    assert rows[0]["score"] is None and "longer than 299" in rows[0]["skipped"]
    assert rows[1]["query"] == "pass key" and rows[1]["inserts"][0]["position"] == samples[0].inserts[0].position
    table = accuracy_table(rows)
    assert set(table["passkey"]) == {"window"} and table["passkey"]["window"]["300"]["samples"] == 2


def test_book_nll_full_attention_equals_a_window_as_long_as_the_book():
    tok = tiny_tokenizer()
    base = tiny_llama(len(tok))
    ids = torch.tensor(make_samples("passkey", tok, 200, 1, haystack="repeat")[0].input_ids)
    full = book_nll(Reader("full", base), ids)
    assert full.shape == (199,)
    with torch.no_grad():
        logits = base(input_ids=ids[None]).logits[0]
    expected = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")
    torch.testing.assert_close(full, expected, rtol=1e-5, atol=1e-5)
    model = ha.wrap_with_memory(tiny_llama(len(tok)), "rmt", segment_length=16, num_memory_tokens=2).eval()
    torch.testing.assert_close(book_nll(Reader("rmt", model), ids), token_nll(model, ids))
