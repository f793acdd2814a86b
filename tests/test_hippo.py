"""HiPPO-LegS: the closed forms against the paper-literal recurrence (float64), the LegS identities (scale invariance,
linearity), the behaviour of the paper's Table 12, recovery of an old value, and float32 stability at N = 8640."""

from __future__ import annotations

import math

import pytest
import torch

from hmt_adapters.methods.elastic.hippo import (
    DISCRETIZATIONS,
    HiPPOLegS,
    legs_basis,
    legs_kernel,
    legs_matrices,
    legs_transition,
)

F64 = torch.float64


def paper_zoh_step(A: torch.Tensor, B: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 22 and 25 as written: `A_k = exp(-A ln((k+1)/k))` (0 at k = 0), `B_k = A^-1 (I - A_k) B`."""
    eye = torch.eye(A.shape[0], dtype=F64)
    Ak = torch.zeros_like(A) if k == 0 else torch.linalg.matrix_exp(-A * math.log((k + 1) / k))
    return Ak, torch.linalg.solve(A, (eye - Ak) @ B)


def blockwise(h: HiPPOLegS, f: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    c, start = torch.zeros(*f.shape[:-1], h.N, dtype=f.dtype), 0
    for size in sizes:
        c = h.update(c, f[..., start : start + size], start)
        start += size
    return c


def midpoints(T: int) -> torch.Tensor:
    return (torch.arange(T, dtype=F64) + 0.5) / T


def sines(T: int, cycles, seed: int = 0) -> torch.Tensor:
    """A sum of sines with the given cycle counts over the sequence, random amplitudes and phases."""
    gen = torch.Generator().manual_seed(seed)
    x = midpoints(T)
    out = torch.zeros(T, dtype=F64)
    for w in cycles:
        amp, phase = (
            0.5 + torch.rand(1, generator=gen, dtype=F64),
            2 * math.pi * torch.rand(1, generator=gen, dtype=F64),
        )
        out += amp * torch.sin(2 * math.pi * w * x + phase)
    return out


def mse(h: HiPPOLegS, f: torch.Tensor) -> float:
    return float(((h.reconstruct(h.compress(f), f.shape[-1]) - f) ** 2).mean())


# ---- §8.1: structure and exactness ----------------------------------------------------------------------------


def test_A_is_lower_triangular_with_diagonal_1_to_N_and_A_inverse_B_is_e0():
    A, B = legs_matrices(64)
    assert torch.equal(A, torch.tril(A)) and torch.equal(torch.diag(A), torch.arange(1, 65, dtype=F64))
    torch.testing.assert_close(torch.linalg.solve(A, B), torch.eye(64, dtype=F64)[0], atol=1e-12, rtol=0)


def test_block_update_equals_the_paper_token_recurrence():
    N, L, blocks = 16, 8, 5
    A, B = legs_matrices(N)
    f = torch.randn(3, L * blocks, dtype=F64)
    c = torch.zeros(3, N, dtype=F64)
    for k in range(L * blocks):
        Ak, Bk = paper_zoh_step(A, B, k)
        c = c @ Ak.T + f[:, k : k + 1] * Bk
    h = HiPPOLegS(N, dtype=F64)
    assert (blockwise(h, f, [L] * blocks) - c).abs().max() < 1e-12
    stepped = torch.zeros(3, N, dtype=F64)
    for k in range(L * blocks):
        stepped = h.step(stepped, f[:, k], k)
    assert (stepped - c).abs().max() < 1e-12


@pytest.mark.parametrize("discretization", ["forward", "backward", "bilinear"])
def test_gbt_block_update_equals_its_token_recurrence(discretization):
    h = HiPPOLegS(12, discretization, dtype=F64)
    f = torch.randn(2, 32, dtype=F64)
    stepped = torch.zeros(2, 12, dtype=F64)
    for k in range(32):
        stepped = h.step(stepped, f[:, k], k)
    assert (blockwise(h, f, [8, 8, 8, 8]) - stepped).abs().max() < 1e-12


@pytest.mark.parametrize("N", [32, 128])
def test_transition_is_the_matrix_exponential_and_independent_of_block_length(N):
    A, _ = legs_matrices(N)
    for s, e in [(1, 2), (5, 6), (3, 17), (64, 80)]:
        ref = torch.linalg.matrix_exp(-A * math.log(e / s))
        assert (legs_transition(N, s, e) - ref).abs().max() < 1e-10
    assert torch.equal(legs_transition(N, 0, 8), torch.zeros(N, N, dtype=F64))
    for i in (1, 2, 7):
        assert (legs_transition(N, i * 8, (i + 1) * 8) - legs_transition(N, i, i + 1)).abs().max() < 1e-13


def test_prefix_form_equals_block_updates_however_the_sequence_is_cut():
    N, T = 24, 60
    h = HiPPOLegS(N, dtype=F64)
    f = torch.randn(4, T, dtype=F64)
    prefix = f @ legs_kernel(N, 0, T, T).T
    for sizes in ([T], [8] * 7 + [4], [1, 2, 3, 5, 8, 13, 28]):
        assert (blockwise(h, f, sizes) - prefix).abs().max() < 1e-12


def test_scale_invariance_repeating_every_token_twice_gives_the_same_state():
    h = HiPPOLegS(32, dtype=F64)
    f = torch.randn(3, 50, dtype=F64)
    assert (h.compress(f.repeat_interleave(2, dim=-1)) - h.compress(f)).abs().max() < 1e-12


def test_constant_input_is_represented_exactly():
    h = HiPPOLegS(32, dtype=F64)
    f = torch.full((2, 100), 3.25, dtype=F64)
    c = blockwise(h, f, [10] * 10)
    torch.testing.assert_close(c, 3.25 * torch.eye(32, dtype=F64)[0].expand(2, -1), atol=1e-12, rtol=0)
    torch.testing.assert_close(h.reconstruct(c, 100), f, atol=1e-11, rtol=0)


def test_compression_is_linear():
    h = HiPPOLegS(20, dtype=F64)
    f, g = torch.randn(2, 3, 40, dtype=F64)
    torch.testing.assert_close(
        h.compress(2.5 * f - 0.75 * g), 2.5 * h.compress(f) - 0.75 * h.compress(g), atol=1e-12, rtol=0
    )


# ---- Table 12 behaviour (N = 32, T = 1024 unless stated) -----------------------------------------------------


def test_smooth_signals_reconstruct_almost_exactly_and_fast_ones_do_not():
    h = HiPPOLegS(32, dtype=F64)
    assert mse(h, sines(1024, [4])) < 1e-6
    assert mse(h, sines(1024, [1, 2, 3])) < 1e-6
    assert mse(h, sines(1024, [16])) > 0.1  # beyond ~N/3 cycles: the low-pass limit


def expected_noise_mse(N: int, T: int) -> float:
    """`E ||f - R G f||^2 / T` for white noise `f`: `1 - 2 tr(M)/T + ||M||_F^2 / T` with `M = R G` (about
    `1 - N/T`)."""
    M = legs_basis(N, torch.arange(T, dtype=F64) + 0.5, T) @ legs_kernel(N, 0, T, T)
    return float(1 - 2 * torch.trace(M) / T + (M**2).sum() / T)


def test_noise_is_incompressible_and_its_error_falls_as_N_grows():
    noise = torch.randn(16, 1024, dtype=F64)
    errors = [mse(HiPPOLegS(N, dtype=F64), noise) for N in (32, 128, 512)]
    for N, err in zip((32, 128, 512), errors):
        expected = expected_noise_mse(N, 1024)  # 0.969, 0.878, 0.554 (paper: 0.97, 0.90, 0.72)
        assert abs(expected - (1 - N / 1024)) < 0.06 and abs(err - expected) < 0.04, (N, err, expected)
    assert errors[0] > errors[1] > errors[2]


def test_error_on_five_sines_falls_as_N_grows():
    f = sines(1024, [1, 2, 3, 4, 5])
    errors = [mse(HiPPOLegS(N, dtype=F64), f) for N in (12, 16, 24, 32)]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors


def test_zoh_is_ahead_of_the_other_discretisations():
    f = sines(1024, [1, 2, 3, 4, 5])
    errors = {d: mse(HiPPOLegS(32, d, dtype=F64), f) for d in DISCRETIZATIONS}
    assert errors["zoh"] < 1e-5
    assert errors["zoh"] < errors["bilinear"] and 10 * errors["zoh"] < errors["forward"], errors
    assert errors["zoh"] < errors["backward"]


# ---- long horizons --------------------------------------------------------------------------------------------


def test_a_value_from_block_1_is_recoverable_from_the_state_after_block_20():
    """The state is the L2 projection of the history, so the error of the block-1 mean is bounded by Parseval:
    `|mean_1(f_hat) - v| <= sqrt((t/L) (||f||^2 - ||c||^2))` (Cauchy-Schwarz on the block, `||.||` under mu^(t))."""
    N, L, blocks, D = 128, 32, 21, 8
    T = L * blocks
    value = torch.randn(D, dtype=F64)
    for noise in (0.0, 1.0):
        f = noise * torch.randn(D, T, dtype=F64)
        f[:, L : 2 * L] = value[:, None]
        c = blockwise(HiPPOLegS(N), f.float(), [L] * blocks).double()  # the float32 block path
        recovered = (T / L) * (c @ legs_kernel(N, L, 2 * L, T)).sum(-1)  # mean of the reconstruction over block 1
        bound = torch.sqrt((T / L) * ((f**2).mean(-1) - (c**2).sum(-1)).clamp(min=0))
        error = (recovered - value).abs()
        assert bool((error <= bound + 1e-4).all()), (error, bound)
        if noise == 0.0:
            assert bool((error <= 0.05 * value.abs().clamp(min=0.5)).all()), error


def test_float32_is_stable_at_N_8640():
    N, L, blocks = 8640, 2048, 2
    T = L * blocks
    x = midpoints(T)
    f = torch.stack([torch.sin(2 * math.pi * 3 * x) + 0.5, x**3 - x, torch.full_like(x, -2.0)])
    h = HiPPOLegS(N)
    c = blockwise(h, f.float(), [L] * blocks)
    reference = sum(f[:, p : p + L] @ legs_kernel(N, p, p + L, T).T for p in range(0, T, L))
    assert torch.isfinite(c).all()
    assert float((c.double() - reference).norm() / reference.norm()) < 1e-5
    assert (c[2, 1:].abs().max() < 1e-5) and abs(float(c[2, 0]) + 2.0) < 1e-5  # a constant stays c * e0
    err = ((h.reconstruct(c[:2], T).double() - f[:2]) ** 2).mean(-1)
    assert bool((err < 1e-6).all()), err


# ---- errors and the bank -------------------------------------------------------------------------------------


def test_bad_arguments_name_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"`N` \(the HiPPO order\) must be an integer >= 1, got 0"):
        HiPPOLegS(0)
    with pytest.raises(
        ValueError,
        match=r"`discretization` must be one of \['zoh', 'bilinear', 'forward', 'backward'\], "
        r"got 'rk4'",
    ):
        HiPPOLegS(8, "rk4")
    h = HiPPOLegS(8)
    with pytest.raises(ValueError, match=r"last dimension N=8, got shape \(3, 5\)"):
        h.reconstruct(torch.zeros(3, 5), 10)
    with pytest.raises(ValueError, match=r"`T` .* must be an integer >= 1, got 0"):
        h.reconstruct(torch.zeros(8), 0)
    with pytest.raises(ValueError, match=r"0 <= start < end, got start=4, end=4"):
        h.transition(4, 4)
    with pytest.raises(ValueError, match=r"T >= 1, got shape \(2, 0\)"):
        h.compress(torch.zeros(2, 0))


def test_the_bank_stays_within_its_byte_budget_and_keeps_the_first_blocks():
    h = HiPPOLegS(16, cache_bytes=20_000)
    c = torch.zeros(2, 16)
    for i in range(200):
        c = h.update(c, torch.randn(2, 8), 8 * i)
    assert 20_000 - 16 * 16 * 4 < h.cache.nbytes <= 20_000 and 0 < len(h.cache) < 40
    assert h.transition(0, 8) is h.transition(0, 8)  # revisited by every training sample: kept
    assert h.transition(8 * 199, 8 * 200) is not h.transition(8 * 199, 8 * 200)  # past the budget: rebuilt
    torch.testing.assert_close(h.transition(8 * 199, 8 * 200), h.transition(8 * 199, 8 * 200))


def test_the_old_import_path_warns_and_gives_the_same_objects():
    """`hmt_adapters.hippo` (named in DESIGN.md and earlier docs) is a deprecated alias of the module's new home."""
    from hmt_adapters.methods.elastic import hippo

    with pytest.warns(DeprecationWarning, match="hmt_adapters.methods.elastic.hippo.HiPPOLegS"):
        from hmt_adapters.hippo import HiPPOLegS as old
    assert old is hippo.HiPPOLegS is HiPPOLegS
