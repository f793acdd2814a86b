"""What a K/V memory reads of the recall key (docs/attention_memory.md): per memory layer, at the query segment of a
recall batch.

For every memory layer of a `UniMem` model (Transformer-XL, TRAMS, Memorizing, UniMix) the probe reports
- `stored`: fraction of the key's tokens (marker + digits) held in the layer's store when the query segment runs;
- `read`: fraction of them the reading rule hands to the attention (TRAMS selection, top-k retrieval per query);
- `mass`: attention probability that the answer's queries (the query marker and the first digits) put on them,
  mean over heads and the largest head.
The mass is measured exactly by running the layer's own memory attention once more with the stored values replaced
by an indicator of the key's entries and the local values by zeros: its output is then the weight on the key.
`key_gradient` tells whether the answer's loss reaches the key segment's input embeddings at all.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hmt_adapters.memory.attend import attend_memory, expand_heads
from hmt_adapters.tasks.recall import KEY, RecallTask


def key_positions(batch: dict[str, torch.Tensor], task: RecallTask) -> torch.Tensor:
    """Stream positions `[B, 1 + digits]` of the key marker and the key digits in segment 0."""
    first = (batch["input_ids"][:, : task.segment_length] == KEY).float().argmax(1)
    return first[:, None] + torch.arange(task.num_digits + 1)


@torch.no_grad()
def run_patched(model, method, name: str, fn, input_ids: torch.Tensor) -> None:
    """One eval forward of `model` with `method.<name>` replaced by `fn` on the instance, restored afterwards."""
    setattr(method, name, fn)
    try:
        model.eval()
        model(input_ids=input_ids)
    finally:
        delattr(method, name)


def probe_unimem(model, task: RecallTask, gap: int, batch_size: int = 64, seed: int = 1234) -> dict[int, dict]:
    """Per memory layer `{stored, read, mass_mean, mass_max}` at the query segment (see the module docstring)."""
    method = model.memory
    batch = task.sample(batch_size, gap, torch.Generator().manual_seed(seed))
    keys = key_positions(batch, task)
    last_seen = (gap + 1) * task.segment_length
    answer = torch.arange(task.num_digits) + task.segment_length - task.num_digits - 1  # query marker .. digit n-1
    found: dict[int, dict] = {}
    original = method._attend

    def attend_probed(layer, state, frame):
        inner = original(layer, state, frame)

        def attend(call, context):
            out = inner(call, context)
            if int(state["seen"][0]) == last_seen and layer not in found:
                found[layer] = measure(layer, state, frame, call, context)
            return out

        return attend

    def measure(layer, state, frame, call, context) -> dict:
        is_key = state["valid"] & (state["pos"][:, :, None] == keys[:, None, :]).any(-1)  # [B, M]
        v = state[f"v.{layer}"]
        indicator = is_key[:, None, :, None].to(v.dtype).expand_as(v).contiguous()
        read = method.read(layer, {**state, f"v.{layer}": indicator}, frame, call, context)
        gate = None
        if method.gate is not None:
            gate = torch.sigmoid(method.gate[method.layers.index(layer)])[None, :, None, None]
        mass, _ = attend_memory(replace(call, value=torch.zeros_like(call.value)), read, gate)
        mass = mass[:, frame.prefix + answer, :, 0]  # [B, answer queries, Hq]
        total = keys.shape[1]
        heads = call.query.shape[1]
        shared = expand_heads(read.v[..., 0], heads)[:, :, None, :] * expand_heads(read.visible, heads)  # [B,H,q|1,S]
        if shared.shape[2] > 1:
            shared = shared[:, :, frame.prefix + answer]
        found_keys = shared.sum(-1).float().mean()
        if read.pq_v is not None:
            retrieved = read.pq_v[..., 0] * read.pq_visible  # [B, Hq, q, K]
            found_keys = found_keys + retrieved.sum(-1)[:, :, frame.prefix + answer].float().mean()
        return {
            "stored": float(is_key.float().sum(1).mean() / total),
            "read": float(found_keys / total),
            "mass_mean": float(mass.mean()),
            "mass_max_head": float(mass.mean((0, 1)).max()),
        }

    run_patched(model, method, "_attend", attend_probed, batch["input_ids"])
    return dict(sorted(found.items()))


def key_gradient(model, task: RecallTask, gap: int, batch_size: int = 16, seed: int = 0) -> float:
    """Norm of the answer loss's gradient with respect to the key segment's input embeddings (0: no signal)."""
    batch = task.sample(batch_size, gap, torch.Generator().manual_seed(seed))
    embedding = model.get_input_embeddings()
    captured: list[torch.Tensor] = []

    def keep_first(_module, _args, out):
        if not captured:
            out.retain_grad()
            captured.append(out)

    handle = embedding.register_forward_hook(keep_first)
    try:
        model.train()
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
    finally:
        handle.remove()
    grad = captured[0].grad
    model.zero_grad(set_to_none=True)
    return 0.0 if grad is None else float(grad[:, : task.segment_length].norm())


@torch.no_grad()
def probe_elastic(model, task: RecallTask, gap: int, batch_size: int = 64, seed: int = 1234) -> dict[int, dict]:
    """Per Elastic memory layer `{key_share, mass_mean, mass_max_head}` at the query segment.

    `key_share`: for each key token, the largest share of one reconstructed memory token's weight (its squared
    reconstruction weights, summed over the history) that comes from that token, averaged over the key's tokens; a
    token no sample point lands on gets ~0 and cannot be read back. `mass`: attention on the key's content, measured
    as in `probe_unimem` with the HiPPO state of an indicator of the key's tokens in place of the values.
    """
    method = model.memory
    batch = task.sample(batch_size, gap, torch.Generator().manual_seed(seed))
    keys = key_positions(batch, task)
    history = (gap + 1) * task.segment_length
    answer = torch.arange(task.num_digits) + task.segment_length - task.num_digits - 1
    found: dict[int, dict] = {}
    original = method.prepare

    def prepare(segment, state, plan):
        layout = original(segment, state, plan)
        if int(state["length"][0]) == history:
            for layer, read in list(layout.attention.reads.items()):
                layout.attention.reads[layer] = measured(layer, read, state)
        return layout

    def measured(layer, read, state):
        def attend(call, context):
            out = read(call, context)
            device = call.query.device
            readout = method.readout([history], device)[0].float()  # [L_mem, N]
            weights = readout @ method.hippo.kernel(0, history, device).float()  # [L_mem, T]: token t in sample j
            energy = weights.pow(2)
            share = energy / energy.sum(1, keepdim=True).clamp_min(1e-30)
            is_key = torch.zeros(batch_size, history, device=device).scatter_(1, keys, 1.0)
            k_mem = readout[None, None] @ state[f"k.{layer}"].float()
            v_ind = (is_key @ weights.T)[:, None, :, None].expand(-1, k_mem.shape[1], -1, k_mem.shape[-1])
            visible = torch.ones(batch_size, 1, 1, 1, dtype=torch.bool, device=device)
            zeros = replace(call, value=torch.zeros_like(call.value))
            mass = zeros.run_with_prefix(k_mem.to(call.key.dtype), v_ind.to(call.value.dtype), visible)[0]
            mass = mass[:, answer, :, 0]
            found[layer] = {
                "key_share": float(share.max(0).values[keys].mean()),
                "mass_mean": float(mass.mean()),
                "mass_max_head": float(mass.mean((0, 1)).max()),
            }
            return out

        return attend

    run_patched(model, method, "prepare", prepare, batch["input_ids"])
    return dict(sorted(found.items()))
