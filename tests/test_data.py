"""Long-document data: loading, tokenizing, windows that keep document boundaries, the collator, the two corpora."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from datasets import Dataset

from hmt_adapters.data import (
    WindowCollator,
    austen_text,
    jane_austen,
    kjv_bible,
    load_documents,
    make_windows,
    split_by_document,
    tokenize_documents,
)
from hmt_adapters.data.windows import depth_summary
from hmt_adapters.runtime import shift_targets


class CharTokenizer:
    """One token per character (ids 2..51), EOS = 1: enough to check lengths and boundaries."""

    eos_token_id = 1

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[2 + ord(c) % 50 for c in t] for t in texts]}


def documents(*lengths: int) -> Dataset:
    return Dataset.from_dict({"title": [f"d{i}" for i in range(len(lengths))], "text": ["x" * n for n in lengths]})


def test_windows_never_cross_documents_and_drop_tails_shorter_than_a_segment():
    tokenized = tokenize_documents(documents(30, 9), CharTokenizer())
    assert [len(r) for r in tokenized["input_ids"]] == [31, 10] and tokenized["input_ids"][0][-1] == 1
    windows = make_windows(tokenized, segment_length=4, n_segments=2)
    assert windows["document"] == [0, 0, 0, 0, 1]
    assert [len(r) for r in windows["input_ids"]] == [8, 8, 8, 7, 8]  # doc 1's 2-token tail is dropped
    packed = make_windows(tokenized, segment_length=4, n_segments=2, cross_documents=True)
    assert [len(r) for r in packed["input_ids"]] == [8] * 5 and packed["document"] == [0, 0, 0, 0, 1]
    whole = make_windows(tokenized, segment_length=4, n_segments=2, min_segments=2)
    assert [len(r) for r in whole["input_ids"]] == [8, 8, 8, 8]


def test_collator_pads_per_sample_and_masks_padding_positions_only():
    batch = WindowCollator(pad_token_id=1, min_length=2)([{"input_ids": [5, 1, 7]}, {"input_ids": [4, 3]}])
    assert batch["input_ids"].tolist() == [[5, 1, 7], [4, 3, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[5, 1, 7], [4, 3, -100]]  # the EOS (= pad id) inside a row stays a target
    assert "return_logits" not in batch  # the model decides: none in a training step, logits in evaluation
    assert WindowCollator(return_logits=False)([{"input_ids": [5, 1]}])["return_logits"] is False
    labelled = WindowCollator()([{"input_ids": [5, 6], "labels": [-100, 6]}])
    assert labelled["labels"].tolist() == [[-100, 6]]


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: WindowCollator()([{"text": "hi"}]), ValueError, "Row 0 has no `input_ids`.*tokenize"),
        (lambda: WindowCollator(min_length=4)([{"input_ids": [1, 2, 3]}]), ValueError, "3 tokens.*at least 4"),
        (lambda: tokenize_documents(documents(5, 0), CharTokenizer()), ValueError, "Document 1 is empty"),
        (lambda: make_windows(Dataset.from_dict({"text": ["a"]}), 4, 2), ValueError, "no `input_ids` column"),
        (lambda: make_windows(Dataset.from_dict({"input_ids": [[1] * 9]}), 0, 2), ValueError, "segment_length"),
        (
            lambda: make_windows(Dataset.from_dict({"input_ids": [[1] * 9]}), 4, 2, min_segments=3),
            ValueError,
            "min_segments",
        ),
        (lambda: make_windows(Dataset.from_dict({"input_ids": [[1] * 3]}), 4, 2), ValueError, "longest has 3 tokens"),
        (lambda: load_documents(["/no/such/file.txt"]), FileNotFoundError, "not found"),
        (
            lambda: make_windows(Dataset.from_dict({"input_ids": [[1] * 9]}), 4, 2, stride=9),
            ValueError,
            r"`stride` must be in \[1, 8\]",
        ),
        (lambda: make_windows(Dataset.from_dict({"input_ids": [[1] * 9]}), 4, 2, stride=0), ValueError, "`stride`"),
        (lambda: WindowCollator(loss_segments=1), ValueError, "needs `segment_length`"),
        (
            lambda: WindowCollator(loss_segments=0, segment_length=4),
            ValueError,
            "`loss_segments` must be None or an integer",
        ),
    ],
)
def test_bad_input_is_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_local_text_and_jsonl_files_load_as_one_row_per_document(tmp_path):
    (tmp_path / "a.txt").write_text("first document\nwith two lines\n")
    (tmp_path / "b.txt").write_text("second\n")
    texts = load_documents(tmp_path)
    assert texts["title"] == ["a", "b"] and texts["text"][0].startswith("first document\nwith")
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"body": t}) for t in ("one", "two", "three")))
    rows = load_documents(tmp_path / "docs.jsonl", text_column="body")
    assert rows["text"] == ["one", "two", "three"]
    with pytest.raises(ValueError, match="no column 'content'"):
        load_documents(tmp_path / "docs.jsonl", text_column="content")


def test_held_out_split_is_by_whole_document():
    split = split_by_document(documents(*range(10, 20)), test_size=3, seed=0)
    assert len(split["test"]) == 3 and not set(split["test"]["title"]) & set(split["train"]["title"])


def test_kjv_bible_is_66_books_with_verse_numbers_stripped():
    bible = kjv_bible(test_size=7)
    assert len(bible["train"]) == 59 and len(bible["test"]) == 7
    genesis = next(r for r in bible["train"].to_list() + bible["test"].to_list() if r["title"] == "Genesis")
    assert genesis["text"].startswith("In the beginning God created the heaven")
    assert "1:2" not in genesis["text"][:500]


AUSTEN_SHA256 = {  # of the janeaustenr 1.0.0 export the published results were computed on (austen/SOURCE.md)
    "emma": "7c67b5985c6d0de1efaeb5d342d52cb82c38083c40e2295129e30e87ee690ebe",
    "mansfieldpark": "98bc90519cdf4ef663ad7de2734bb529435ef24f7abbde6bb1a50898871dafe9",
    "northangerabbey": "51f91bbe0517db8e65cff009b097ce0a1836124c4e0532ac19e6c0cad982abed",
    "persuasion": "8061549557aebd2fd6e353d18d9197cb707029112bd52d4d8b174583a925848a",
    "prideprejudice": "dfc684d4f857fa938268f9ab9c5567b64bd0691251eca959644adeabe6287a4d",
    "sensesensibility": "105e1651fe93bed7130078578efd31e0c557d68667ba672ddc876f735b30fe09",
}


def test_jane_austen_ships_the_six_novels_byte_for_byte_and_holds_out_persuasion():
    assert {n: hashlib.sha256(austen_text(n).encode()).hexdigest() for n in AUSTEN_SHA256} == AUSTEN_SHA256
    assert sum(len(austen_text(n).split()) for n in AUSTEN_SHA256) == 717_537
    novels = jane_austen()
    assert novels["test"]["title"] == ["Persuasion"]  # the held-out novel of every published Austen number
    assert sorted(novels["train"]["title"]) == [
        "Emma",
        "Mansfield Park",
        "Northanger Abbey",
        "Pride and Prejudice",
        "Sense and Sensibility",
    ]
    pride = next(r["text"] for r in novels["train"] if r["title"] == "Pride and Prejudice")
    assert pride.startswith(
        "PRIDE AND PREJUDICE\n\nBy Jane Austen\n\nChapter 1\n\nIt is a truth universally "
        "acknowledged, that a single man in possession of a good fortune, must be in want of a "
        "wife."
    )
    with pytest.raises(ValueError, match="'pride'.*'prideprejudice'"):
        austen_text("pride")


def test_tokenized_windows_feed_a_memory_model_through_the_collator():
    import hmt_adapters as ha
    from tiny import tiny_backbone

    windows = make_windows(tokenize_documents(documents(40, 23), CharTokenizer()), segment_length=8, n_segments=3)
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    batch = WindowCollator(min_length=8)([windows[i] for i in range(len(windows))])
    loss = model(**batch).loss
    assert torch.isfinite(loss) and batch["input_ids"].shape[1] == 24


def test_stride_windows_end_every_stride_overlap_and_reach_back_one_window():
    tokenized = tokenize_documents(documents(30), CharTokenizer())  # 31 tokens with the EOS
    ids = tokenized["input_ids"][0]
    windows = make_windows(tokenized, segment_length=4, n_segments=3, stride=4)
    spans = [(0, 4), (0, 8), (0, 12), (4, 16), (8, 20), (12, 24), (16, 28), (20, 31)]
    assert windows["input_ids"] == [ids[s:e] for s, e in spans]  # consecutive full windows share 12 - 4 tokens
    assert make_windows(tokenized, 4, 3, stride=12)["input_ids"] == make_windows(tokenized, 4, 3)["input_ids"]
    full = make_windows(tokenized, 4, 3, stride=4, min_segments=3)  # only windows with 3 full segments
    assert full["input_ids"] == [ids[s:e] for s, e in spans[2:7]]
    assert str(depth_summary(windows, 4, 3)) == (
        "8 windows, 3 segments asked, depth min/median/max 1/3/3, 2 (25.0%) shorter"
    )
    summary = depth_summary(make_windows(tokenized, 4, 5), 4, 5)  # 20 + 11 tokens: depths 5 and 3
    assert (summary.min, summary.median, summary.max, summary.shorter) == (3, 4, 5, 1)


@pytest.mark.parametrize("k", [1, 2])
def test_loss_segments_keep_exactly_the_predictions_inside_the_last_k_segments(k):
    rows = [{"input_ids": list(range(2, 12))}, {"input_ids": list(range(2, 9))}, {"input_ids": [5, 6, 7]}]
    batch = WindowCollator(loss_segments=k, segment_length=4)(rows)
    first = {1: [9, 5, 1], 2: [5, 1, 1]}[k]  # one past the start of the last k segments (10, 7, 3 tokens)
    for row, (n, start) in enumerate(zip([10, 7, 3], first)):
        labels = batch["labels"][row]
        assert (labels[:start] == -100).all() and labels[start:n].tolist() == rows[row]["input_ids"][start:]
        assert (labels[n:] == -100).all()
        predicting = (shift_targets(labels[None])[0] != -100).nonzero().flatten().tolist()
        assert predicting == list(range(start - 1, n - 1))  # positions inside the last k segments, none before them
