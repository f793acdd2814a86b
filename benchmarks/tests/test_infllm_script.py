"""benchmarks/infllm.py's `yarn` reader: transformers' YaRN RoPE scaling on a copy of the backbone."""

from __future__ import annotations

import torch

import infllm
from tiny import tiny_backbone


def test_yarn_reader_is_the_backbone_within_its_context_and_yarn_past_it():
    base = tiny_backbone("llama", max_position_embeddings=64).eval()
    ids = torch.randint(0, 90, (1, 40))
    same, rope = infllm.yarn_backbone(base, 40, 64)  # within the context: factor 1, YaRN is plain RoPE
    assert rope["rope_type"] == "yarn" and rope["factor"] == 1.0 and rope["original_max_position_embeddings"] == 64
    with torch.no_grad():
        torch.testing.assert_close(same(ids).logits, base(ids).logits, atol=1e-5, rtol=1e-5)
        scaled, rope = infllm.yarn_backbone(base, 256, 64)
        assert rope["factor"] == 4.0 and scaled.config.max_position_embeddings == 256
        assert base.config.rope_parameters["rope_type"] == "default"  # the base is not changed
        rotary = [m for m in scaled.modules() if hasattr(m, "inv_freq")]
        assert len(rotary) == 1 and rotary[0].rope_type == "yarn"
        # YaRN: the low frequencies interpolated by the factor, the attention scaled by 0.1 ln(factor) + 1
        assert abs(rotary[0].attention_scaling - (0.1 * torch.log(torch.tensor(4.0)).item() + 1)) < 1e-6
        low = base.model.rotary_emb.inv_freq[-1]
        assert torch.isclose(rotary[0].inv_freq[-1], low / 4, rtol=1e-4)
        assert not torch.equal(scaled(ids).logits, base(ids).logits)
        assert scaled(torch.randint(0, 90, (1, 200))).logits.isfinite().all()  # past the trained context
