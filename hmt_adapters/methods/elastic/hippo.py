"""HiPPO-LegS: online Legendre compression of a signal's whole history into `N` coefficients (Gu et al. 2020).

The state after `t` tokens is `c_n(t) = (1/t) int_0^t f(x) g_n^(t)(x) dx` with `g_n^(t)(x) = sqrt(2n+1) P_n(2x/t - 1)`
(Elastic Memory Eq. 2); it evolves by `dc/dt = -(1/t) A c + (1/t) B f` (Eq. 3, 18-19). Token `k` (0-based) is held
constant on `[k, k+1)` (zero-order hold, App. E.2). Because the LegS ODE is exact, ZOH gives exactly the Legendre
projection of the piecewise-constant signal, so every matrix has a closed form (App. E.2-E.3) and needs no matrix
exponential: the block transition `(start/end)^A` comes from a three-term recurrence on dilated Legendre
polynomials, the block kernel from antiderivatives of Legendre polynomials. Both are built in float64 and stored in
the class dtype (float32 by default); the recurrences stay accurate at N = 8640 (tests/test_hippo.py).

The forward, backward and bilinear discretisations (generalised bilinear transform; Table 12 names them, no formulas)
have no closed form: their block matrices are accumulated from the per-token matrices (small N only).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

DISCRETIZATIONS = ("zoh", "bilinear", "forward", "backward")
_GBT = {"forward": 0.0, "backward": 1.0, "bilinear": 0.5}  # implicitness `a` of the generalised bilinear transform
_F64 = torch.float64


# ---- closed forms (float64 in, any dtype out) -----------------------------------------------------------------


def legs_matrices(order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HiPPO-LegS `A` `[N, N]` and `B` `[N]` (Eq. 19), float64: `A` lower triangular with diagonal `1..N`."""
    n = torch.arange(order, dtype=_F64)
    r = torch.sqrt(2 * n + 1)
    return torch.tril(r[:, None] * r[None, :], diagonal=-1) + torch.diag(n + 1), r.clone()


def _legendre_np(z: np.ndarray, count: int) -> Iterator[np.ndarray]:
    """`P_0(z), ..., P_{count-1}(z)` (float64 numpy): the recurrences below run N short steps, where a numpy
    operation costs a fraction of a torch call (the matrices of a stream are built every segment)."""
    prev, cur = np.zeros_like(z), np.ones_like(z)
    for n in range(count):
        yield cur
        prev, cur = cur, ((2 * n + 1) * z * cur - n * prev) / (n + 1)


def legendre(z: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
    """`P_0(z), P_1(z), ..., P_{count-1}(z)` by the (stable) three-term recurrence, one float64 tensor at a time."""
    for p in _legendre_np(z.detach().to(_F64).cpu().numpy(), count):
        yield torch.from_numpy(p)


def legs_basis(order: int, x: torch.Tensor, horizon: float, dtype: torch.dtype = _F64) -> torch.Tensor:
    """The reconstruction matrix `R[j, n] = g_n^(t)(x_j) = sqrt(2n+1) P_n(2 x_j / t - 1)` `[M, N]` (Eq. 7, 30)."""
    z = 2 * torch.as_tensor(x).detach().to(_F64).cpu().numpy() / horizon - 1
    out = np.empty((order, z.shape[0]))
    for n, p in enumerate(_legendre_np(z, order)):
        out[n] = p
    out *= np.sqrt(2 * np.arange(order) + 1.0)[:, None]
    return torch.from_numpy(out.T.copy()).to(dtype)


def legs_kernel(order: int, start: int, end: int, horizon: int, dtype: torch.dtype = _F64) -> torch.Tensor:
    """Columns for tokens `start..end-1` of the state at `horizon`: `[N, end-start]` (Eq. 27 in closed form).

    `K[n, j] = (1/h) int_p^{p+1} g_n^(h)(x) dx = sqrt(2n+1)/2 [I_n(z_{p+1}) - I_n(z_p)]`, `p = start + j`,
    `z_p = 2p/h - 1`, `I_0(z) = z`, `I_n = (P_{n+1} - P_{n-1}) / (2n+1)`. With `horizon = end` this is the HiPPO
    kernel of the block (Eq. 6, 27); with `start = 0` the whole prefix state is `K @ F`.
    """
    z = 2 * np.arange(start, end + 1, dtype=np.float64) / horizon - 1
    out = np.empty((order, end - start))
    out[0] = 0.5 * (z[1:] - z[:-1])
    values = _legendre_np(z, order + 1)
    below, current = next(values), next(values)  # P_{n-1}, P_n for n = 1
    for n in range(1, order):
        above = next(values)  # P_{n+1}
        integral = (above - below) / (2 * n + 1)
        out[n] = 0.5 * math.sqrt(2 * n + 1) * (integral[1:] - integral[:-1])
        below, current = current, above
    return torch.from_numpy(out).to(dtype)


def legs_transition(order: int, start: int, end: int, dtype: torch.dtype = _F64) -> torch.Tensor:
    """The ZOH state map from `start` to `end` tokens, `(start/end)^A` `[N, N]`; zero when `start == 0`.

    `P[n, m] = (1/e) int_0^s g_m^(s) g_n^(e) dx` (App. E.3's block transition). With `r = s/e` and shifted Legendre
    polynomials `p_n(y) = P_n(2y - 1)`, `p_n(r y) = sum_m a^(n)_m p_m(y)` and
    `P[n, m] = r sqrt((2n+1)/(2m+1)) a^(n)_m`.
    The rows `a^(n)` follow Legendre's recurrence `(n+1) p_{n+1}(u') = (2n+1) u' p_n(u') - n p_{n-1}(u')` with
    `u' = r u + r - 1`, `u = 2y - 1`, where multiplying by `u` is tridiagonal in the `p_m` basis. O(N^2) work, each
    row bounded (the map is a contraction), no matrix exponential. Rows are built in float64 numpy (N short steps).
    """
    if start == 0:
        return torch.zeros(order, order, dtype=dtype)
    a = np.zeros((order, order))  # a[n, m] = a^(n)_m
    r = start / end
    k = np.arange(order + 1, dtype=np.float64)
    from_below = r * k / np.maximum(2 * k - 1, 1)  # u p_{k-1} contributes k/(2k-1) p_k
    from_above = r * (k + 1) / (2 * k + 3)  # u p_{k+1} contributes (k+1)/(2k+3) p_k
    prev, cur = np.zeros(order + 1), np.zeros(order + 1)
    cur[0] = 1.0
    a[0, 0] = 1.0
    for n in range(order - 1):
        m = n + 2  # a^(n+1) lives on 0..n+1
        nxt = np.zeros(order + 1)
        nxt[1:m] = cur[: m - 1] * from_below[1:m]
        nxt[: m - 1] += cur[1:m] * from_above[: m - 1] + (r - 1) * cur[: m - 1]
        nxt[:m] = ((2 * n + 1) * nxt[:m] - n * prev[:m]) / (n + 1)
        prev, cur = cur, nxt
        a[n + 1, :m] = cur[:m]
    scale = np.sqrt(2 * k[:order] + 1)
    return torch.from_numpy(r * scale[:, None] * a / scale[None, :]).to(dtype)


# ---- bank -----------------------------------------------------------------------------------------------------


class TensorCache:
    """A store of fixed matrices bounded by bytes (the precomputed banks of Sec. 2.2-2.3).

    Entries are kept while the budget allows and never evicted; once it is full, new matrices are built and
    returned but not kept. Training revisits the same block positions every sample, and those come first, so
    they stay; a long stream never revisits a position, so it holds at most the budget (no least-recently-used
    churn, which a cyclic training pass longer than the budget would turn into a miss on every segment).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: dict[tuple, torch.Tensor] = {}
        self._used = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._used

    def get(self, key: tuple) -> torch.Tensor | None:
        return self._entries.get(key)

    def put(self, key: tuple, value: torch.Tensor) -> torch.Tensor:
        size = value.numel() * value.element_size()
        if self._used + size <= self.max_bytes and key not in self._entries:
            self._entries[key] = value
            self._used += size
        return value


# ---- the operator -------------------------------------------------------------------------------------------


class HiPPOLegS:
    """HiPPO-LegS of order `N` with one of the discretisations `"zoh"` (the paper's), `"bilinear"`, `"forward"`,
    `"backward"`.

    Signals run along the last axis: `compress(f)` maps `[..., T]` to `[..., N]`, `reconstruct(c, T)` maps
    `[..., N]` back to `[..., T]` (sampled at token midpoints `p + 1/2`), `update(c, f, start)` folds a block into
    a state in one matmul. Block matrices are built in float64, stored in `dtype`, and kept in a cache of at most
    `cache_bytes` (the paper's "precomputed bank", Sec. 2.2, without a fixed maximum length).
    """

    def __init__(
        self, N: int, discretization: str = "zoh", dtype: torch.dtype = torch.float32, cache_bytes: int = 64 << 20
    ):
        if isinstance(N, bool) or not isinstance(N, int) or N < 1:
            raise ValueError(f"`N` (the HiPPO order) must be an integer >= 1, got {N!r}.")
        if discretization not in DISCRETIZATIONS:
            raise ValueError(f"`discretization` must be one of {list(DISCRETIZATIONS)}, got {discretization!r}.")
        self.N = N
        self.discretization = discretization
        self.dtype = dtype
        self.cache = TensorCache(cache_bytes)
        self._AB: tuple[torch.Tensor, torch.Tensor] | None = None

    def __repr__(self) -> str:
        return f"HiPPOLegS(N={self.N}, discretization={self.discretization!r})"

    @property
    def A(self) -> torch.Tensor:
        """LegS `A` `[N, N]`, float64."""
        return self._legs()[0]

    @property
    def B(self) -> torch.Tensor:
        """LegS `B` `[N]`, float64."""
        return self._legs()[1]

    def _legs(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._AB is None:
            self._AB = legs_matrices(self.N)  # built on first use: 600 MB at N = 8640, which ZOH never needs
        return self._AB

    # ---- block matrices ---------------------------------------------------------------------------------------

    def transition(self, start: int, end: int, device: torch.device | str | None = None) -> torch.Tensor:
        """`P` `[N, N]`: the state after `end` tokens is `P @ state(start) + kernel(start, end) @ f[start:end]`."""
        return self._cached("P", start, end, device)

    def kernel(self, start: int, end: int, device: torch.device | str | None = None) -> torch.Tensor:
        """`K` `[N, end-start]`: how tokens `start..end-1` enter the state after `end` tokens (Eq. 6, 27)."""
        return self._cached("K", start, end, device)

    def basis(self, x: torch.Tensor, t: float, device: torch.device | str | None = None) -> torch.Tensor:
        """Reconstruction matrix `[M, N]` at points `x` (`0 <= x <= t`) of a state that holds `t` tokens (Eq. 30)."""
        return legs_basis(self.N, torch.as_tensor(x), t, self.dtype).to(device)

    def _cached(self, kind: str, start: int, end: int, device) -> torch.Tensor:
        _check_span(start, end)
        device = str(torch.device("cpu") if device is None else torch.device(device))
        hit = self.cache.get((kind, start, end, device))
        if hit is not None:
            return hit
        built = {name: value.to(device) for name, value in self._build(kind, start, end).items()}
        for name, value in built.items():
            self.cache.put((name, start, end, device), value)
        return built[kind]

    def _build(self, kind: str, start: int, end: int) -> dict[str, torch.Tensor]:
        """The requested block matrix (ZOH: closed form) or both (GBT: they come out of one accumulation)."""
        if self.discretization == "zoh":
            if kind == "P":
                return {"P": legs_transition(self.N, start, end, self.dtype)}
            return {"K": legs_kernel(self.N, start, end, end, self.dtype)}
        P, K = self._gbt_block(start, end)
        return {"P": P.to(self.dtype), "K": K.to(self.dtype)}

    def _gbt_step_matrices(self, k: int) -> tuple[np.ndarray, np.ndarray, float]:
        """`(I + aA/t, I - (1-a)A/t, 1/t)` at token `k` (`t = k + 1`) of the generalised bilinear transform.

        numpy float64: the GBT paths run thousands of tiny matrix operations, where a threaded torch call costs
        more than the work.
        """
        a = _GBT[self.discretization]
        A = self.A.numpy()
        eye = np.eye(self.N)
        t = k + 1
        return eye + (a / t) * A, eye - ((1 - a) / t) * A, 1.0 / t

    def _gbt_block(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block `(P, K)` of a GBT discretisation by backward accumulation of the per-token matrices (Eq. 26-27)."""
        B = self.B.numpy()
        acc = np.eye(self.N)  # product of the token transitions after the current token
        K = np.empty((self.N, end - start))
        for k in range(end - 1, start - 1, -1):
            implicit, explicit, dt = self._gbt_step_matrices(k)
            solved = np.linalg.solve(implicit.T, acc.T).T  # acc @ (I + aA/t)^-1
            K[:, k - start] = dt * (solved @ B)
            acc = solved @ explicit
        return torch.from_numpy(acc), torch.from_numpy(K)

    # ---- signals ----------------------------------------------------------------------------------------------

    def update(self, c: torch.Tensor, f: torch.Tensor, start: int) -> torch.Tensor:
        """The state after `start + L` tokens from the state `c` `[..., N]` after `start` tokens and the block
        `f` `[..., L]` (Eq. 6): one batched matmul per term, no per-token loop."""
        self._check_state(c)
        end = start + f.shape[-1]
        P = self.transition(start, end, f.device).to(f.dtype)
        K = self.kernel(start, end, f.device).to(f.dtype)
        return c @ P.T + f @ K.T

    def step(self, c: torch.Tensor, f_k: torch.Tensor, k: int) -> torch.Tensor:
        """Token recurrence `c_k = A_k c_{k-1} + B_k f_k` (Eq. 4) for token `k`, `c` `[..., N]`, `f_k` `[...]`.

        The reference the block update is tested against; ZOH uses its closed-form `A_k = (k/(k+1))^A` and
        `B_k = A^-1 (I - A_k) B` (Eq. 22, 25), the others `c_k = (I + aA/t)^-1 [(I - (1-a)A/t) c + B f_k / t]`
        (computed in numpy float64, without autograd).
        """
        self._check_state(c)
        if self.discretization == "zoh":
            return self.update(c, f_k[..., None], k)
        implicit, explicit, dt = self._gbt_step_matrices(k)
        state = c.detach().to(_F64).reshape(-1, self.N).numpy()
        rhs = state @ explicit.T + dt * f_k.detach().to(_F64).reshape(-1, 1).numpy() * self.B.numpy()
        out = np.linalg.solve(implicit, rhs.T).T
        return torch.from_numpy(out).reshape(c.shape).to(c)

    def compress(self, f: torch.Tensor) -> torch.Tensor:
        """The state `[..., N]` after reading the signal `f` `[..., T]` from an empty memory."""
        if f.dim() < 1 or f.shape[-1] < 1:
            raise ValueError(f"`f` must be a signal [..., T] with T >= 1, got shape {tuple(f.shape)}.")
        return f @ self.kernel(0, f.shape[-1], f.device).to(f.dtype).T

    def reconstruct(self, c: torch.Tensor, T: int) -> torch.Tensor:
        """The degree-<N approximation of the `T`-token history in `c` `[..., N]`, at token midpoints `[..., T]`."""
        self._check_state(c)
        if isinstance(T, bool) or not isinstance(T, int) or T < 1:
            raise ValueError(f"`T` (tokens folded into the state) must be an integer >= 1, got {T!r}.")
        x = torch.arange(T, dtype=_F64) + 0.5
        return c @ self.basis(x, T, c.device).to(c.dtype).T

    def _check_state(self, c: torch.Tensor) -> None:
        if c.dim() < 1 or c.shape[-1] != self.N:
            raise ValueError(f"A HiPPO state must have last dimension N={self.N}, got shape {tuple(c.shape)}.")


def _check_span(start: int, end: int) -> None:
    if not (isinstance(start, int) and isinstance(end, int)) or start < 0 or end <= start:
        raise ValueError(f"A block needs integer token bounds 0 <= start < end, got start={start!r}, end={end!r}.")
