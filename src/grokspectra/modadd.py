"""Tian's two-layer modular-addition network, trained as a batch of runs.

The setting (Tian's code as ported by Xu): all M² ordered pairs (a, b) ↦ (a + b) mod M in a-major
order, a seeded train/test split, input x = [e_a; e_b] ∈ ℝ^{2M} (concatenated one-hots), hidden layer
F = σ(XWᵀ) with W ∈ ℝ^{K×2M} (torch ``Linear`` layout), output Ŷ = F Vᵀ with V ∈ ℝ^{M×K}, no biases, PyTorch's
default ``nn.Linear`` init, Tian's class-centred MSE on targets e_y − 𝟙/M and full-batch Adam (lr 1e-3, default
betas) with *coupled* weight decay η (``torch.optim.Adam(weight_decay=η)``).

How it is computed. R runs (seeds × η, one activation per chunk) live in tensors with a leading run dimension.
Because x is two one-hots, the pre-activation of pair (a, b) is W_{:,a} + W_{:,M+b}: the forward pass builds the
M×M×K grid of pre-activations by broadcast adds, applies σ in place and multiplies by Vᵀ (:func:`logits_all`:
on CPU a few values of a at a time, so that each block is multiplied while it is in cache; on GPU the whole grid
in one batched GEMM). The training pre-activations are gathered from the columns of W directly; the backward
pass touches only these n rows, and the pre-activation gradient is summed back onto the 2M columns of W by
:func:`column_sums` (a sparse product on CPU, a batched GEMM with Xᵀ on GPU: ``index_add_``/``scatter_add_``
were 3–10× slower on CPU, and non-deterministic on GPU). All large buffers are allocated once per chunk.
Gradients and the Adam update are written by hand (tested against ``torch.optim.Adam`` + autograd).

Logging follows Tian: the row for epoch t describes the state after t optimiser steps, evaluated *before* step
t + 1. Everything is accumulated in device tensors and moved to the CPU once at the end (no host sync per epoch).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Sequence

import torch

from . import progress
from .device import DivergenceError

ACTIVATIONS = ("x2", "relu", "gelu", "silu")
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


# --- data ------------------------------------------------------------------------------------------------------
def make_data(M: int, n_train: int, seed: int) -> dict[str, torch.Tensor]:
    """All M² pairs (a, b) → (a + b) mod M, split into n_train training pairs and the rest for testing.

    Pairs are listed a-major (pair index p = a·M + b). The split is Xu's:
    ``torch.randperm(M², generator=torch.Generator().manual_seed(seed))``, the first ``n_train`` indices train.
    This generator is separate from the one that initialises the weights, as in Xu's script.

    Returns
    -------
    dict of CPU LongTensors ``a_tr, b_tr, y_tr`` (length n_train) and ``a_te, b_te, y_te`` (M² − n_train).
    """
    if M < 2:
        raise ValueError(f"modulus M must be >= 2, got {M}")
    if not 1 <= n_train < M * M:
        raise ValueError(f"n_train must be in [1, M² - 1] = [1, {M * M - 1}], got {n_train}")
    a = torch.arange(M).repeat_interleave(M)
    b = torch.arange(M).repeat(M)
    y = (a + b) % M
    perm = torch.randperm(M * M, generator=torch.Generator().manual_seed(int(seed)))
    tr, te = perm[:n_train], perm[n_train:]
    return {"a_tr": a[tr], "b_tr": b[tr], "y_tr": y[tr], "a_te": a[te], "b_te": b[te], "y_te": y[te]}


def init_weights(M: int, K: int, seed: int, *, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's default ``nn.Linear`` init for W (K×2M) then V (M×K), bias-free, from one CPU generator.

    ``kaiming_uniform_(a=√5)`` is U(±1/√fan_in) (W ~ U(±1/√(2M)), V ~ U(±1/√K)). Drawing W first and V
    second from ``torch.Generator().manual_seed(seed)`` reproduces, bit for bit, ``torch.manual_seed(seed)``
    followed by ``nn.Linear(2M, K, bias=False)`` and ``nn.Linear(K, M, bias=False)`` (Xu's order). The draws
    are float32 (torch's default dtype) and then cast, so a float64 run starts from the same point.
    """
    g = torch.Generator().manual_seed(int(seed))
    bw, bv = 1.0 / math.sqrt(2 * M), 1.0 / math.sqrt(K)
    W = torch.empty(K, 2 * M).uniform_(-bw, bw, generator=g)
    V = torch.empty(M, K).uniform_(-bv, bv, generator=g)
    return W.to(dtype), V.to(dtype)


# --- activations -----------------------------------------------------------------------------------------------
def act_fn(name: str, z: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
    """σ(z) for σ ∈ {x², ReLU, GELU (exact, erf), SiLU}; ``inplace`` overwrites z where the op allows it."""
    if name == "x2":
        return z.square_() if inplace else z.square()
    if name == "relu":
        return z.relu_() if inplace else z.relu()
    if name == "gelu":
        return torch.nn.functional.gelu(z)
    if name == "silu":
        return torch.nn.functional.silu(z, inplace=inplace)
    raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")


def act_grad(name: str, z: torch.Tensor) -> torch.Tensor:
    """σ'(z): 2z, 1[z > 0], Φ(z) + zφ(z), s(z)(1 + z(1 − s(z))) with s the logistic function."""
    if name == "x2":
        return 2 * z
    if name == "relu":
        return (z > 0).to(z.dtype)
    if name == "gelu":
        cdf = 0.5 * (1 + torch.erf(z * (1 / math.sqrt(2))))
        return cdf + z * torch.exp(-0.5 * z * z) * (1 / math.sqrt(2 * math.pi))
    if name == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")


def hidden(W: torch.Tensor, a: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    """Hidden activations F = σ(XWᵀ) ``[..., n, K]`` of pairs (a, b) for first-layer weights W ``[..., K, 2M]``:
    row i is σ(W_{:,a_i} + W_{:,M+b_i}) (two column gathers, no one-hot product)."""
    M = W.shape[-1] // 2
    Wt = W.transpose(-1, -2)
    return act_fn(act, Wt[..., a.to(W.device), :] + Wt[..., M + b.to(W.device), :], inplace=True)


def mul_act_grad_(name: str, dH: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """dH ← dH ∘ σ'(z) in place (x² and ReLU without temporaries of the size of z)."""
    if name == "x2":
        return dH.mul_(z).mul_(2)
    if name == "relu":
        return dH.masked_fill_(z <= 0, 0)
    return dH.mul_(act_grad(name, z))


GRID_ROWS_CPU = 4  # values of a per block of the pre-activation grid on CPU: 4·M·K floats stay in cache


def act_(name: str, z: torch.Tensor) -> torch.Tensor:
    """z ← σ(z) in place, for every activation (GELU through a temporary)."""
    return z.copy_(act_fn(name, z)) if name == "gelu" else act_fn(name, z, inplace=True)


def logits_all(Wt: torch.Tensor, V: torch.Tensor, act: str, O: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """Network outputs Ŷ = σ(XWᵀ)Vᵀ of all M² pairs, written into O ``[R, M², M]`` (pair index a·M + b).

    Row (a, b) of the hidden layer is σ(W_{:,a} + W_{:,M+b}) (``Wt`` is W transposed, ``[R, 2M, K]``). With
    ``buf`` of shape ``[R, M, M, K]`` the whole grid is built by one broadcast add and multiplied by Vᵀ in one
    batched product (the GPU path). With ``buf`` of shape ``[A, M, K]`` the grid is built A values of a at a
    time, one run at a time, and each block multiplied by Vᵀ at once while it is still in cache: on 2 CPU cores
    this is 2× faster than the batched product over the whole grid (which is written to and read from memory).
    """
    R, M = Wt.shape[0], Wt.shape[1] // 2
    K = Wt.shape[2]
    if buf.dim() == 4:
        torch.add(Wt[:, :M, None, :], Wt[:, None, M:, :], out=buf)
        act_(act, buf)
        return torch.bmm(buf.view(R, M * M, K), V.transpose(1, 2), out=O)
    A = buf.shape[0]
    Ov = O.view(R, M, M, M)
    for r in range(R):
        Vt = V[r].t()
        for a0 in range(0, M, A):
            a1 = min(M, a0 + A)
            blk = buf[:a1 - a0]
            torch.add(Wt[r, a0:a1, None, :], Wt[r, None, M:, :], out=blk)
            act_(act, blk)
            torch.mm(blk.view(-1, K), Vt, out=Ov[r, a0:a1].view(-1, M))
    return O


def column_sums(a: torch.Tensor, b: torch.Tensor, M: int, dtype: torch.dtype, sparse: bool | None = None):
    """A function dZ ``[R, n, K]`` ↦ XᵀdZ ``[R, 2M, K]``: row i of dZ is added to rows a_i and M + b_i.

    Xᵀ is the transposed input matrix of the one-hot pairs (a_i, b_i). On CPU it is applied as one block-diagonal
    sparse matrix (2 nonzeros per column: 2.6× faster than the dense batched product with Xᵀ, and it gives the
    same bits for any thread count); elsewhere as a dense batched product (deterministic on GPU, unlike
    ``index_add_``). ``sparse`` overrides that choice.
    """
    R, n = a.shape
    dev = a.device
    if sparse if sparse is not None else dev.type == "cpu":
        rows = (torch.cat([a, b + M], 1) + torch.arange(R, device=dev)[:, None] * (2 * M)).reshape(-1)
        cols = (torch.arange(n, device=dev).repeat(1, 2) + torch.arange(R, device=dev)[:, None] * n).reshape(-1)
        S = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(2 * R * n, dtype=dtype, device=dev),
                                    (R * 2 * M, R * n), check_invariants=True).coalesce()
        return lambda dZ: torch.sparse.mm(S, dZ.reshape(R * n, -1)).view(R, 2 * M, -1)
    XT = torch.cat([torch.nn.functional.one_hot(a, M), torch.nn.functional.one_hot(b, M)], -1).to(dtype)
    XT = XT.transpose(1, 2).contiguous()
    return lambda dZ: torch.bmm(XT, dZ)


# --- loss ------------------------------------------------------------------------------------------------------
def tian_loss(out: torch.Tensor, y: torch.Tensor, M: int) -> torch.Tensor:
    """Tian's MSE: mean over samples of ‖o_c‖² − 2(o_c)_y + (1 − 1/M), o_c = o − mean over classes.

    Equal to mean_i ‖o_c,i − (e_{y_i} − 𝟙/M)‖². ``out`` is ``[..., n, M]``; returns ``[...]``.
    """
    oc = out - out.mean(-1, keepdim=True)
    cross = oc.gather(-1, y.expand(*oc.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return (oc.square().sum(-1) - 2 * cross + (1 - 1 / M)).mean(-1)


# --- Gram diagnostics ------------------------------------------------------------------------------------------
def gram_upper(F: torch.Tensor) -> torch.Tensor:
    """The upper triangle (diagonal included) of G = FᵀF for one run's F ``[n, K]``; the strict lower triangle is 0.

    On CPU this is one BLAS ``?syrk`` call (SciPy's, limited to torch's thread count with threadpoolctl): a
    symmetric rank-n update computes half of the product, 2.1× faster than ``torch.mm`` for the whole of it.
    Elsewhere the full product is formed and its lower triangle cleared.
    """
    if F.device.type != "cpu" or F.dtype not in (torch.float32, torch.float64):
        return torch.triu(F.t() @ F)
    from scipy.linalg import blas
    syrk = blas.ssyrk if F.dtype == torch.float32 else blas.dsyrk
    A = F.detach().contiguous().numpy().T  # [K, n], Fortran-ordered: no copy
    with _blas_threads(torch.get_num_threads()):
        C = syrk(1.0, A, trans=0, lower=0)  # A·Aᵀ = FᵀF, upper triangle (SciPy returns 0 below it)
    return torch.from_numpy(C)


@functools.cache
def _blas_controller():
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


def _blas_threads(n: int):
    """A context in which the BLAS libraries that SciPy and NumPy loaded use ``n`` threads (threadpoolctl; the
    controller is made once, with no module state that would change the code version)."""
    return _blas_controller().limit(limits=n, user_api="blas")


def gram_stats(F: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gram diagnostics of the training activations F ``[R, n, K]``, from the centred Gram G̃ = F̃ᵀF̃.

    * ``ftf_ratio`` = mean|offdiag(F̃ᵀF̃)| / mean|diag(F̃ᵀF̃)|, F̃ = P₁^⊥F (F centred over samples).
    * ``rho_code`` (Xu's ``fft_dist_from_ideal`` = Tian's ``fit_diag_11`` on the raw kernel A = FFᵀ):
      ‖A − (d̄ − ō)I − ō𝟙𝟙ᵀ‖_F / ‖A‖_F with d̄, ō the mean diagonal and off-diagonal entries of A.
    * ``rho_paper`` (Xu's eq. rho-tian): the same fit applied to P₁^⊥A, divided by ‖A‖_F.

    G̃ is formed from F̃ itself, never as FᵀF − s sᵀ/n (s = Fᵀ𝟙): with σ = x² the mean dominates F, and that
    difference loses most of float32's digits (at initialisation the ratio came out 0.0096 instead of 0.0257).
    Only its upper triangle U is computed (:func:`gram_upper`, one run at a time): ‖G̃‖² = 2‖U‖² − ‖diag U‖² and
    Σ|G̃| = 2Σ|U| − Σ|diag U|. The n×n kernel is never formed either, and every norm of it is a sum of positive
    terms: with FᵀF = G̃ + s sᵀ/n and 𝟙ᵀF̃ = 0, ‖A‖² = ‖FᵀF‖² = ‖G̃‖² + 2‖F̃s‖²/n + ‖s‖⁴/n²,
    ‖P₁^⊥A‖² = ‖A‖² − ‖Fs‖²/n = ‖G̃‖² + ‖F̃s‖²/n, tr A = ‖F‖², 𝟙ᵀA𝟙 = ‖s‖², tr P₁^⊥A = tr A − ‖s‖²/n and
    𝟙ᵀP₁^⊥A𝟙 = 0. With ⟨I, 𝟙𝟙ᵀ⟩ = n and ‖𝟙𝟙ᵀ‖² = n² the squared residual of a fit cI + o𝟙𝟙ᵀ to a matrix X is
    ‖X‖² − 2c trX − 2o 𝟙ᵀX𝟙 + c²n + 2co n + o²n². Scalars are accumulated in float64.
    """
    R, n, K = F.shape
    s = F.sum(-2)  # [R, K]
    S = s.double().square().sum(-1)
    trA = torch.linalg.vector_norm(F.reshape(R, -1), dim=-1).double().square()
    G2, Fts2 = torch.zeros(R, dtype=torch.float64, device=F.device), torch.zeros(R, dtype=torch.float64, device=F.device)
    abs_all, abs_diag = torch.zeros_like(G2), torch.zeros_like(G2)
    Ft = torch.empty_like(F[0])
    for r in range(R):
        torch.sub(F[r], s[r] / n, out=Ft)  # F̃ = P₁^⊥F
        Fts2[r] = torch.linalg.vector_norm(torch.mv(Ft, s[r])).double().square()
        U = gram_upper(Ft)
        dg = torch.diagonal(U)
        diag_abs = dg.abs().sum().double()
        G2[r] = 2 * torch.linalg.vector_norm(U).double().square() - torch.linalg.vector_norm(dg).double().square()
        abs_all[r] = 2 * torch.linalg.vector_norm(U, ord=1).double() - diag_abs
        abs_diag[r] = diag_abs
    ftf = (abs_all - abs_diag) / (K * (K - 1)) / (abs_diag / K)

    def fit_resid(X2, trX, sumX):
        d = trX / n
        o = (sumX - trX) / (n * (n - 1))
        c = d - o
        r2 = X2 - 2 * c * trX - 2 * o * sumX + c * c * n + 2 * c * o * n + o * o * n * n
        return r2.clamp(min=0).sqrt()

    A2 = G2 + 2 * Fts2 / n + S * S / (n * n)
    normA = A2.sqrt()
    rho_code = fit_resid(A2, trA, S) / normA
    rho_paper = fit_resid(G2 + Fts2 / n, trA - S / n, torch.zeros_like(S)) / normA
    return {"ftf_ratio": ftf, "rho_code": rho_code, "rho_paper": rho_paper}


def gram_schedule(epochs: int, gram_every: int, gram_dense: int) -> list[int]:
    """Epochs at which the Gram diagnostics are computed: every epoch 0…gram_dense, then every ``gram_every``
    epochs, and always the last epoch."""
    if gram_every < 1 or gram_dense < 0:
        raise ValueError(f"need gram_every >= 1 and gram_dense >= 0, got {gram_every}, {gram_dense}")
    ep = set(range(0, min(gram_dense, epochs) + 1)) | set(range(0, epochs + 1, gram_every)) | {epochs}
    return sorted(ep)


# --- training --------------------------------------------------------------------------------------------------
def _per_run(x, R: int, name: str) -> list:
    if isinstance(x, (str, int, float)):
        return [x] * R
    x = list(x)
    if len(x) != R:
        raise ValueError(f"{name} has {len(x)} entries but there are {R} runs (len(seeds))")
    return x


def auto_chunk(M: int, K: int, n: int, band: int, device: torch.device, budget_bytes: float | None = None) -> int:
    """Runs per batched chunk so that the working set stays under a memory budget (1 GiB on CPU, 24 GiB on GPU).

    Per run (float32): the M²·K activation grid (on GPU; on CPU it is built in blocks), ≈5 n·K training buffers, a K²/4 Gram tile, ≈8·3MK parameter,
    gradient and Adam tensors and the band's B·3MK ring of past updates.
    """
    if budget_bytes is None:
        budget_bytes = 24 * 2**30 if device.type == "cuda" else 2**30
    grid = M * M * K if device.type == "cuda" else 0
    per_run = 4 * (grid + M * M * M + 5 * n * K + K * K // 4 + 8 * 3 * M * K + band * 3 * M * K)
    return max(1, int(budget_bytes // per_run))


def train(M: int, K: int, n_train: int, act, etas: Sequence[float], seeds: Sequence[int], epochs: int, *,
          lr: float = 1e-3, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
          gram_every: int = 5, gram_dense: int = 60, band: int = 0, keep_F_epochs: Sequence[int] = (),
          progress: bool = True, chunk: int | None = None) -> dict[str, torch.Tensor]:
    """Train R = len(seeds) runs of Tian's network with full-batch Adam + coupled weight decay.

    Run r uses seed ``seeds[r]`` (split of :func:`make_data` and init of :func:`init_weights`), weight decay
    ``etas[r]`` and activation ``act`` (one name, or a list with one per run). Runs are trained in chunks of at
    most ``chunk`` runs (default :func:`auto_chunk`; runs of one chunk share an activation), each chunk one
    batched computation with a leading run dimension.

    Parameters
    ----------
    gram_every, gram_dense : int
        Gram diagnostics at :func:`gram_schedule` epochs (every epoch up to ``gram_dense``, then every
        ``gram_every``, and the last).
    band : int
        When B > 0, also return ``dW_band`` ``[R, epochs+1, B]`` with ``dW_band[r, t, k] = <ΔW_t, ΔW_{t-k}>``
        (ΔW_t = W after step t − W before it, flattened; NaN where t − k < 1, so row 0 is NaN) and ``dV_band``.
    keep_F_epochs : sequence of int
        Epochs whose first-layer weights are returned as ``W_at`` ``[len, R, K, 2M]`` (and ``V_at``
        ``[len, R, M, K]``), in the given order, so Theorem-6 analysis needs no replay.

    Returns
    -------
    dict of CPU tensors. ``[R, epochs+1]``: ``train_acc, test_acc, train_loss, test_loss`` (state after t steps,
    before step t+1), ``update_cos`` = 1 − cos(ΔW_t, ΔW_{t−1}) and ``update_cos_V`` (NaN for t < 2),
    ``gf_norm_all`` = ‖G_F‖_F with G_F = P₁^⊥(Y − FVᵀ)V (Xu's sample-centred version).
    ``[R, len(gram_epochs)]``: ``gf_norm, ftf_ratio, rho_code, rho_paper`` (:func:`gram_stats`).
    Also ``gram_epochs`` (LongTensor), ``etas``, ``seeds``, ``wall_s``.
    """
    device = torch.device(device)
    R = len(seeds)
    if R == 0:
        raise ValueError("need at least one run (seeds is empty)")
    etas = [float(e) for e in _per_run(etas, R, "etas")]
    acts = _per_run(act, R, "act")
    for a_ in acts:
        if a_ not in ACTIVATIONS:
            raise ValueError(f"unknown activation {a_!r}; expected one of {ACTIVATIONS}")
    if min(etas) < 0:
        raise ValueError(f"weight decays must be >= 0, got {etas}")
    if epochs < 1 or K < 1 or band < 0:
        raise ValueError(f"need epochs >= 1, K >= 1, band >= 0; got {epochs}, {K}, {band}")
    keep = [int(e) for e in keep_F_epochs]
    if any(not 0 <= e <= epochs for e in keep):
        raise ValueError(f"keep_F_epochs must lie in [0, {epochs}], got {keep}")
    if chunk is None:
        chunk = auto_chunk(M, K, n_train, band, device)
    # group runs by activation, then cut into chunks; results are put back in the caller's order
    groups: list[list[int]] = []
    for name in dict.fromkeys(acts):
        idx = [r for r in range(R) if acts[r] == name]
        groups += [idx[i:i + chunk] for i in range(0, len(idx), chunk)]
    t0 = time.perf_counter()
    parts = [(idx, _train_chunk(M, K, n_train, acts[idx[0]], [etas[r] for r in idx], [int(seeds[r]) for r in idx],
                                epochs, lr=lr, device=device, dtype=dtype, gram_every=gram_every,
                                gram_dense=gram_dense, band=band, keep=keep, show=progress))
             for idx in groups]
    out: dict[str, torch.Tensor] = {}
    order = torch.tensor([r for idx, _ in parts for r in idx]).argsort()
    for key in parts[0][1]:
        if key == "gram_epochs":
            out[key] = parts[0][1][key]
            continue
        dim = 1 if key in ("W_at", "V_at") else 0
        out[key] = torch.cat([p[key] for _, p in parts], dim=dim).index_select(dim, order)
    out["etas"] = torch.tensor(etas, dtype=torch.float64)
    out["seeds"] = torch.tensor([int(s) for s in seeds])
    out["wall_s"] = torch.tensor(time.perf_counter() - t0)
    return out


FINITE_EVERY = 50  # epochs between divergence checks (each is one host sync)


def _check_losses(loss: torch.Tensor, t: int, act, etas, seeds) -> None:
    """Raise :class:`~grokspectra.device.DivergenceError` naming the first epoch ≤ ``t`` whose training loss is
    not finite, and the run (seed, η) it happened in."""
    seen = loss[:, :t + 1]
    bad = ~torch.isfinite(seen)
    if bool(bad.any()):
        r, e = (int(i) for i in bad.nonzero()[0])
        first = int(bad.any(0).nonzero()[0])
        raise DivergenceError(f"modadd {act} training diverged at epoch {first} (first in run {r}: seed {seeds[r]}, "
                              f"eta {etas[r]:g}, epoch {e})")


def _train_chunk(M, K, n, act, etas, seeds, epochs, *, lr, device, dtype, gram_every, gram_dense, band, keep,
                 show) -> dict[str, torch.Tensor]:
    R, M2, P = len(seeds), M * M, 2 * M * K
    kw = {"device": device, "dtype": dtype}
    data = [make_data(M, n, s) for s in seeds]
    a_tr = torch.stack([d["a_tr"] for d in data]).to(device)  # [R, n]
    b_tr = torch.stack([d["b_tr"] for d in data]).to(device)
    y_tr = torch.stack([d["y_tr"] for d in data]).to(device)
    p_tr = a_tr * M + b_tr  # pair index into the grid
    # flat row indices of the training pairs in the [R·M², ·] view of the outputs (for index_select)
    fp_tr = (p_tr + torch.arange(R, device=device)[:, None] * M2).reshape(-1)
    # flat rows of W_{:,a} and W_{:,M+b} in the [R·2M, K] view of Wt
    off = torch.arange(R, device=device)[:, None] * (2 * M)
    fa_tr, fb_tr = (a_tr + off).reshape(-1), (b_tr + M + off).reshape(-1)
    y_all = ((torch.arange(M, device=device)[:, None] + torch.arange(M, device=device)[None, :]) % M).reshape(-1)
    is_tr = torch.zeros(R, M2, **kw).scatter_(1, p_tr, 1.0)
    w_tr, w_te = is_tr / n, (1 - is_tr) / (M2 - n)
    Yzm = torch.nn.functional.one_hot(y_tr, M).to(dtype) - 1.0 / M  # [R, n, M]
    XT_times = column_sums(a_tr, b_tr, M, dtype)  # dZ ↦ XᵀdZ: the pre-activation gradient summed per column of W
    init = [init_weights(M, K, s, dtype=dtype) for s in seeds]
    # W stored transposed, Wt[r, i, k] = W[r, k, i]: column i of W is a contiguous row (gather-friendly)
    Wt = torch.stack([w.t() for w, _ in init]).contiguous().to(device)  # [R, 2M, K]
    V = torch.stack([v for _, v in init]).to(device)  # [R, M, K]
    eta = torch.tensor(etas, **kw).view(R, 1, 1)
    mW, vW, mV, vV = (torch.zeros_like(Wt), torch.zeros_like(Wt), torch.zeros_like(V), torch.zeros_like(V))
    b1, b2 = ADAM_BETAS

    gram_ep = gram_schedule(epochs, gram_every, gram_dense)
    gslot = {e: i for i, e in enumerate(gram_ep)}
    T = epochs + 1
    nan = float("nan")
    log = {k: torch.full((R, T), nan, device=device, dtype=torch.float64)
           for k in ("train_acc", "test_acc", "train_loss", "test_loss", "update_cos", "update_cos_V", "gf_norm_all")}
    glog = {k: torch.full((R, len(gram_ep)), nan, device=device, dtype=torch.float64)
            for k in ("gf_norm", "ftf_ratio", "rho_code", "rho_paper")}
    if band:
        dW_band = torch.full((R, T, band), nan, device=device, dtype=torch.float64)
        dV_band = torch.full((R, T, band), nan, device=device, dtype=torch.float64)
        ringW = torch.zeros(R, band, P, **kw)
        ringV = torch.zeros(R, band, M * K, **kw)
        lags = torch.arange(band, device=device)
    keep_slot = {}
    for i, e in enumerate(keep):
        keep_slot.setdefault(e, []).append(i)
    W_at = torch.empty(len(keep), R, K, 2 * M, **kw)
    V_at = torch.empty(len(keep), R, M, K, **kw)

    # pre-activations, then activations, of the M² pairs: all at once on GPU, blocks of a on CPU (logits_all)
    grid = torch.empty(R, M, M, K, **kw) if device.type != "cpu" else torch.empty(min(M, GRID_ROWS_CPU), M, K, **kw)
    O = torch.empty(R, M2, M, **kw)
    Z_tr = torch.empty(R, n, K, **kw)  # training pre-activations (rows of the grid)
    F_tr = torch.empty(R, n, K, **kw)  # training activations F
    dZ = torch.empty(R, n, K, **kw)
    gW = torch.empty_like(Wt)
    gV = torch.empty_like(V)
    bufW, bufV = torch.empty(2, *Wt.shape, **kw), torch.empty(2, *V.shape, **kw)
    prevW = prevV = None

    for t in progress.bar(range(T), desc=f"modadd {act} x{R}") if show else range(T):
        # ---- forward on all M² pairs (state after t steps) ----
        Wf = Wt.view(R * 2 * M, K)
        torch.index_select(Wf, 0, fa_tr, out=Z_tr.view(R * n, K))  # Z = W_{:,a} + W_{:,M+b}, dZ as scratch
        Z_tr.add_(torch.index_select(Wf, 0, fb_tr, out=dZ.view(R * n, K)).view(R, n, K))
        if act == "x2":
            torch.mul(Z_tr, Z_tr, out=F_tr)
        else:
            act_(act, F_tr.copy_(Z_tr))
        logits_all(Wt, V, act, O, grid)
        oc = O - O.mean(-1, keepdim=True)
        per_pair = oc.square().sum(-1) - 2 * oc.gather(-1, y_all.view(1, M2, 1).expand(R, M2, 1)).squeeze(-1) + (1 - 1 / M)
        correct = (O.argmax(-1) == y_all).to(dtype)
        log["train_loss"][:, t] = (per_pair * w_tr).sum(-1)
        log["test_loss"][:, t] = (per_pair * w_te).sum(-1)
        log["train_acc"][:, t] = (correct * w_tr).sum(-1)
        log["test_acc"][:, t] = (correct * w_te).sum(-1)
        O_tr = O.view(R * M2, M).index_select(0, fp_tr).view(R, n, M)
        # G_F = P₁^⊥(Y − Ŷ) V : ‖G_F‖² = tr(RᵀR · V Vᵀ), never forming the n×K matrix
        res = Yzm - O_tr
        res = res - res.mean(1, keepdim=True)
        gf = ((res.transpose(1, 2) @ res) * (V @ V.transpose(1, 2))).sum((-2, -1)).clamp(min=0).sqrt()
        log["gf_norm_all"][:, t] = gf
        if t in keep_slot:
            for i in keep_slot[t]:
                W_at[i] = Wt.transpose(1, 2)
                V_at[i] = V
        if t in gslot:
            j = gslot[t]
            st = gram_stats(F_tr)
            glog["gf_norm"][:, j] = gf
            for k_, v_ in st.items():
                glog[k_][:, j] = v_
        if t % FINITE_EVERY == 0 or t == epochs:
            _check_losses(log["train_loss"], t, act, etas, seeds)
        if t == epochs:
            break
        # ---- backward on the n training pairs: dL/dO = 2(o_c − (e_y − 𝟙/M)) / n ----
        dO = (2.0 / n) * (O_tr - O_tr.mean(-1, keepdim=True) - Yzm)
        torch.bmm(dO.transpose(1, 2), F_tr, out=gV)  # [R, M, K]
        if act == "x2":  # σ'(z) = 2z: the factor 2 goes on the small dO, one pass over dZ
            torch.bmm(2 * dO, V, out=dZ).mul_(Z_tr)
        else:
            mul_act_grad_(act, torch.bmm(dO, V, out=dZ), Z_tr)  # [R, n, K]
        gW.copy_(XT_times(dZ))  # [R, 2M, K]: column sums of dZ per operand value
        # ---- Adam with coupled weight decay (torch.optim.Adam, weight_decay=η), step number t+1 ----
        step = t + 1
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        oldW, oldV = bufW[step % 2], bufV[step % 2]  # alternate: the other slot holds the previous update
        oldW.copy_(Wt)
        oldV.copy_(V)
        for p_, g_, m_, v_ in ((Wt, gW, mW, vW), (V, gV, mV, vV)):
            g_.addcmul_(p_, eta)
            m_.lerp_(g_, 1 - b1)
            v_.mul_(b2).addcmul_(g_, g_, value=1 - b2)
            denom = v_.sqrt().div_(math.sqrt(bc2)).add_(ADAM_EPS)
            p_.addcdiv_(m_, denom, value=-lr / bc1)
        dW = oldW.sub_(Wt).neg_().view(R, P)
        dV = oldV.sub_(V).neg_().view(R, M * K)
        if prevW is not None:
            log["update_cos"][:, step] = 1 - torch.nn.functional.cosine_similarity(dW, prevW, dim=1, eps=1e-30).double()
            log["update_cos_V"][:, step] = 1 - torch.nn.functional.cosine_similarity(dV, prevV, dim=1, eps=1e-30).double()
        prevW, prevV = dW, dV
        if band:
            slot = step % band
            ringW[:, slot] = dW
            ringV[:, slot] = dV
            src = (step - lags) % band
            ok = (step - lags) >= 1
            # one matrix-vector product per run (4× faster on CPU than a batched product with a trailing 1)
            dots_W = torch.stack([torch.mv(ringW[r], dW[r]) for r in range(R)]).double()[:, src]
            dots_V = torch.stack([torch.mv(ringV[r], dV[r]) for r in range(R)]).double()[:, src]
            dW_band[:, step] = torch.where(ok, dots_W, nan)
            dV_band[:, step] = torch.where(ok, dots_V, nan)

    out = {k: v.cpu() for k, v in log.items()}
    out.update({k: v.cpu() for k, v in glog.items()})
    out["gram_epochs"] = torch.tensor(gram_ep, dtype=torch.long)
    if band:
        out["dW_band"], out["dV_band"] = dW_band.cpu(), dV_band.cpu()
    if keep:
        out["W_at"], out["V_at"] = W_at.cpu(), V_at.cpu()
    return out
