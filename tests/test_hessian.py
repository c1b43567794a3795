"""Tests of the exact Hessian: dense and matrix-free forms against torch.func.hessian, iterative eigensolvers against
dense eigh, the overlap helper on constructed vectors."""

import math

import pytest
import torch
from torch.func import hessian

from grokspectra import hessian as hs
from grokspectra import multiindex as mi

F64 = torch.float64


def _setup(act="gelu", d=9, n=40, m=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    prob = mi.sample_problem(d, n, 1, "pr_clip", trials=1, dtype=F64, generator=g)
    Th = torch.randn(d, m, generator=g, dtype=F64) / math.sqrt(d) + 0.5 * prob.Theta_star[0][0]
    a = torch.randn(m, generator=g, dtype=F64)
    b = 0.2 * torch.randn(m, generator=g, dtype=F64)
    return prob, Th, prob.X[0][0], prob.y[0][0], a, b


@pytest.mark.parametrize("act", ["gelu", "quad", "tanh", "relu"])
@pytest.mark.parametrize("loss", ["square", "logcosh"])
def test_dense_hessian_matches_autograd(act, loss):
    """H = (1/n) Σ D_i ⊗ x_i x_iᵀ + λI (eq. app-weights) vs torch.func.hessian of R̂, vec(Θ) neuron-major."""
    prob, Th, X, y, a, b = _setup(act)
    lam = 0.07
    d, m = Th.shape

    def risk(v):
        T = v.reshape(m, d).T
        return mi.per_sample_loss(X @ T, y, act, a, b, loss).mean() + 0.5 * lam * (v ** 2).sum()

    H_ad = hessian(risk)(Th.T.reshape(-1))
    H = hs.hessian_dense(Th, X, y, act, a, b, lam=lam, loss=loss)
    assert torch.allclose(H, H_ad, atol=1e-12)


def test_matvec_matches_dense_in_both_layouts_and_batched():
    prob, Th, X, y, a, b = _setup()
    d, m = Th.shape
    H = hs.hessian_dense(Th, X, y, "gelu", a, b, lam=0.1)
    V = torch.randn(5, m * d, dtype=F64, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(hs.hessian_matvec(Th, X, y, "gelu", a, b, V, lam=0.1), V @ H.T, atol=1e-12)
    Vm = hs.vec_to_mat(V, d, m)
    assert torch.allclose(hs.mat_to_vec(hs.hessian_matvec(Th, X, y, "gelu", a, b, Vm, lam=0.1)), V @ H.T, atol=1e-12)
    # batched over problems: leading dims of Theta/X/y
    Thb, Xb, yb = torch.stack([Th, 2 * Th]), torch.stack([X, X.flip(0)]), torch.stack([y, y.flip(0)])
    Hb = hs.hessian_dense(Thb, Xb, yb, "gelu", a, b)
    assert torch.allclose(Hb[1], hs.hessian_dense(2 * Th, X.flip(0), y.flip(0), "gelu", a, b), atol=1e-12)
    assert torch.allclose(hs.hessian_matvec(Thb, Xb, yb, "gelu", a, b, V[:2]), (Hb @ V[:2, :, None])[..., 0], atol=1e-12)


@pytest.mark.parametrize("method", ["lobpcg", "lanczos"])
def test_iterative_lowest_eigpairs_match_dense(method):
    """Matrix-free solvers vs dense eigh: eigenvalues to 1e-6 relative to ‖H‖, eigenvectors up to sign."""
    prob, Th, X, y, a, b = _setup(d=60, n=150, m=2, seed=3)
    w0, V0 = hs.lowest_eigpairs(Th, X, y, "gelu", k=3, method="dense")
    assert w0[0] < w0[1] - 1e-3 < w0[2] - 2e-3  # separated, so eigenvectors are defined
    w, V = hs.lowest_eigpairs(Th, X, y, "gelu", k=3, method=method, tol=1e-8)
    scale = torch.linalg.eigvalsh(hs.hessian_dense(Th, X, y, "gelu")).abs().max()
    assert ((w - w0).abs() / scale).max() < 1e-6
    assert ((V * V0).sum(0).abs() > 1 - 1e-5).all()
    ov, ov0 = hs.overlap_with(V.T, prob.Theta_star[0][0]), hs.overlap_with(V0.T, prob.Theta_star[0][0])
    assert torch.allclose(ov, ov0, atol=1e-5)


def test_nonconvergence_raises_with_details():
    prob, Th, X, y, a, b = _setup(d=60, n=150, m=2, seed=3)
    with pytest.raises(hs.EigenConvergenceError, match="did not converge"):
        hs.lowest_eigpairs(Th, X, y, "gelu", k=2, method="lobpcg", maxiter=1, tol=1e-12)


def test_overlap_with_on_constructed_vectors():
    g = torch.Generator().manual_seed(0)
    d, m, k = 50, 3, 2
    Ts = mi.random_orthonormal(1, d, k, device="cpu", dtype=F64, generator=g)[0]
    c = torch.randn(k, m, dtype=F64, generator=g)
    inside = hs.mat_to_vec(Ts @ c)  # V = Θ_* c ∈ span(Θ_*) ⊗ R^m
    W = torch.randn(d, m, dtype=F64, generator=g)
    outside = hs.mat_to_vec(W - Ts @ (Ts.T @ W))
    assert math.isclose(hs.overlap_with(inside, Ts).item(), 1.0, rel_tol=1e-12)
    assert abs(hs.overlap_with(outside, Ts).item()) < 1e-24
    mix = (inside / inside.norm() + outside / outside.norm()) / math.sqrt(2)
    assert math.isclose(hs.overlap_with(mix, Ts).item(), 0.5, rel_tol=1e-12)
    with pytest.raises(ValueError, match="multiple of d"):
        hs.overlap_with(torch.ones(d * m + 1, dtype=F64), Ts)
