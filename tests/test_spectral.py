"""Spectral theory (grokspectra.spectral, eq. app-bulk; Mondelli–Montanari 2017) against closed forms, an independent scalar route and a
planted-spike random matrix with a known answer."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from grokspectra import spectral as sp


@pytest.fixture(autouse=True)
def one_thread():
    # tiny batched kernels: one thread avoids oversubscription on the shared 2-core machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def gh_law(n=300):
    """Gauss–Hermite nodes/weights for ζ ~ N(0, 1): expectations of smooth functions to ~1e-12."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return torch.tensor(x), torch.tensor(w / w.sum())


# ----------------------------------------------------------------------------------------------------------------
# G ≡ 1: Marchenko–Pastur with ratio 1/δ (closed form)

@pytest.mark.parametrize("delta", [2.0, 4.0])
def test_marchenko_pastur_density_and_edges(delta):
    G = torch.ones(4)
    g = 1 / delta
    a, b = (1 - math.sqrt(g)) ** 2, (1 + math.sqrt(g)) ** 2
    xs = np.linspace(a + 0.05, b - 0.05, 40)
    rho = sp.bulk_density(G, delta, xs, eps=1e-4)
    ref = sp.marchenko_pastur_density(xs, g)
    # ε-smearing error ≈ ε·|ρ''|-scale: ≤ 1e-3 at 0.05 from the edges
    assert np.max(np.abs(rho - ref)) < 1e-3
    # mass: the density integrates to one (no atom for δ > 1)
    xf = np.linspace(a, b, 2001)
    assert abs(np.trapezoid(sp.marchenko_pastur_density(xf, g), xf) - 1) < 2e-3
    assert abs(sp.real_axis_edge(G, delta) - a) < 1e-6                   # fold of the real branch: exact
    assert abs(sp.real_axis_edge(G, delta, side="right") - b) < 1e-5
    # the density route (eq. app-bulk) is biased by the smearing ε = 5e-4 by ~2e-3 (measured) on this law
    assert abs(sp.left_edge(G, delta, method="density", window=(0.0, b + 1)) - a) < 4e-3


def test_real_axis_solution_is_mp_root():
    # below the MP spectrum the real root of z s²/δ + (z − 1 + 1/δ) s + 1 = 0 with s > 0 (eq. app-bulk)
    delta = 3.0
    z = np.array([-2.0, -0.5, 0.1])
    S = sp.real_axis_S(torch.ones(4), delta, z)[:, 0, 0].numpy()
    A, B = z / delta, z - 1 + 1 / delta
    roots = (-B + np.sqrt(B ** 2 - 4 * A)) / (2 * A)
    roots2 = (-B - np.sqrt(B ** 2 - 4 * A)) / (2 * A)
    both = np.stack([roots, roots2])
    ref = np.where(both > 0, both, np.inf).min(0)      # the branch continued from z = −∞ is the smallest positive root
    assert np.allclose(S, ref, rtol=1e-10)


# ----------------------------------------------------------------------------------------------------------------
# scalar G: ψ_δ of Lu–Li / Mondelli–Montanari

def bounded_law(N=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    zeta = torch.randn(N, generator=g, dtype=torch.float64)
    xi = torch.randn(N, generator=g, dtype=torch.float64)
    return torch.tanh(1.5 - zeta ** 2) + 0.3 * torch.tanh(xi), zeta


def test_left_edge_is_max_of_psi():
    # scalar G: the left edge is ψ_δ at its stationary point λ̄ < min G (max of ψ_δ there); an independent route
    G, _ = bounded_law()
    for delta in [1.5, 4.0]:
        gmin = float(G.min())
        r = minimize_scalar(lambda t: -sp.psi_delta(G, delta, gmin - math.exp(t))[0], bounds=(-12, 6),
                            method="bounded", options={"xatol": 1e-12})
        ref = sp.psi_delta(G, delta, gmin - math.exp(r.x))[0]
        assert abs(sp.real_axis_edge(G, delta) - ref) < 1e-5
        # and the real solution maps to ψ_δ by s = −δ/λ
        z = ref - 0.3
        s = float(sp.real_axis_S(G, delta, z)[0, 0, 0])
        assert abs(sp.psi_delta(G, delta, -delta / s)[0] - z) < 1e-9


@pytest.mark.parametrize("delta", [0.7, 1.5])
def test_right_outlier_matches_lu_li(delta):
    # m = 1, G = T(y) = 1 − 1/y (Luo–Alghamdi–Lu): Φ route of eq. app-outlier vs ψ_δ = φ and Lu–Li's overlap
    zeta, w = gh_law()
    G = sp.luo_alghamdi_lu_T(zeta ** 2)
    ll = sp.lu_li_right(G, zeta, delta, weights=w)
    o = sp.outlier(G, zeta, delta, weights=w, side="right")
    assert ll["exists"] and o["exists"]
    assert abs(o["root"] - ll["root"]) < 1e-7
    assert abs(o["overlap"] - ll["overlap"]) < 1e-4
    assert abs(o["edge"] - ll["edge"]) < 3e-3 * ll["edge"]


def test_spectral_threshold_is_one_half():
    # phase retrieval, optimal preprocessing: informative outlier iff δ > δ_alg = 1/2 (Mondelli–Montanari 2017)
    zeta, w = gh_law()
    law = lambda d: (sp.luo_alghamdi_lu_T(zeta ** 2), zeta, w)
    assert sp.nn_criterion(*law(0.45)[:2], 0.45, weights=w, side="right")["crit"] > 0
    assert sp.nn_criterion(*law(0.56)[:2], 0.56, weights=w, side="right")["crit"] < 0
    res = sp.delta_nn(law, 0.3, 1.0, rtol=0.01, side="right")
    assert abs(res["delta_nn"] - 0.5) < 0.01


# ----------------------------------------------------------------------------------------------------------------
# planted spike: H = (1/n) Σ G_i ⊗ x_i x_iᵀ with G_i depending on ζ_i = ⟨x_i, θ*⟩

def G2(zeta, xi):
    g11 = torch.tanh(1.5 - zeta ** 2) + 0.3 * torch.tanh(xi[:, 0])
    g22 = 0.6 + 0.4 * torch.tanh(1.0 - zeta ** 2)
    g12 = 0.3 * torch.tanh(xi[:, 1]) + 0.2 * torch.tanh(zeta ** 2 - 1)
    return torch.stack([torch.stack([g11, g12], -1), torch.stack([g12, g22], -1)], -2)


def empirical_spike(d, delta, seeds):
    out = []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        n = int(delta * d)
        X = torch.randn(n, d, generator=g, dtype=torch.float64)
        Gi = G2(X[:, 0], torch.randn(n, 2, generator=g, dtype=torch.float64))
        H = torch.einsum("nab,nr,ns->arbs", Gi, X, X).reshape(2 * d, 2 * d) / n   # neuron-major (j, r)
        ev, V = torch.linalg.eigh(H)
        v = V[:, 0].reshape(2, d)
        out.append((float(ev[0]), float((v[:, 0] ** 2).sum()), float(ev[1])))
    return np.array(out)


def test_planted_spike_outlier_and_overlap():
    g = torch.Generator().manual_seed(11)
    N = 16000
    zeta = torch.randn(N, generator=g, dtype=torch.float64)
    G = G2(zeta, torch.randn(N, 2, generator=g, dtype=torch.float64))
    delta = 3.0
    o = sp.outlier(G, zeta, delta)
    assert o["exists"] and o["root"] < o["edge"]
    emp = empirical_spike(500, delta, seeds=[1, 2, 3]).mean(0)
    # d = 500, 3 seeds: outlier s.d. ≈ 0.03 per seed, plus an O(1/√d) finite-size shift upward (the book's checks saw the
    # same sign); overlap s.d. ≈ 0.04 per seed
    assert abs(emp[0] - o["root"]) < 0.06
    assert abs(emp[1] - o["overlap"]) < 0.08
    assert emp[2] > o["edge"] - 0.05                 # the next eigenvalue is at (or inside) the bulk edge
    # below threshold (small δ with this law) no outlier separates from the bulk
    oo = sp.outlier(G, zeta, 0.5)
    assert not oo["exists"]


# ----------------------------------------------------------------------------------------------------------------
# errors

def test_nonconvergence_raises_with_details():
    G = torch.ones(4)
    with pytest.raises(sp.ConvergenceError) as e:
        sp.real_axis_S(G, 2.0, 1.0)            # z = 1 lies inside the MP bulk [0.086, 2.91]: no real branch
    assert e.value.z == pytest.approx(1.0) and e.value.iterations > 0
    assert "did not converge" in str(e.value)
    with pytest.raises(sp.ConvergenceError) as e:
        sp.bulk_stieltjes(G, 2.0, [1.0 + 1e-3j], max_iter=0, tol=1e-300)
    assert e.value.residual > 0


def test_bad_input():
    with pytest.raises(ValueError, match="symmetric"):
        sp.as_law(torch.tensor([[[1.0, 2.0], [0.0, 1.0]]]))
    with pytest.raises(ValueError, match="shape"):
        sp.as_law(torch.ones(3, 2, 3))
    with pytest.raises(ValueError, match="Im z > 0"):
        sp.bulk_stieltjes(torch.ones(3), 2.0, [1.0])
    zeta, w = gh_law(40)
    with pytest.raises(ValueError, match="bracket"):
        sp.delta_nn(lambda d: (sp.luo_alghamdi_lu_T(zeta ** 2), zeta, w), 0.6, 1.0, side="right")


# ----------------------------------------------------------------------------------------------------------------
# the DMFT law must keep the hard overlap at exactly 0 (antithetic paths, eq. app-dmft)

def test_antithetic_law_guards_the_outlier_criterion():
    from grokspectra import dmft, multiindex as mi

    def law(antithetic):
        r = dmft.run_dmft("quad", "pr_clip", 8.0, 0.1, 30, 4000, 1, keep=[30], antithetic=antithetic, generator=3)
        lw = r["law"][30]
        G = mi.per_sample_D(lw["u"], lw["y"], "quad").double()
        return r["M"], sp.nn_criterion(G, lw["z"].double(), 8.0)["crit"]

    M_a, crit_a = law(True)
    M_p, crit_p = law(False)
    assert float(M_a.abs().max()) == 0.0                 # exact, not just small
    assert float(M_p.abs().max()) > 1e-3                 # Monte Carlo noise seeds and the dynamics amplifies it
    # the spurious overlap changes the law of G_t and with it the δ_NN criterion (measured: +0.005 vs −0.16)
    assert abs(crit_a - crit_p) > 0.02


# ----------------------------------------------------------------------------------------------------------------
# the outlier's overlap when the root lies near the end of the followed real branch

@pytest.mark.parametrize("sgn", [1.0, -1.0])
def test_slope_stays_on_the_branch_and_matches_the_derivative(sgn):
    """``_slope`` on Φ(z) = √(sgn·(end − z)) (a square-root edge at ``end``; no real value beyond it, where
    ``at`` raises, as the real-axis solver does): exact derivative −sgn/(2√dist). Far from the end the plain step
    is used; near it the step shrinks to dist/10 (relative error < 0.2 %, down to dist = 1e-10); at the end itself
    a one-sided second-order difference is taken, checked on a smooth Φ (error O(h²))."""
    end = 0.3

    def at_sqrt(z):
        if sgn * (end - z) < 0:
            raise sp.ConvergenceError(z, 1, float("nan"), "beyond the branch end")
        return torch.tensor([[math.sqrt(sgn * (end - z))]], dtype=torch.float64)

    h = 1e-4
    for dist in (1e-1, 1e-4, 1e-6, 1e-10):  # far (plain step), within the step (shrunk), deep inside the step
        r = end - sgn * dist
        got = float(sp._slope(at_sqrt, at_sqrt(r), r, h, dist, sgn))
        want = -sgn / (2 * math.sqrt(dist))
        assert got == pytest.approx(want, rel=2e-3 if dist < 10 * h else 1e-6)

    def at_exp(z):  # smooth, defined only on the far side of r0 (the root is the branch's end)
        if sgn * (r0 - z) < -1e-15:
            raise sp.ConvergenceError(z, 1, float("nan"), "beyond the branch end")
        return torch.tensor([[math.exp(z)]], dtype=torch.float64)

    r0 = -0.2
    got = float(sp._slope(at_exp, at_exp(r0), r0, 1e-3, 0.0, sgn))
    assert got == pytest.approx(math.exp(r0), rel=1e-5)  # one-sided, second order: error ≈ h²/3 = 3e-7


def test_outlier_at_the_branch_end_of_a_gd_law():
    """Regression: the empirical law of the weights of one GD run (Quad m = 1, y = min(z², 6), d = 2000, δ = 8,
    step 30; seed 15 of a 24-seed rerun of chapter 3's outlier comparison) whose outlier lies 1e-5 inside the end of
    the real branch, less than the finite-difference step (5e-5): the point towards the bulk left the branch and the
    solver raised. The overlap is now taken with a step shrunk to stay on the branch, and agrees with a step 1000
    times smaller (0.2 %); an outlier this close to the edge carries almost no overlap."""
    d = np.load(Path(__file__).parent / "data" / "branch_end_law.npz")
    G, zeta, delta = torch.tensor(d["G"]), torch.tensor(d["zeta"]), float(d["delta"])
    o = sp.outlier(G, zeta, delta)
    assert o["exists"] and not o["spurious"] and o["root"] < o["edge"] and o["edge"] - o["root"] < 1e-4
    fine = sp.outlier(G, zeta, delta, fd_step=1e-8)
    assert fine["root"] == o["root"] and o["overlap"] == pytest.approx(fine["overlap"], rel=2e-3)
    assert 0 < o["overlap"] < 0.01
