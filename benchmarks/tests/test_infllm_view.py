"""benchmarks/infllm_view.py: the question chunk's view of the default reader, rebuilt as a plain prompt."""

from __future__ import annotations

import pytest

from hmt_adapters.evaluation.samples import Insert, Sample
from infllm_view import question_view


def sample(needle_at: int, length: int = 4096, distractor_at: int | None = None) -> Sample:
    inserts = [Insert("The key is 7.", 0.5, needle_at, 20)]
    if distractor_at is not None:
        inserts.append(Insert("The key is 9.", 0.5, distractor_at, 20))
    return Sample("t", length, list(range(length)), ["7"], "key", inserts, "repeat")


def test_the_ordered_view_is_sinks_needle_blocks_with_neighbours_tail_and_last_chunk_in_document_order():
    ids = question_view(sample(1000), window=1024, sinks=128, block=128, chunk=512)
    # the needle (1000..1019) lies in block (1000 - 128) // 128 = 6: blocks 5, 6, 7 = tokens 768..1151
    assert ids == [*range(128), *range(768, 1152), *range(2560, 3584), *range(3584, 4096)]
    near = question_view(sample(1000), window=1024, sinks=128, block=128, chunk=512, view="near")
    assert near == [*range(128), *range(2560, 3584), *range(768, 1152), *range(3584, 4096)]
    assert question_view(sample(1000), 1024, 128, 128, 512, "no-sinks") == ids[128:]
    cut = question_view(sample(1000), 1024, 128, 128, 512, "tail=256")
    assert cut == [*range(128), *range(768, 1152), *range(3328, 4096)]


def test_a_needle_across_a_block_boundary_brings_both_blocks_and_their_outer_neighbours():
    ids = question_view(sample(1020), window=1024, sinks=128, block=128, chunk=512)  # 1020..1039: blocks 6 and 7
    assert ids[128 : 128 + 4 * 128] == list(range(768, 1280))


def test_a_needle_in_view_and_distractors_add_no_blocks():
    # only the answer's needle is retrieved; one already inside the tail needs none
    ids = question_view(sample(3000, distractor_at=1000), window=1024, sinks=128, block=128, chunk=512)
    assert ids == [*range(128), *range(2560, 4096)]
    with pytest.raises(ValueError, match="view 'side': expected 'ordered', 'near', 'no-sinks' or 'tail=N'"):
        question_view(sample(1000), 1024, 128, 128, 512, "side")
