"""Tests of the multi-index engine: closed-form F, D and gradients against autograd, the batched GD engine against an
unbatched autograd loop, the latent-space test risk against a d-dimensional fresh test set."""

import math

import pytest
import torch
from torch.func import grad, hessian

from grokspectra import multiindex as mi

F64 = torch.float64


@pytest.mark.parametrize("name", sorted(mi.ACTIVATIONS))
def test_activation_derivatives_match_autograd(name):
    s0, s1, s2 = mi.activation(name)
    u = torch.linspace(-3, 3, 61, dtype=F64)
    u = u[u.abs() > 1e-3]  # ReLU's kink
    d1 = torch.vmap(grad(lambda x: s0(x)))(u)
    d2 = torch.vmap(grad(grad(lambda x: s0(x))))(u)
    assert torch.allclose(s1(u), d1, atol=1e-12)
    assert torch.allclose(s2(u), d2, atol=1e-12)


@pytest.mark.parametrize("act", ["gelu", "quad", "tanh", "relu"])
@pytest.mark.parametrize("loss", ["square", "logcosh"])
def test_F_and_D_are_gradient_and_hessian_of_L(act, loss):
    g = torch.Generator().manual_seed(1)
    m = 3
    u = torch.randn(7, m, generator=g, dtype=F64)
    y = torch.randn(7, generator=g, dtype=F64) ** 2
    a = torch.randn(m, generator=g, dtype=F64)
    b = 0.3 * torch.randn(m, generator=g, dtype=F64)
    L = lambda uu, yy: mi.per_sample_loss(uu, yy, act, a, b, loss)
    F_ad = torch.vmap(grad(L))(u, y)
    D_ad = torch.vmap(hessian(L))(u, y)
    assert torch.allclose(mi.per_sample_F(u, y, act, a, b, loss), F_ad, atol=1e-12)
    assert torch.allclose(mi.per_sample_D(u, y, act, a, b, loss), D_ad, atol=1e-12)
    F2, L2 = mi.per_sample_F_and_loss(u, y, act, a, b, loss)
    assert torch.allclose(F2, F_ad, atol=1e-12) and torch.allclose(L2, L(u, y), atol=1e-14)


def test_links_values_and_errors():
    z = torch.tensor([[0.5, -2.0], [3.0, 1.0]], dtype=F64)
    assert torch.allclose(mi.link("staircase")(z), torch.tensor([4.5, 4.0], dtype=F64))
    assert mi.link("staircase").hard == (1,) and mi.link("pr").hard == (0,)
    assert torch.allclose(mi.link("pr_clip", c=4.0)(z[:, :1]), torch.tensor([0.25, 4.0], dtype=F64))
    assert torch.allclose(mi.link("pr_tanh")(z[:, :1]), torch.tanh(z[:, 0] ** 2))
    cu = mi.link(lambda zz: zz.sum(-1), k=2)
    assert cu.hard == (0, 1) and torch.allclose(cu(z), z.sum(-1))
    with pytest.raises(ValueError, match="unknown link"):
        mi.link("nope")
    with pytest.raises(ValueError, match="latent dimension"):
        mi.link("pr")(z)
    with pytest.raises(ValueError, match="unknown activation"):
        mi.activation("softplus")
    with pytest.raises(ValueError, match="latent dimension"):
        mi.sample_problem(10, 20, 2, "pr")


def _risk(Th, X, y, act, lam):
    return mi.per_sample_loss(X @ Th, y, act).mean() + 0.5 * lam * (Th ** 2).sum()


def test_batched_gd_matches_unbatched_autograd_loop():
    """Groups of different n and several trials advance together; each trajectory must equal a plain single-problem
    GD whose gradient comes from autograd (float64: agreement to rounding)."""
    eta, lam, T, m = 1.5, 0.05, 6, 2
    prob = mi.sample_problem(20, [30, 55], 2, "staircase", trials=3, dtype=F64, generator=3)
    Theta0 = [mi.init_theta(Ts, m, generator=torch.Generator().manual_seed(5 + i)) for i, Ts in enumerate(prob.Theta_star)]
    out = mi.run_gd(prob, m, eta, T, act="gelu", lam=lam, Theta0=Theta0, keep=(3,), return_theta=True)
    assert out["M"].shape == (2, 3, T + 1, 2, m) and out["Q"].shape == (2, 3, T + 1, m, m)
    for gi in range(2):
        for tr in range(3):
            X, y, Ts = prob.X[gi][tr], prob.y[gi][tr], prob.Theta_star[gi][tr]
            Th = Theta0[gi][tr].clone()
            for t in range(T + 1):
                assert torch.allclose(out["M"][gi, tr, t], Ts.T @ Th, atol=1e-12)
                assert torch.allclose(out["Q"][gi, tr, t], Th.T @ Th, atol=1e-12)
                assert math.isclose(out["train"][gi, tr, t].item(), mi.per_sample_loss(X @ Th, y, "gelu").mean().item(),
                                    rel_tol=1e-12)
                if t == 3:
                    assert torch.allclose(out["theta"][3][gi][tr], Th, atol=1e-12)
                if t < T:
                    Th = Th - eta * grad(_risk)(Th, X, y, "gelu", lam)
            assert torch.allclose(out["theta"][T][gi][tr], Th, atol=1e-12)


def test_latent_test_risk_matches_a_fresh_test_set():
    """risk_from_overlaps (exact Gaussian law of (Θ_*ᵀx, Θᵀx)) vs the empirical risk on 20000 fresh x ∈ R^d: the two
    estimators are independent, so their difference must be within 5 combined standard errors."""
    g = torch.Generator().manual_seed(11)
    d, m, k = 40, 2, 1
    Ts = mi.random_orthonormal(1, d, k, device="cpu", dtype=F64, generator=g)[0]
    Th = torch.randn(d, m, generator=g, dtype=F64) / math.sqrt(d) + Ts @ torch.tensor([[0.8, -0.4]], dtype=F64)
    Xt = torch.randn(20000, d, generator=g, dtype=F64)
    L1 = mi.per_sample_loss(Xt @ Th, mi.link("pr_clip")(Xt @ Ts), "gelu")
    z, xi, y = mi.fresh_latents(k, m, 20000, "pr_clip", device="cpu", dtype=F64, generator=g)
    M, Q = Ts.T @ Th, Th.T @ Th
    r2 = mi.risk_from_overlaps(M, Q, z, xi, y, "gelu")
    u = z @ M + xi @ torch.linalg.cholesky(Q - M.T @ M).T  # another square root of Q − MᵀM: same law
    L2 = mi.per_sample_loss(u, y, "gelu")
    assert abs(r2.item() - L2.mean().item()) < 5 * math.sqrt(2 * L2.var().item() / 20000)
    se = math.sqrt(L1.var().item() / 20000 + L2.var().item() / 20000)
    assert abs(L1.mean().item() - r2.item()) < 5 * se


def test_warm_init_has_requested_overlaps():
    """Θ_0 = Θ_* M0 + Θ_⊥ with Θ_⊥ ⟂ Θ_*: M is exact, Q − MᵀM = Q0 up to O(d^{-1/2}) sampling error."""
    prob = mi.sample_problem(4000, 10, 1, "pr", trials=4, dtype=F64, generator=2)
    M0, Q0 = torch.tensor([[0.5, 0.3]], dtype=F64), torch.tensor([[1.0, 0.2], [0.2, 0.7]], dtype=F64)
    Th = mi.init_theta(prob.Theta_star[0], 2, M0=M0, Q0=Q0, generator=torch.Generator().manual_seed(0))
    M = prob.Theta_star[0].transpose(1, 2) @ Th
    Qp = Th.transpose(1, 2) @ Th - M.transpose(1, 2) @ M
    assert torch.allclose(M, M0.expand(4, 1, 2), atol=1e-12)
    assert (Qp - Q0).abs().max() < 6 / math.sqrt(4000)  # entries have sd ≤ √2/√d
    R = mi.init_theta(prob.Theta_star[0], 3, generator=torch.Generator().manual_seed(1))
    assert (R.transpose(1, 2) @ R - torch.eye(3, dtype=F64)).abs().max() < 6 / math.sqrt(4000)


def test_spectral_direction_matches_dense_eigh():
    """Matrix-free shifted power iteration vs torch.linalg.eigh of the explicit (1/n) Σ T(y) x xᵀ on the same sample."""
    g = torch.Generator().manual_seed(4)
    prob = mi.sample_problem(30, 10, 1, "pr", trials=2, dtype=F64, generator=g)
    pre = lambda y: torch.clamp(y, max=6.0) - 1.0
    gs = torch.Generator().manual_seed(9)
    v = mi.spectral_direction(prob.Theta_star[0], "pr", 900, pre, iters=150, generator=gs)
    gs = torch.Generator().manual_seed(9)  # replay the same independent sample
    X = torch.randn(2, 900, 30, generator=gs, dtype=F64)
    Tn = pre(mi.link("pr")(X @ prob.Theta_star[0]))
    w, V = torch.linalg.eigh(X.transpose(1, 2) @ (Tn[..., None] * X) / 900)
    assert ((V[..., -1] * v).sum(-1).abs() > 1 - 1e-6).all()
    assert ((prob.Theta_star[0][..., 0] * v).sum(-1).abs() > 0.8).all()  # δ = 30: strong weak recovery


def test_shared_data_gd_matches_one_run_per_student_and_size():
    """``run_gd_shared`` (all students and nested sample sizes in one d × C matrix, products split where the sizes
    end) is, for each (student, n), :func:`run_gd` on the first n rows from the same start: equal to float64
    rounding, with a ridge term, in any order of the sizes."""
    dt = torch.float64
    d, ns, B, T = 40, [120, 200, 80], 3, 30
    prob = mi.sample_problem(d, 200, 1, "pr_clip", trials=B, dtype=dt, generator=5)
    studs = [("quad", 1, 0.1), ("gelu", 2, 2.0)]
    th0 = [mi.init_theta(prob.Theta_star[0], m, generator=7 + m) for _, m, _ in studs]
    outs = mi.run_gd_shared(prob, ns, studs, T, Theta0=th0, lam=0.01, test_at=[0, T], diverged="mark", generator=1)
    for s, (act, m, eta) in enumerate(studs):
        assert outs[s]["test"].shape == (len(ns), B, 2) and outs[s]["diverged_at"].eq(-1).all()
        for g, n in enumerate(ns):
            sub = mi.Problem(d, [n], 1, prob.link, [prob.X[0][:, :n].contiguous()], [prob.y[0][:, :n]],
                             prob.Theta_star, True)
            ref = mi.run_gd(sub, m, eta, T, act=act, Theta0=th0[s], lam=0.01, generator=1)
            for key in ("M", "Q", "train"):
                torch.testing.assert_close(outs[s][key][g], ref[key], rtol=1e-10, atol=1e-12)


def test_shared_data_gd_isolates_a_diverging_student():
    """A student whose step size blows up is marked diverged at every size, and the other student's runs are those
    it has alone (its columns never mix with the diverged ones)."""
    prob = mi.sample_problem(30, 150, 1, "pr_clip", trials=2, generator=3)
    studs = [("quad", 1, 1000.0), ("quad", 1, 0.1)]
    th = [mi.init_theta(prob.Theta_star[0], 1, generator=g) for g in (8, 9)]
    both = mi.run_gd_shared(prob, [90, 150], studs, 40, Theta0=th, diverged="mark", generator=2)
    alone = mi.run_gd_shared(prob, [90, 150], studs[1:], 40, Theta0=th[1:], diverged="mark", generator=2)
    assert (both[0]["diverged_at"] >= 0).all() and (both[1]["diverged_at"] == -1).all()
    for key in ("M", "Q", "train"):
        torch.testing.assert_close(both[1][key], alone[0][key], rtol=1e-5, atol=1e-6)
    with pytest.raises(mi.DivergenceError, match="diverged at step"):
        mi.run_gd_shared(prob, [90, 150], studs, 40, generator=2)
    with pytest.raises(ValueError, match="ns must be"):
        mi.run_gd_shared(prob, [90, 151], studs, 5, generator=2)
