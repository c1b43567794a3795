"""Spectral theory of the GD Hessian (book chapters 2–4): bulk law, hard-direction outlier, δ_NN.

Everything here acts on a *law* of Hessian weights given by samples: ``G`` of shape ``[N, m, m]`` (symmetric; a
``[N]`` tensor is read as ``m = 1``), optional non-negative ``weights`` ``[N]`` (quadrature weights; uniform when
omitted), and for outliers the hard latent coordinates ``zeta`` ``[N, k_H]`` (or ``[N]``) jointly sampled with ``G``.
The samples come either from the DMFT sample-side process (``G_t = D(u^t; y)``) or from the empirical per-sample
weights ``D_i`` of a GD run. Linear algebra runs in float64/complex128 on ``G``'s device.

Equations (the book's labels):

* bulk (``eq-ch2-bulk``): ``S(z) = (−z I + E[G (I + S G/δ)^{-1}])^{-1}``, ``s(z) = tr S(z)/m``, ``ρ(x) = Im s(x + iε)/π``;
* left edge (chapter 2): square-root fit of ``ρ²`` on the left flank;
* outlier (``eq-ch3-phi``): ``Φ(z) = E[(ζζᵀ) ⊗ 𝒢(z)] − z I`` with ``𝒢(z) = G (I + S(z) G/δ)^{-1}``, root of ``det Φ``;
* overlap (``eq-ch3-overlap``): ``‖c‖²/(‖c‖² + cᵀ T'(z) c)`` with ``T(z) = E[ζζᵀ⊗G] − E[ζζᵀ⊗𝒢(z)]``;
* δ_NN (``eq-ch3-dnn``): root in δ of ``λ_min Φ(z₀; δ)``, ``z₀ = min(0, edge)``;
* scalar reductions (chapters 2–4): ``ψ_δ(λ) = λ(1/δ + E[G/(λ − G)])``, ``φ(λ) = λ E[ζ² G/(λ − G)]``
  (Lu–Li, arXiv:1702.06435; Mondelli–Montanari, arXiv:1708.05932), Marchenko–Pastur with ratio ``1/δ`` for ``G ≡ 1``.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .device import DivergenceError


class ConvergenceError(DivergenceError, RuntimeError):
    """A fixed-point solve did not converge (or produced non-finite values): carries the spectral argument ``z``,
    the ``iterations`` spent and the final ``residual`` (relative), so a wrong branch is never returned silently.
    A ``grokspectra.device.DivergenceError``, so an experiment reports it with its name and parameters."""

    def __init__(self, z, iterations: int, residual: float, what: str = "fixed point"):
        self.z, self.iterations, self.residual = z, int(iterations), float(residual)
        super().__init__(f"{what} did not converge at z = {z} after {iterations} iterations "
                         f"(relative residual {residual:.3e})")


# ----------------------------------------------------------------------------------------------------------------
# the law of G: samples and weights

def as_law(G, weights=None, zeta=None):
    """Normalise a law given by samples: ``G`` → float64 ``[N, m, m]``, ``weights`` → ``[N]`` summing to one,
    ``zeta`` → ``[N, k]`` (or ``None``). Raises ``ValueError`` for inconsistent shapes, non-symmetric or
    non-finite ``G``."""
    G = torch.as_tensor(G)
    if G.dim() == 1:
        G = G[:, None, None]
    if G.dim() != 3 or G.shape[1] != G.shape[2]:
        raise ValueError(f"G must have shape [N, m, m] or [N], got {tuple(G.shape)}")
    G = G.to(torch.float64)
    if not torch.isfinite(G).all():
        raise ValueError("G contains non-finite values")
    if (G - G.transpose(1, 2)).abs().max() > 1e-8 * (1 + G.abs().max()):
        raise ValueError("G must be symmetric")
    N = G.shape[0]
    if weights is None:
        w = torch.full((N,), 1.0 / N, dtype=torch.float64, device=G.device)
    else:
        w = torch.as_tensor(weights, dtype=torch.float64, device=G.device)
        if w.shape != (N,) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be non-negative of shape [{N}], got {tuple(w.shape)}")
        w = w / w.sum()
    if zeta is not None:
        zeta = torch.as_tensor(zeta, dtype=torch.float64, device=G.device)
        if zeta.dim() == 1:
            zeta = zeta[:, None]
        if zeta.dim() != 2 or zeta.shape[0] != N:
            raise ValueError(f"zeta must have shape [N] or [N, k] with N = {N}, got {tuple(zeta.shape)}")
    return G, w, zeta


def _scale(G: torch.Tensor, w: torch.Tensor) -> float:
    """A robust typical magnitude of G (weighted 75% quantile of ‖G_n‖_F; moments may not exist for unbounded
    laws such as T(y) = 1 − 1/y), used for step sizes and tolerances."""
    nrm = G.flatten(1).norm(dim=1)
    order = torch.argsort(nrm)
    cw = torch.cumsum(w[order], 0)
    i = int(torch.searchsorted(cw, torch.tensor(0.75, dtype=cw.dtype, device=cw.device)).clamp(max=len(cw) - 1))
    return float(nrm[order][i].clamp_min(1e-12))


def _chunks(Z: int, N: int, m: int, budget: float = 4e6):
    step = max(1, int(budget // (N * m ** 3)))
    return [slice(i, min(i + step, Z)) for i in range(0, Z, step)]


def _mm(A, B):
    """Batched product of small matrices stored entries-first: ``[m, k, ...] @ [k, p, ...] → [m, p, ...]``.
    Elementwise over the (z, sample) batch, which is far faster than batched tiny-matrix kernels."""
    return (A[:, :, None] * B[None, :, :]).sum(1)


def _inv(A):
    """Inverse of small matrices stored entries-first ``[m, m, ...]`` by Gauss–Jordan elimination, elementwise
    over the batch (no pivoting: used on I + S G/δ, whose pivots vanish only at genuine poles)."""
    m = A.shape[0]
    eye = torch.eye(m, dtype=A.dtype, device=A.device).reshape(m, m, *([1] * (A.dim() - 2))).expand_as(A)
    M = torch.cat([A, eye], dim=1).clone()
    for k in range(m):
        M[k] = M[k] / M[k, k]
        f = M[:, k].clone()
        f[k] = 0
        M = M - f[:, None] * M[k][None]
    return M[:, m:]


def _K(G, S, delta):
    """𝒢 = G (I + S G/δ)^{-1} for every z and sample (``eq-ch2-bulk``): G ``[N, m, m]``, S ``[Z, m, m]`` →
    entries-first ``[m, m, Z, N]``. Closed forms for m ≤ 2 (the hot path), Gauss–Jordan otherwise."""
    m = G.shape[-1]
    Ge = G.to(S.dtype).permute(1, 2, 0)[:, :, None, :]          # [m, m, 1, N]
    Se = S.permute(1, 2, 0)[..., None] / delta                    # [m, m, Z, 1]
    if m == 1:
        g = Ge[0, 0]
        return (g / (1 + Se[0, 0] * g))[None, None]
    if m == 2:
        g11, g12, g22 = Ge[0, 0], Ge[0, 1], Ge[1, 1]
        s11, s12, s22 = Se[0, 0], Se[0, 1], Se[1, 1]
        a11 = 1 + s11 * g11 + s12 * g12
        a12 = s11 * g12 + s12 * g22
        a21 = s12 * g11 + s22 * g12
        a22 = 1 + s12 * g12 + s22 * g22
        r = 1 / (a11 * a22 - a12 * a21)
        k11 = (g11 * a22 - g12 * a21) * r
        k12 = (g12 * a11 - g11 * a12) * r
        k22 = (g22 * a11 - g12 * a12) * r
        return torch.stack([torch.stack([k11, k12]), torch.stack([k12, k22])])
    I = torch.eye(m, dtype=S.dtype, device=S.device)[:, :, None, None]
    return _mm(Ge, _inv(I + _mm(Se, Ge)))


def _fixed_point_map(G, w, delta, S, z, jacobian=False):
    """F(S) = (−z + E[𝒢])^{-1}; with ``jacobian`` also J = I − (1/δ)(F⊗Fᵀ) E[𝒢⊗𝒢ᵀ] of R(S) = S − F(S)
    (row-major vec), used by Newton. Chunked over z so that Z·N·m³ stays bounded."""
    Z, m = S.shape[0], S.shape[-1]
    I = torch.eye(m, dtype=S.dtype, device=S.device)
    F = torch.empty_like(S)
    J = torch.empty((Z, m * m, m * m), dtype=S.dtype, device=S.device) if jacobian else None
    wc = w.to(S.dtype)
    for sl in _chunks(Z, G.shape[0], m):
        K = _K(G, S[sl], delta)                                   # [m, m, z, N]
        EK = (K @ wc).permute(2, 0, 1)                            # [z, m, m]
        Fi = torch.linalg.inv(-z[sl, None, None] * I + EK)
        F[sl] = Fi
        if jacobian:
            Kz = K.permute(2, 0, 1, 3)                            # [z, a, c, N]
            # E[K ⊗ Kᵀ][(a,b),(c,d)] = E[K_ac K_db]
            EKK = torch.einsum("zacn,zdbn->zabcd", Kz * wc, Kz).reshape(-1, m * m, m * m)
            FF = torch.einsum("zac,zdb->zabcd", Fi, Fi).reshape(-1, m * m, m * m)  # F ⊗ Fᵀ
            J[sl] = torch.eye(m * m, dtype=S.dtype, device=S.device) - FF @ EKK / delta
    return F, J


def _rel(R, S):
    return (R.flatten(1).norm(dim=1) / S.flatten(1).norm(dim=1).clamp_min(1e-300))


def _damped(G, w, delta, S, z, n_iter, alpha=0.5):
    """``n_iter`` damped fixed-point steps S ← (1 − α) S + α F(S) (chapter 2)."""
    for _ in range(n_iter):
        S = (1 - alpha) * S + alpha * _fixed_point_map(G, w, delta, S, z)[0]
    return S


def _newton(G, w, delta, S, z, tol, max_iter, admissible, max_backtrack=12):
    """Damped Newton on R(S) = S − F(S) (closed-form Jacobian), iterating only the z's not yet converged, with
    backtracking on ‖R‖; a step leaving the admissible set (the physical branch) is halved. A z whose residual
    cannot be decreased any more is frozen. Returns (S, relative residual, iterations)."""
    S = S.clone()
    res = _rel(S - _fixed_point_map(G, w, delta, S, z)[0], S)
    alive = torch.ones_like(res, dtype=torch.bool)
    it = 0
    while it < max_iter:
        idx = torch.nonzero(alive & (res > tol)).flatten()
        if idx.numel() == 0:
            break
        it += 1
        Si, zi, ri = S[idx], z[idx], res[idx]
        F, J = _fixed_point_map(G, w, delta, Si, zi, jacobian=True)
        step = torch.linalg.solve(J, (Si - F).flatten(1)[..., None])[..., 0].reshape(Si.shape)
        t = torch.ones_like(ri)
        acc = torch.zeros_like(ri, dtype=torch.bool)
        Snew, rnew = Si.clone(), ri.clone()
        for _ in range(max_backtrack):
            cand = Si - t[:, None, None].to(Si.dtype) * step
            rc = _rel(cand - _fixed_point_map(G, w, delta, cand, zi)[0], cand)
            ok = (rc < ri) & admissible(cand) & ~acc
            Snew[ok], rnew[ok] = cand[ok], rc[ok]
            acc |= ok
            if bool(acc.all()):
                break
            t = torch.where(acc, t, t / 2)
        S[idx], res[idx] = Snew, rnew
        alive[idx[~acc]] = False
    return S, res, it


# ----------------------------------------------------------------------------------------------------------------
# bulk

def bulk_stieltjes(G, delta: float, zs, *, weights=None, tol: float = 1e-10, max_iter: int = 60,
                   eps_start: float | None = None) -> torch.Tensor:
    """Matrix Stieltjes transform S(z) of the Hessian bulk at complex ``zs`` (Im z > 0), ``eq-ch2-bulk``:

    S(z) = (−z I_m + E[G (I_m + δ^{-1} S(z) G)^{-1}])^{-1},  Im S ≻ 0.

    Solved by a homotopy in Im z: start at Im z = ``eps_start`` (≈ the scale of G, where damped fixed-point
    iteration converges), then lower Im z geometrically to the target, each stage by damped Newton (chapter 2:
    Newton on the m² entries, Jacobian in closed form) warm-started from the previous one. Batched over ``zs``.

    Returns a complex128 tensor ``[Z, m, m]``. Raises :class:`ConvergenceError` (naming the worst z) when a stage
    does not reach relative residual ``tol``.
    """
    G, w, _ = as_law(G, weights)
    zs = torch.as_tensor(zs, dtype=torch.complex128, device=G.device).reshape(-1)
    if (zs.imag <= 0).any():
        raise ValueError("bulk_stieltjes needs Im z > 0; use real_axis_S on the real axis")
    m = G.shape[-1]
    scale = _scale(G, w)
    eps_target = zs.imag.clone()
    eps0 = max(float(eps_start) if eps_start is not None else scale, float(eps_target.max()))
    n_stage = max(1, int(math.ceil(math.log(eps0 / float(eps_target.min())) / math.log(6.0))) + 1)
    I = torch.eye(m, dtype=torch.complex128, device=G.device)

    def admissible(S):  # physical branch: Im S positive semi-definite (trace positive)
        return torch.diagonal(S.imag, dim1=1, dim2=2).sum(-1) > 0

    S = None
    for k in range(n_stage + 1):
        frac = k / n_stage
        eps = torch.exp((1 - frac) * math.log(eps0) + frac * torch.log(eps_target))
        z = zs.real + 1j * eps
        if S is None:
            S = -I / z[:, None, None]
            S = _damped(G, w, delta, S, z, 8)
        target = tol if k == n_stage else 1e-8
        S, res, it = _newton(G, w, delta, S, z, target, max_iter, admissible)
        for _ in range(3):  # a stalled Newton is pulled back to the physical branch by damped iteration
            bad = ~(res <= target) | ~admissible(S)  # a NaN residual is not convergence
            if not bool(bad.any()):
                break
            S = torch.where(bad[:, None, None], _damped(G, w, delta, S, z, 300), S)
            S, res, it2 = _newton(G, w, delta, S, z, target, max_iter, admissible)
            it += 300 + it2
        bad = ~(res <= 10 * target) | ~admissible(S)  # a NaN residual is not convergence
        if bool(bad.any()):
            i = int(torch.argmax(torch.where(bad, res.nan_to_num(nan=float("inf")), torch.zeros_like(res))))
            raise ConvergenceError(complex(z[i]), it, float(res[i]), "bulk Stieltjes solve")
    return S


def bulk_density(G, delta: float, xs, *, eps: float = 5e-4, weights=None, **kw) -> np.ndarray:
    """Bulk density ρ(x) = Im tr S(x + iε)/(π m) on the real grid ``xs`` (``eq-ch2-bulk``). Returns numpy ``[X]``."""
    xs = torch.as_tensor(xs, dtype=torch.float64)
    Gt = as_law(G, weights)[0]
    S = bulk_stieltjes(G, delta, xs.to(Gt.device) + 1j * eps, weights=weights, **kw)
    m = S.shape[-1]
    return (torch.diagonal(S, dim1=1, dim2=2).sum(-1).imag / (math.pi * m)).cpu().numpy()


def left_edge(G, delta: float, *, weights=None, method: str = "real", **kw):
    """Left edge of the bulk: ``method="real"`` follows the real branch to its fold (:func:`real_axis_edge`,
    exact for the given law); ``"density"`` is the square-root fit of ρ on the left flank (chapter 2,
    :func:`density_edge`). The two are independent routes and agree up to the ε-smearing bias of the latter."""
    if method == "real":
        return real_axis_edge(G, delta, weights=weights, side="left", **kw)
    if method == "density":
        return density_edge(G, delta, weights=weights, **kw)
    raise ValueError(f"left_edge: unknown method {method!r}; use 'real' or 'density'")


def density_edge(G, delta: float, *, weights=None, eps: float = 5e-4, window=None, n_grid: int = 64,
              lo_frac: float = 0.02, hi_frac: float = 0.25, return_fit: bool = False):
    """Left edge of the bulk by the square-root fit of chapter 2: on the left flank, fit ρ² linearly on the
    points with ``lo_frac`` < ρ/ρ_max < ``hi_frac`` and return the x-intercept.

    ``window = (x_lo, x_hi)`` is the search interval (default: ±4 × the scale of G around 0, enough for the
    spectra of this book); ρ_max is the maximum of ρ over that window, excluding the atom at 0 that appears for
    δ < 1. The flank is refined twice on a finer grid. Raises ``ValueError`` when no flank is found.
    """
    Gt, w, _ = as_law(G, weights)
    scale = _scale(Gt, w)
    lo, hi = window if window is not None else (-4 * scale - 1.0 / max(delta, 1e-3), 4 * scale * (1 + 1 / delta) + 1)
    xs = np.linspace(lo, hi, n_grid)
    rho = bulk_density(Gt, delta, xs, eps=eps, weights=w)
    keep = np.abs(xs) > 50 * eps if delta < 1 else np.ones_like(xs, bool)
    rmax = float(np.max(rho[keep]))
    if not rmax > 0:
        raise ValueError("left_edge: zero density on the window")
    for _ in range(2):
        above = np.nonzero((rho >= 1.5 * hi_frac * rmax) & keep)[0]
        if len(above) == 0 or above[0] == 0:
            raise ValueError(f"left_edge: no left flank in the window [{lo:.3g}, {hi:.3g}] (widen it)")
        i1 = above[0]
        below = np.nonzero(rho[:i1] < 0.5 * lo_frac * rmax)[0]
        i0 = below[-1] if len(below) else 0
        xs = np.linspace(xs[i0], xs[i1], 32)
        rho = bulk_density(Gt, delta, xs, eps=eps, weights=w)
        keep = np.ones_like(xs, bool)
    band = (rho > lo_frac * rmax) & (rho < hi_frac * rmax)
    if band.sum() < 4:
        raise ValueError(f"left_edge: only {band.sum()} points on the flank for the square-root fit")
    slope, icpt = np.polyfit(xs[band], rho[band] ** 2, 1)
    if slope <= 0:
        raise ValueError("left_edge: the flank is not increasing (no square-root edge)")
    edge = -icpt / slope
    return (edge, (xs, rho, band)) if return_fit else edge


# ----------------------------------------------------------------------------------------------------------------
# real axis (below the left edge, or above the right edge)

def _far(G, w, delta, side):
    """A real z far outside the spectrum on ``side`` (|z| beyond any eigenvalue of the law's H)."""
    gmax = float(torch.linalg.eigvalsh(G).abs().max())
    r = 2 * gmax * (1 + 1 / math.sqrt(delta)) ** 2 + 1
    return -r if side == "left" else r


def _branch_gap(G, w, delta, S, z):
    """1 − (spectral abscissa of the fixed-point iteration's Jacobian L = (1/δ)(F⊗Fᵀ)E[𝒢⊗𝒢ᵀ]) at real (S, z):
    positive on the physical real branch, → 0 as √(edge − z) at a square-root edge, where J = I − L is singular."""
    _F, J = _fixed_point_map(G, w, delta, S, z, jacobian=True)
    L = torch.eye(J.shape[-1], dtype=J.dtype, device=J.device) - J
    return 1 - torch.linalg.eigvals(L).real.max(-1).values


def _march(G, w, delta, z_to, side, start=None, tol=1e-12, h_min_rel=1e-7):
    """Follow the physical real branch S(z) from ``start = (z, S)`` (default: far outside, S ≈ −I/z) towards
    ``z_to`` by predictor (dS/dz = J⁻¹ vec(F F)) – corrector (Newton) steps with adaptive step size. A step is
    accepted only when Newton converges, S stays definite with the side's sign, and the branch gap stays positive
    (so Newton can never jump to the unphysical real branch, a failure mode of plain Newton on the real axis). Returns
    (list of (z, S [m, m], gap), reached)."""
    sign = 1.0 if side == "left" else -1.0
    m = G.shape[-1]
    I = torch.eye(m, dtype=torch.float64, device=G.device)
    scale = _scale(G, w)

    def adm(S):
        return torch.linalg.eigvalsh(sign * S).min(-1).values > 0

    if start is None:
        z = _far(G, w, delta, side)
        zt = torch.tensor([z], dtype=torch.float64, device=G.device)
        S = -I[None] / z
        for _ in range(200):
            Fs = _fixed_point_map(G, w, delta, S, zt)[0]
            done = float(_rel(S - Fs, S)) < 1e-13
            S = Fs
            if done:
                break
        S, res, _ = _newton(G, w, delta, S, zt, tol, 50, adm)
        if not float(res) <= 1e-9:  # NaN included
            raise ConvergenceError(z, 200, float(res), "real-axis S far outside the bulk")
        S = S[0]
    else:
        z, S = float(start[0]), torch.as_tensor(start[1], dtype=torch.float64, device=G.device)
    # towards the bulk for an infinite target, else towards the target (either way along the branch)
    direction = sign if not math.isfinite(z_to) else (1.0 if z_to >= z else -1.0)
    zt = torch.tensor([z], dtype=torch.float64, device=G.device)
    path = [(z, S, float(_branch_gap(G, w, delta, S[None], zt)))]
    h = 0.05 * scale + 0.05 * abs(direction * (z_to - z)) if math.isfinite(z_to) else 0.2 * scale
    h_min = h_min_rel * max(scale, 1e-12)
    while direction * (z_to - z) > 1e-15 * max(1.0, abs(z)):
        h = min(h, direction * (z_to - z))
        zn = z + direction * h
        zt = torch.tensor([z], dtype=torch.float64, device=G.device)
        F, J = _fixed_point_map(G, w, delta, S[None], zt, jacobian=True)
        dS = torch.linalg.solve(J[0], (F[0] @ F[0]).reshape(-1)).reshape(m, m)
        znt = torch.tensor([zn], dtype=torch.float64, device=G.device)
        Sn, res, _ = _newton(G, w, delta, (S + direction * h * dS)[None], znt, tol, 8, adm, max_backtrack=4)
        ok = float(res) <= 100 * tol and bool(adm(Sn).all())
        gap = float(_branch_gap(G, w, delta, Sn, znt)) if ok else -1.0
        if ok and gap > 0:
            z, S = zn, Sn[0]
            path.append((z, S, gap))
            h *= 1.6
        else:
            h /= 4
            if h < h_min:
                return path, False
    return path, True


def real_axis_S(G, delta: float, z, *, weights=None, side: str = "left", start=None, tol: float = 1e-12):
    """The real solution S(z) of the bulk equation for real ``z`` outside the bulk (chapter 3):
    positive definite below the spectrum (``side="left"``), negative definite above it (``side="right"``).

    Continuation from far outside (S ≈ −I/z) along the physical branch (:func:`_march`), through the sorted
    ``z`` values in turn; ``start = (z₀, S₀)`` warm-starts from a known point of the branch. Returns float64
    ``[Z, m, m]`` in the order of ``z``. Raises :class:`ConvergenceError` when the branch cannot be followed to
    some z (it lies inside the bulk, or beyond a pole of an unbounded law).
    """
    G, w, _ = as_law(G, weights)
    z = torch.as_tensor(z, dtype=torch.float64).reshape(-1).tolist()
    order = sorted(range(len(z)), key=lambda i: z[i], reverse=(side == "right"))
    out = [None] * len(z)
    for i in order:
        path, reached = _march(G, w, delta, z[i], side, start=start, tol=tol)
        if not reached:
            raise ConvergenceError(z[i], len(path), float("nan"),
                                   f"real-axis S ({side} of the bulk; branch ends near z = {path[-1][0]:.6g})")
        start = (path[-1][0], path[-1][1])
        out[i] = path[-1][1]
    return torch.stack(out)


def real_axis_edge(G, delta: float, *, weights=None, side: str = "left", n_fit: int = 6, return_path: bool = False):
    """The edge of the bulk from the real axis: follow the physical real branch from far outside until it ends
    (the fold where J = I − L becomes singular), then extrapolate the square-root law gap² ∝ |edge − z| of the
    branch gap (:func:`_branch_gap`) over the last ``n_fit`` points. Independent of the density route
    (:func:`left_edge`) and free of the ε-smearing bias; exact for the limit law of the given samples."""
    G, w, _ = as_law(G, weights)
    path, _ = _march(G, w, delta, math.inf if side == "left" else -math.inf, side)
    zs = np.array([p[0] for p in path])
    gaps = np.array([p[2] for p in path])
    k = min(n_fit, len(path))
    slope, icpt = np.polyfit(zs[-k:], gaps[-k:] ** 2, 1)
    edge = -icpt / slope if slope != 0 else zs[-1]
    if not np.isfinite(edge) or (edge - zs[-1]) * (1 if side == "left" else -1) < 0:
        edge = zs[-1]
    return (float(edge), path) if return_path else float(edge)


# ----------------------------------------------------------------------------------------------------------------
# outlier equation

def _kron_zeta(zeta, w, K):
    """E[(ζζᵀ) ⊗ 𝒢] for entries-first K ``[m, m, Z, N]`` → ``[Z, k m, k m]``."""
    m, Z = K.shape[0], K.shape[2]
    k = zeta.shape[1]
    E = torch.einsum("n,na,nb,ijzn->zaibj", w.to(K.dtype), zeta.to(K.dtype), zeta.to(K.dtype), K)
    return E.reshape(Z, k * m, k * m)


def phi_matrix(G, zeta, delta: float, z, *, weights=None, S=None, side: str = "left", start=None):
    """Φ(z) = E[(ζζᵀ) ⊗ G(I + S(z) G/δ)^{-1}] − z I_{k m} at real ``z`` outside the bulk (``eq-ch3-phi``).
    Returns (Φ ``[Z, km, km]`` float64, S ``[Z, m, m]``)."""
    G, w, zeta = as_law(G, weights, zeta)
    if zeta is None:
        raise ValueError("phi_matrix needs zeta")
    z = torch.as_tensor(z, dtype=torch.float64, device=G.device).reshape(-1)
    if S is None:
        S = real_axis_S(G, delta, z, weights=w, side=side, start=start)
    K = _K(G, S, delta)
    E = _kron_zeta(zeta, w, K)
    E = 0.5 * (E + E.transpose(1, 2))
    km = E.shape[-1]
    return E - z[:, None, None] * torch.eye(km, dtype=E.dtype, device=E.device), S


def phi_min_at(G, zeta, delta: float, z0, *, weights=None, side: str = "left", start=None) -> float:
    """λ_min Φ(z₀) (``side="left"``) or λ_max Φ(z₀) (``"right"``). A negative (positive) value means an
    informative outlier below (above) z₀, because Φ is strictly decreasing in z (``eq-ch3-dnn``)."""
    P, _ = phi_matrix(G, zeta, delta, z0, weights=weights, side=side, start=start)
    ev = torch.linalg.eigvalsh(P[0])
    return float(ev[0] if side == "left" else ev[-1])


def _starter(path, side):
    """Warm start for the real branch at z: the followed point of ``path`` nearest to z on the far side."""
    zs = np.array([p[0] for p in path])

    def start(z):
        ok = np.nonzero(zs <= z)[0] if side == "left" else np.nonzero(zs >= z)[0]
        i = ok[np.argmax(zs[ok])] if side == "left" else ok[np.argmin(zs[ok])]
        return path[i][0], path[i][1]

    return start


def _slope(at, P0, root: float, h: float, dist: float, sgn: float):
    """dΦ/dz at ``root`` from ``at(z)`` = Φ(z) on the followed real branch, which ends ``dist`` ≥ 0 away from the root
    towards the bulk (``sgn`` = +1 left of the bulk, −1 right of it): a central difference of step min(h, dist/10),
    so that both points lie on the branch (a step of h across the end would leave it: no real solution there) and,
    near a square-root edge, where Φ' grows as dist^(−1/2), the step's relative error stays below 0.2 % (the
    difference itself, ≈ √dist/10, stays far above the solver's 1e-12 precision down to dist ≈ 1e-12). Only for a
    root at the end itself (step below 1e-13) a one-sided second-order difference of step h away from the bulk,
    (3Φ(r) − 4Φ(r − sgn·h) + Φ(r − 2·sgn·h)) / (2h)·sgn, from ``P0`` = Φ(root)."""
    hc = min(h, 0.1 * dist)
    if hc > 1e-13 * max(1.0, abs(root)):
        return (at(root + hc) - at(root - hc)) / (2 * hc)
    return sgn * (3 * P0 - 4 * at(root - sgn * h) + at(root - 2 * sgn * h)) / (2 * h)


def outlier(G, zeta, delta: float, *, weights=None, edge: float | None = None, side: str = "left",
            margin: float = 1e-4, xtol: float = 1e-9, fd_step: float = 1e-5) -> dict:
    """The hard-direction outlier of ``eq-ch3-phi``–``eq-ch3-overlap``: the root z_out of λ_min Φ(z) = 0 below the left edge
    (``side="left"``; or of λ_max Φ above the right edge for ``"right"``, the spectral-method case of chapter 4), and the
    predicted squared overlap of its eigenvector with the hard block,

        overlap = ‖c‖² / (‖c‖² + cᵀ T'(z_out) c),   T'(z) = −d/dz E[(ζζᵀ) ⊗ 𝒢(z)]

    (:func:`_slope`: a central difference of step ``fd_step``·scale, shrunk for a root near the end of the followed
    real branch so that both points stay on it),

    with c the unit null vector of Φ(z_out). A root whose overlap is not in (0, 1] is a spurious sign change at a
    pole of the real-axis S (chapter 3; unbounded G): it is rejected (``exists = False``, ``spurious = True``).

    ``edge`` defaults to :func:`real_axis_edge`; the search starts at ``edge ∓ margin·scale`` and brackets the
    root by doubling steps away from the bulk, then Brent's method. Returns a dict with ``exists``, ``root``,
    ``overlap``, ``vector`` (c), ``edge``, ``phi_edge`` (the extreme eigenvalue of Φ at the start point) and
    ``spurious``.
    """
    from scipy.optimize import brentq

    G, w, zeta = as_law(G, weights, zeta)
    scale = _scale(G, w)
    sgn = 1.0 if side == "left" else -1.0
    e_real, path = real_axis_edge(G, delta, weights=w, side=side, return_path=True)
    edge = e_real if edge is None else float(edge)
    start = _starter(path, side)
    # start at the last followed point of the branch (within ~1e-7·scale of its end) unless the given edge is
    # farther out
    z0 = path[-1][0] if (edge - path[-1][0]) * sgn >= 0 else edge - sgn * margin * scale

    def f(z):
        P, _S = phi_matrix(G, zeta, delta, z, weights=w, side=side, start=start(z))
        ev = torch.linalg.eigvalsh(P[0])
        return float(ev[0]) if side == "left" else -float(ev[-1])

    out = {"edge": float(edge), "root": float("nan"), "overlap": float("nan"), "vector": None,
           "exists": False, "spurious": False}
    f0 = f(z0)
    if not math.isfinite(f0):
        raise ConvergenceError(z0, len(path), float("nan"), "outlier equation at the bulk edge (non-finite Φ)")
    out["phi_edge"] = f0 * sgn
    if f0 >= 0:
        return out
    step = 0.05 * scale
    z1 = z0 - sgn * step
    for _ in range(60):
        if f(z1) > 0:
            break
        step *= 2
        z1 = z0 - sgn * step
    else:
        raise ConvergenceError(z1, 60, float("nan"), "outlier bracket search")
    a, b = sorted((z0, z1))
    root = brentq(f, a, b, xtol=xtol * max(1.0, scale))
    P, S = phi_matrix(G, zeta, delta, root, weights=w, side=side, start=start(root))
    c = torch.linalg.eigh(P[0])[1][:, 0 if side == "left" else -1]

    def at(z):
        return phi_matrix(G, zeta, delta, z, weights=w, side=side, start=(root, S[0]))[0][0]

    dP = _slope(at, P[0], root, fd_step * scale, (path[-1][0] - root) * sgn, sgn)
    # E[ζζᵀ⊗𝒢](z) = Φ(z) + z I, so  cᵀT'c = −cᵀ(Φ'(z) + I)c
    q = float(-(c @ dP @ c)) - 1.0
    ov = 1.0 / (1.0 + q) if 1.0 + q != 0 else float("inf")
    out.update(root=float(root), vector=c.cpu().numpy())
    if 1.0 + q > 0 and 0 < ov <= 1.0 + 1e-9:
        out.update(overlap=float(min(ov, 1.0)), exists=True)
    else:
        out.update(overlap=float(ov), spurious=True)
    return out


# ----------------------------------------------------------------------------------------------------------------
# δ_NN

def nn_criterion(G, zeta, delta: float, *, weights=None, side: str = "left") -> dict:
    """The δ_NN test of ``eq-ch3-dnn`` at one δ. ``side="left"``: z₀ = min(0, edge) and crit = λ_min Φ(z₀);
    crit < 0 ⇔ a negative informative outlier exists. ``side="right"`` (spectral methods, chapter 4): z₀ = the right
    edge and crit = −λ_max Φ(z₀); crit < 0 ⇔ an informative outlier above the bulk. The point z₀ is taken on the
    followed real branch (at most ~1e-7·scale inside the edge). Returns ``{"crit", "z0", "edge"}``."""
    G, w, zeta = as_law(G, weights, zeta)
    sgn = 1.0 if side == "left" else -1.0
    edge, path = real_axis_edge(G, delta, weights=w, side=side, return_path=True)
    start = _starter(path, side)
    z0 = min(0.0, path[-1][0]) if side == "left" else path[-1][0]
    v = phi_min_at(G, zeta, delta, z0, weights=w, side=side, start=start(z0))
    if not math.isfinite(v) or not math.isfinite(edge):
        raise ConvergenceError(z0, len(path), float("nan"), f"δ_NN criterion at δ = {delta:g} (non-finite value)")
    return {"crit": sgn * v, "z0": z0, "edge": float(edge)}


def delta_nn(law: Callable[[float], tuple], lo: float, hi: float, *, rtol: float = 0.02, max_iter: int = 12,
             log: bool = True, side: str = "left", expand: int = 0) -> dict:
    """δ_NN by bisection in δ (``eq-ch3-dnn``): ``law(δ)`` returns ``(G, zeta)`` or ``(G, zeta, weights)`` (rerunning
    the DMFT for each δ); the criterion is :func:`nn_criterion` (``side="right"`` gives the spectral threshold of a
    preprocessing, e.g. δ_alg). Needs crit(lo) ≥ 0 > crit(hi) (no outlier at ``lo``, an outlier at ``hi``); with
    ``expand`` > 0 the bracket is first widened by factors of 2 (at most ``expand`` times per side). Bisects
    (geometrically when ``log``) until hi/lo − 1 < ``rtol``.

    Returns ``{"delta_nn", "lo", "hi", "deltas", "crits", "edges", "z0s"}`` (every evaluated δ, in order). Raises
    ``ValueError`` when the bracket does not bracket, naming both criteria.
    """
    hist = {"deltas": [], "crits": [], "edges": [], "z0s": []}

    def crit(d):
        args = law(d)
        c = nn_criterion(args[0], args[1], d, weights=args[2] if len(args) > 2 else None, side=side)
        hist["deltas"].append(d)
        hist["crits"].append(c["crit"])
        hist["edges"].append(c["edge"])
        hist["z0s"].append(c["z0"])
        return c["crit"]

    clo, chi = crit(lo), crit(hi)
    for _ in range(expand):
        if clo < 0:
            hi, chi, lo = lo, clo, lo / 2
            clo = crit(lo)
        elif chi >= 0:
            lo, clo, hi = hi, chi, hi * 2
            chi = crit(hi)
        else:
            break
    if not (clo >= 0 > chi):
        raise ValueError(f"delta_nn: [{lo}, {hi}] does not bracket the threshold: criterion = {clo:.4g} at δ = {lo} "
                         f"(needs ≥ 0) and {chi:.4g} at δ = {hi} (needs < 0)")
    for _ in range(max_iter):
        if hi / lo - 1 < rtol:
            break
        mid = math.sqrt(lo * hi) if log else 0.5 * (lo + hi)
        if crit(mid) < 0:
            hi = mid
        else:
            lo = mid
    return {"delta_nn": math.sqrt(lo * hi) if log else 0.5 * (lo + hi), "lo": lo, "hi": hi,
            **{k: np.asarray(v) for k, v in hist.items()}}


# ----------------------------------------------------------------------------------------------------------------
# scalar reductions and closed forms (anchors)

def psi_delta(G, delta: float, lam, *, weights=None) -> np.ndarray:
    """ψ_δ(λ) = λ (1/δ + E[G/(λ − G)]) for scalar G (Lu–Li, arXiv:1702.06435; Mondelli–Montanari, arXiv:1708.05932)."""
    G, w, _ = as_law(G, weights)
    g = G[:, 0, 0]
    lam = torch.as_tensor(lam, dtype=torch.float64, device=g.device).reshape(-1)
    return (lam * (1 / delta + (w * g / (lam[:, None] - g)).sum(-1))).cpu().numpy()


def phi_lu_li(G, zeta, lam, *, weights=None) -> np.ndarray:
    """φ(λ) = λ E[ζ² G/(λ − G)] for scalar G (the scalar case of ``eq-ch3-phi``); the outlier solves ψ_δ(λ) = φ(λ)."""
    G, w, zeta = as_law(G, weights, zeta)
    g, zz = G[:, 0, 0], zeta[:, 0] ** 2
    lam = torch.as_tensor(lam, dtype=torch.float64, device=g.device).reshape(-1)
    return (lam * (w * zz * g / (lam[:, None] - g)).sum(-1)).cpu().numpy()


def lu_li_right(G, zeta, delta: float, *, weights=None) -> dict:
    """The scalar spectral-method analysis (Lu–Li; Mondelli–Montanari) for the *top* of the spectrum, computed
    from ψ_δ and φ directly (an independent route to :func:`outlier` with ``side="right"``): λ̄ = argmin of ψ_δ
    on (sup G, ∞), right edge ψ_δ(λ̄); the outlier exists iff φ(λ̄) > ψ_δ(λ̄) and then sits at ψ_δ(λ*) with
    λ* > λ̄ the root of ψ_δ = φ, with squared overlap ψ'_δ(λ*)/(ψ'_δ(λ*) − φ'(λ*)) (Lu–Li, recalled)."""
    from scipy.optimize import brentq, minimize_scalar

    G, w, zeta = as_law(G, weights, zeta)
    gmax = float(G[:, 0, 0].max())
    span = max(1.0, abs(gmax))
    psi = lambda l: float(psi_delta(G, delta, l, weights=w)[0])
    phi = lambda l: float(phi_lu_li(G, zeta, l, weights=w)[0])
    r = minimize_scalar(lambda t: psi(gmax + math.exp(t)), bounds=(math.log(1e-8 * span), math.log(1e4 * span)),
                        method="bounded", options={"xatol": 1e-12})
    lbar = gmax + math.exp(r.x)
    out = {"lbar": lbar, "edge": psi(lbar), "exists": phi(lbar) > psi(lbar), "root": float("nan"),
           "overlap": float("nan")}
    if out["exists"]:
        hi = lbar * 2 + 1
        while phi(hi) > psi(hi):
            hi = 2 * hi
        lstar = brentq(lambda l: phi(l) - psi(l), lbar, hi, xtol=1e-13)
        h = 1e-6 * lstar
        dpsi, dphi = (psi(lstar + h) - psi(lstar - h)) / (2 * h), (phi(lstar + h) - phi(lstar - h)) / (2 * h)
        out.update(lstar=lstar, root=psi(lstar), overlap=dpsi / (dpsi - dphi))
    return out


def marchenko_pastur_density(x, ratio: float) -> np.ndarray:
    """Marchenko–Pastur density of (1/n) XᵀX, X ∈ R^{n×d}, ratio γ = d/n (absolutely continuous part):
    ρ(x) = √((b − x)(x − a)) / (2π γ x) on [a, b] = [(1 − √γ)², (1 + √γ)²]."""
    x = np.asarray(x, dtype=float)
    a, b = (1 - math.sqrt(ratio)) ** 2, (1 + math.sqrt(ratio)) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.sqrt(np.clip((b - x) * (x - a), 0, None)) / (2 * math.pi * ratio * x)
    return np.where((x > a) & (x < b), r, 0.0)


def mondelli_montanari_T(y, delta: float):
    """Mondelli–Montanari optimal preprocessing T_δ(y) = (y₊ − 1)/(y₊ + √δ − 1) (Mondelli–Montanari, arXiv:1708.05932)."""
    y = torch.as_tensor(y).clamp_min(0)
    return (y - 1) / (y + math.sqrt(delta) - 1)


def luo_alghamdi_lu_T(y):
    """Luo–Alghamdi–Lu preprocessing T*(y) = 1 − 1/y (Luo–Alghamdi–Lu, arXiv:1811.04420), optimal for noiseless phase retrieval."""
    return 1 - 1 / torch.as_tensor(y)
