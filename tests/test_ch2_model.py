"""Chapter 2's matrix model of the DMFT law (``ch2.model``): its coordinates, its eigensolver, closed forms and the
score against GD."""
import math

import numpy as np
import pytest
import torch

from grokspectra.experiments import ch2
from grokspectra.store import Result

F64 = torch.float64


def test_span_coords_are_the_coordinates_of_the_projection():
    """With A of rank 3 spread over 5 columns (two repeated), the coordinates of Aᵀx have the norm of the
    projection of x on span(A), and Θ_*'s coordinates (A's first column) have its norm."""
    g = torch.Generator().manual_seed(0)
    d, n = 40, 300
    B = torch.randn(d, 3, dtype=F64, generator=g)
    A = torch.cat([B, B[:, :1] * 2.0, B[:, 1:2] - B[:, 2:3]], 1)
    X = torch.randn(n, d, dtype=F64, generator=g)
    c, th = ch2._span_coords(X @ A, A.T @ A, 1)
    P = A @ torch.linalg.pinv(A)
    assert c.shape == (n, 3)
    assert torch.allclose((c ** 2).sum(1), ((X @ P) ** 2).sum(1), rtol=1e-9)
    assert math.isclose(float(th.norm()), float(A[:, 0].norm()), rel_tol=1e-9)


def test_lowest_vector_matches_eigh():
    g = torch.Generator().manual_seed(1)
    A = torch.randn(300, 300, dtype=F64, generator=g)
    H = (A + A.T) / 2
    w, V = torch.linalg.eigh(H)
    v = ch2._lowest_vector(H, w, g)
    assert abs(float(v @ V[:, 0])) > 1 - 1e-10


def _fake_run(n, T, y_from_z, seed=2):
    """A stand-in for a DMFT result with M = 0 and Q_⊥ = I (independent Gaussian z and u), one neuron, and labels
    y = z (the weights then depend on the hard direction) or independent of it."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 1, dtype=F64, generator=g)
    u = {s: torch.randn(n, 1, dtype=F64, generator=g) for s in range(T + 1)}
    y = z[:, 0].clone() if y_from_z else torch.randn(n, dtype=F64, generator=g)
    return {"M": torch.zeros(T + 1, 1, 1, dtype=F64), "Qperp_all": torch.eye(T + 1, dtype=F64), "z": z, "u": u,
            "y": y, "hard": (0,)}


def test_rest_is_orthogonal_to_the_steps_gradients():
    """The Gaussian rest is conditioned on GD's steps: orthogonal over the samples to F(u^s; y) for s < t, not to
    the current step's F(u^t; y)."""
    from grokspectra import multiindex as mi

    run = _fake_run(500, 4, True)
    G = ch2._rest(run, 3, 500, 60, "gelu", torch.Generator().manual_seed(0))
    for s, small in ((0, True), (2, True), (3, False)):
        F = mi.per_sample_F(run["u"][s], run["y"], "gelu")
        r = float((F.T @ G).norm() / (F.norm() * G.norm()))
        assert (r < 1e-12) if small else (r > 1e-3), (s, r)


def test_model_draw_with_unit_weights_is_marchenko_pastur(monkeypatch):
    """D ≡ 1 makes the model (1/n)XᵀX with Gaussian X: its lowest eigenvalue is at the Marchenko–Pastur edge
    (1 − √(d/n))², within a few times the Tracy–Widom scale (√n − √d)(1/√d − 1/√n)^(1/3)/n ≈ 0.006 here."""
    monkeypatch.setattr(ch2.mi, "per_sample_D", lambda u, y, act: torch.ones(u.shape[0], 1, 1, dtype=F64))
    n, d, T = 1200, 200, 3
    edge = (1 - math.sqrt(d / n)) ** 2
    tw = (math.sqrt(n) - math.sqrt(d)) * (1 / math.sqrt(d) - 1 / math.sqrt(n)) ** (1 / 3) / n
    g = torch.Generator().manual_seed(3)
    for seed in range(3):
        o = ch2.model_draw(_fake_run(n, T, False, seed), T, n, d, "gelu", g)
        assert o["rank"] == T + 2
        assert abs(o["eigs"][0] - edge) < 5 * tw, (o["eigs"][0], edge, tw)
        assert o["ov"] < 0.1


def test_model_draw_finds_a_planted_hard_outlier(monkeypatch):
    """Weights 1 − 1.5·tanh(y²/2) with y = ⟨x, θ_*⟩ make the quadratic form along θ_* E[(1 − 1.5 tanh(z²/2)) z²]
    ≈ −0.09, while the other directions see a bulk whose lowest eigenvalue is ≈ +0.13 (n = 2000, d = 200): an outlier
    near −0.1 whose eigenvector lies on θ_* (measured: −0.12, overlap 0.94, next eigenvalue +0.15). With y independent
    of x the same weights give no such outlier and a delocalised lowest eigenvector."""
    monkeypatch.setattr(ch2.mi, "per_sample_D",
                        lambda u, y, act: (1 - 1.5 * torch.tanh(y ** 2 / 2))[:, None, None])
    n, d, T = 2000, 200, 2
    g = torch.Generator().manual_seed(4)
    spiked = ch2.model_draw(_fake_run(n, T, True), T, n, d, "gelu", g)
    plain = ch2.model_draw(_fake_run(n, T, False), T, n, d, "gelu", g)
    assert spiked["ov"] > 0.8 and plain["ov"] < 0.1, (spiked, plain)
    assert spiked["eigs"][0] < plain["eigs"][0] - 0.15
    assert spiked["eigs"][1] - spiked["eigs"][0] > 0.15  # isolated


def test_model_draw_on_a_real_run_has_the_dmft_rank():
    """On a short DMFT run the span of (Θ_*, Θ⁰ … Θᵗ) has at most 1 + (t + 1)m dimensions, and the model's lowest
    eigenvalues are finite and ascending."""
    from grokspectra import dmft

    run = dmft.run_dmft_factored("gelu", "pr_tanh", 6.0, 2.0, 3, 1200, 2, keep=range(4), generator=0)
    o = ch2.model_draw(run, 3, 600, 100, "gelu", torch.Generator().manual_seed(0))
    assert 1 < o["rank"] <= 1 + 4 * 2
    assert np.all(np.isfinite(o["eigs"])) and np.all(np.diff(o["eigs"]) >= 0)


def _model(R=10, d=500, spread=0.002, center=None):
    B = _bulk_like(d)
    mu = B["eigs"][..., 0] if center is None else center
    z = np.linspace(-1.5, 1.5, R) / np.std(np.linspace(-1.5, 1.5, R), ddof=1)
    lam = mu[:, None, :] + spread * z[None, :, None]
    eigs = np.stack([lam, lam + 0.01, lam + 0.02], -1)
    return B, Result({"deltas": B["deltas"], "times": B["times"], "eigs": eigs, "ov": np.zeros(lam.shape),
                      "rank": np.full(lam.shape, 5)}, {"profile": "ci", "params": {"d": d, "model_reps": R}})


def _bulk_like(d=500):
    edge = np.array([[-0.09, -0.05], [-0.08, -0.04]])
    return Result({"deltas": np.array([3.0, 6.0]), "times": np.array([8, 20]),
                   "eigs": np.concatenate([edge[..., None] - 0.03, np.ones((2, 2, 9))], -1),
                   "edge_dens_dmft": edge, "hard": np.zeros((2, 2, 3))}, {"profile": "ci", "params": {"d": d}})


def test_model_test_scores_gd_as_one_more_draw():
    """GD at the model's mean scores 0; 4.5 prediction s.d. away it fails the 5 % family-wise bound (t₉ at 1 − 0.05/8 = 3.11,
    over four panels); a model drawn at another d is not compared."""
    B, Mo = _model()
    mt = ch2.model_test(B, Mo)
    assert np.allclose(mt["t"], 0) and (mt["ratio"] <= 1).all()
    assert mt["bound"] == pytest.approx(3.111, abs=0.001)  # scipy: t.ppf(1 - 0.05/8, 9)
    B2, Mo2 = _model(center=_bulk_like()["eigs"][..., 0] + 4.5 * 0.002 * math.sqrt(1.1))
    assert not (ch2.model_test(B2, Mo2)["ratio"] <= 1).all()
    assert "thin left tail" in ch2.model_sentence(B, Mo)
    t = ch2.model_table(B, Mo)
    assert len(t.splitlines()) == 6 and "nan" not in t
    _, other = _model(d=1500)
    assert not ch2.model_matches(B, other)
    with pytest.raises(ValueError, match="differ in d"):
        ch2.model_test(B, other)
