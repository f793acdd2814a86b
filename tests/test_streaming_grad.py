"""`step()` under gradients: the graph a stream holds stays bounded, and gradients flow within `bptt_depth`."""

from __future__ import annotations

import pytest

from cases import SEGMENT, wrap
from tiny import random_ids


def graph_nodes(state) -> int:
    """Autograd nodes reachable from the state's tensors (the graph a stream keeps alive)."""
    seen, stack = set(), [t.grad_fn for t in state.tensors.values() if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


@pytest.mark.parametrize("depth", [None, 2])
def test_a_stream_under_grad_keeps_a_bounded_graph(depth):
    model = wrap("rmt", "llama", bptt_depth=depth)
    ids = random_ids(2, 12 * SEGMENT)
    state, sizes = None, []
    for n in range(12):
        out, state = model.step(
            ids[:, n * SEGMENT : (n + 1) * SEGMENT], state, labels=ids[:, n * SEGMENT : (n + 1) * SEGMENT]
        )
        out.loss.backward(retain_graph=True)
        sizes.append(graph_nodes(state))
    assert sizes[0] > 0 and max(sizes[4:]) == max(sizes[:4])  # no growth after the first truncation windows


def test_gradients_flow_back_through_bptt_depth_segments_across_calls_and_stop_there():
    model = wrap("rmt", "llama", bptt_depth=2)
    ids = random_ids(1, 3 * SEGMENT)
    chunks = [ids[:, n * SEGMENT : (n + 1) * SEGMENT] for n in range(3)]
    out, first = model.step(chunks[0])
    memory = next(iter(first.tensors.values()))
    memory.retain_grad()
    out, second = model.step(chunks[1], first, labels=chunks[1])  # segment 1: inside the depth of segment 0
    out.loss.backward(retain_graph=True)
    assert memory.grad is not None and memory.grad.abs().sum() > 0
    later = next(iter(second.tensors.values()))
    later.retain_grad()
    out, _ = model.step(chunks[2], second, labels=chunks[2])  # segment 2 starts a new truncation window
    out.loss.backward()
    assert later.grad is None


def test_without_bptt_depth_gradients_stay_inside_one_call():
    model = wrap("rmt", "llama", bptt_depth=None)
    ids = random_ids(1, 4 * SEGMENT)
    out, first = model.step(ids[:, : 3 * SEGMENT], labels=ids[:, : 3 * SEGMENT])  # three segments in one call
    out.loss.backward()
    init = model.memory.memory_init
    assert init.grad is not None and init.grad.abs().sum() > 0  # later segments' loss reaches the first memory
    init.grad = None
    memory = next(iter(first.tensors.values()))
    memory.retain_grad()
    out, _ = model.step(ids[:, 3 * SEGMENT :], first, labels=ids[:, 3 * SEGMENT :])
    out.loss.backward()
    assert memory.grad is None and (init.grad is None or not init.grad.any())  # the incoming state was detached
