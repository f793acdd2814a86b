"""benchmarks/cost_report.py: re-measuring some methods keeps the other rows of every part; FLOPs count what the
decode reads run; the selection share times the per-query top-k alone (docs/cost.md)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from cases import METHOD_CASES, SEGMENT, wrap  # noqa: E402
from common import counted_flops  # noqa: E402
from cost_report import decode_flops, keep_rows, selection_share  # noqa: E402
from hmt_adapters.methods.unimem import reading
from tiny import random_ids, tiny_backbone  # noqa: E402


def rows(*names: str) -> dict:
    return {n: {"rate": float(i)} for i, n in enumerate(names)}


PARTS = {  # the four parts' layouts, as cost_report's measures write them
    "speed": lambda r: {"llama4/128": {"model": "llama4", "segment": 128, "rounds": 5, "rows": r}},
    "length": lambda r: {"model": "llama4", "segment": 512, "lengths": [8192, 32768], "rows": r},
    "decode": lambda r: {"model": "llama4", "segment": 256, "rounds": 3, "batches": {"1": r, "8": copy.deepcopy(r)}},
}


def tables(part: dict) -> list[dict]:
    if "rows" in part:
        return [part["rows"]]
    if "batches" in part:
        return list(part["batches"].values())
    return [run["rows"] for run in part.values()]


def test_rows_not_re_measured_are_kept_and_say_when_they_were_measured():
    for layout in PARTS.values():
        old = layout(rows("bare", "hmt", "rmt"))
        new = layout(rows("bare", "rmt"))
        new_rmt = [copy.deepcopy(t["rmt"]) for t in tables(new)]
        keep_rows(new, old, "abc, 2026-11-25")
        for table, rmt in zip(tables(new), new_rmt):
            assert list(table) == ["bare", "rmt", "hmt"]
            assert table["rmt"] == rmt  # re-measured: the new numbers, no stamp
            assert table["hmt"] == {"measured": "abc, 2026-11-25", "rate": 1.0}


def test_a_row_kept_twice_keeps_its_first_stamp():
    old = PARTS["length"](rows("bare", "hmt"))
    old["rows"]["hmt"]["measured"] = "first, 2026-11-01"
    new = PARTS["length"](rows("bare"))
    keep_rows(new, old, "second, 2026-11-25")
    assert new["rows"]["hmt"]["measured"] == "first, 2026-11-01"


def test_nothing_is_kept_from_another_setup():
    old = PARTS["length"](rows("bare", "hmt"))
    new = PARTS["length"](rows("bare"))
    new["lengths"] = [8192, 131072]
    keep_rows(new, old, "abc, 2026-11-25")
    assert list(new["rows"]) == ["bare"]
    old, new = PARTS["speed"](rows("bare", "hmt")), PARTS["speed"](rows("bare"))
    new["llama4/128"]["segment"] = 256
    keep_rows(new, old, "abc, 2026-11-25")
    assert list(new["llama4/128"]["rows"]) == ["bare"]
    keep_rows(new, {}, "abc, 2026-11-25")  # no earlier part: nothing to keep
    assert list(new["llama4/128"]["rows"]) == ["bare"]


def test_torch_sdpa_on_cpu_counts_its_query_by_key_rectangle():
    """A decoded token's memory read runs torch's SDPA itself (docs/cost.md): counted like CUDA's kernels, with GQA."""
    query, key = torch.randn(2, 8, 3, 16), torch.randn(2, 4, 40, 16)
    visible = torch.ones(2, 1, 3, 40, dtype=torch.bool)
    flops = counted_flops(lambda: F.scaled_dot_product_attention(query, key, key, attn_mask=visible, enable_gqa=True))
    assert flops["total"] == 2 * (2 * 2 * 8 * 3 * 40 * 16)  # scores and weighted values


def test_decode_flops_are_the_new_tokens_alone():
    """The prefill cancels out: a longer prompt adds only the attention over its keys to the decoded tokens."""
    net = tiny_backbone("llama").eval()
    net.set_attn_implementation("eager")
    short = decode_flops(net, torch.ones(1, 4, dtype=torch.long), 3)
    long = decode_flops(net, torch.ones(1, 20, dtype=torch.long), 3)
    config = net.config
    dim = config.hidden_size // config.num_attention_heads
    extra_keys = 16 * 3  # each of the 3 decoded tokens (the first comes with the prefill) reads 16 more keys
    per_key = 2 * 2 * config.num_attention_heads * dim * config.num_hidden_layers  # scores and values, every layer
    assert long - short == extra_keys * per_key


@pytest.mark.parametrize("method", list(METHOD_CASES))
def test_decode_flops_count_every_method_through_a_closing_segment(method):
    """The FLOP counter tracks modules through gradient hooks, which reject an input that needs a gradient under
    no_grad: a view of a parameter fed to the backbone as it is (MELODI's summaries, when a decoded segment closed
    from its steps) stopped the decode table's count."""
    model = wrap(method, "llama").eval()
    assert decode_flops(model, random_ids(1, 2 * SEGMENT), SEGMENT + 2) > 0  # the third segment closes


def test_selection_share_times_the_per_query_top_k_alone():
    """The speed table's selection share: a part of a top-k read's forward, nothing for a read without per-query
    top-k, and the selection is the package's own again afterwards."""
    select = reading.top_entries
    ids = random_ids(1, 4 * SEGMENT)
    share = selection_share(wrap("memorizing_transformer", "llama").eval(), ids, "cpu")
    assert 0 < share < 1
    assert selection_share(wrap("transformer_xl", "llama").eval(), ids, "cpu") == 0
    assert reading.top_entries is select
