"""Tests of the transition-analysis helpers (grokspectra.transitions) used by chapters 4 and 5.

Each fit is checked against a closed form, a second method (direct likelihood maximisation, an explicit loop,
GD on a quadratic) or its own stated statistical accuracy on synthetic data with known truth.
"""

import math

import numpy as np
import pytest
from scipy import optimize, stats

from grokspectra import transitions as tr


def test_wilson_interval_matches_scipy():
    for k, n in [(0, 4), (3, 4), (7, 20), (20, 20), (137, 400)]:
        lo, hi = tr.wilson_interval(k, n)
        ci = stats.binomtest(k, n).proportion_ci(method="wilson")
        assert abs(lo - ci.low) < 1e-12 and abs(hi - ci.high) < 1e-12
    with pytest.raises(ValueError):
        tr.wilson_interval(5, 4)


def test_plain_logistic_fit_equals_direct_likelihood_maximum():
    # second method: minimise the binomial negative log-likelihood in (loc, log width) with Nelder-Mead
    x = np.array([3.0, 4, 5, 6, 7, 8])
    n = np.array([10, 10, 10, 10, 10, 10])
    k = np.array([0, 1, 3, 6, 9, 10])

    def nll(q):
        p = np.clip(tr.logistic(x, q[0], math.exp(q[1])), 1e-300, 1 - 1e-16)
        return -np.sum(k * np.log(p) + (n - k) * np.log1p(-p))

    ref = optimize.minimize(nll, [5.0, 0.0], method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12,
                                                                             "maxiter": 10000})
    fit = tr.fit_success_curve(x, k, n, firth=False)
    assert abs(fit.loc - ref.x[0]) < 1e-5 and abs(fit.width - math.exp(ref.x[1])) < 1e-5
    # Firth's correction moves the estimate by O(1/n), here less than one standard error
    ff = tr.fit_success_curve(x, k, n)
    assert abs(ff.loc - fit.loc) < fit.loc_se


def test_success_fit_recovers_truth_with_calibrated_errors():
    rng = np.random.default_rng(0)
    x = np.linspace(4.0, 7.0, 9)
    n = np.full(9, 200)
    locs, ses = [], []
    for _ in range(300):
        k = rng.binomial(n, tr.logistic(x, 5.5, 0.4))
        f = tr.fit_success_curve(x, k, n)
        locs.append(f.loc)
        ses.append(f.loc_se)
    locs, ses = np.array(locs), np.array(ses)
    # bias: the mean of 300 estimates has standard error ~ sd/sqrt(300); allow 4 of them
    assert abs(locs.mean() - 5.5) < 4 * locs.std() / math.sqrt(300)
    # the reported standard error matches the spread (the sd of 300 draws is known to ~4%; allow 15%)
    assert abs(ses.mean() / locs.std() - 1) < 0.15


def test_firth_fit_is_finite_and_symmetric_on_separated_data():
    x = np.array([3.0, 4, 5, 6])
    k = np.array([0, 0, 4, 4])
    n = np.array([4, 4, 4, 4])
    f = tr.fit_success_curve(x, k, n)
    assert abs(f.loc - 4.5) < 1e-8  # the design is symmetric about 4.5
    assert 0 < f.width < 1
    with pytest.raises(tr.FitError):
        tr.fit_success_curve(x, k, n, firth=False)
    with pytest.raises(ValueError, match="bracket"):
        tr.fit_success_curve(x, np.zeros(4), n)
    with pytest.raises(tr.FitError, match="decreases"):
        tr.fit_success_curve(x, k[::-1], n)


def test_finite_size_fit_exact_and_coverage():
    d = np.array([250.0, 500, 1000, 2000, 4000])
    f = tr.fit_finite_size(d, 5.0 + 7.0 / np.log(d))
    assert abs(f.limit - 5.0) < 1e-10 and abs(f.slope - 7.0) < 1e-9
    g = tr.fit_finite_size(d, 2.0 + 3.0 * d**-0.5, form="inv_sqrt")
    assert abs(g.limit - 2.0) < 1e-10
    # with known noise levels, the 95% interval covers the truth 95% of the time (400 draws: sd 1.1%)
    rng = np.random.default_rng(1)
    se = np.array([0.3, 0.25, 0.2, 0.2, 0.15])
    cover = 0
    for _ in range(400):
        v = 5.0 + 7.0 / np.log(d) + se * rng.standard_normal(5)
        h = tr.fit_finite_size(d, v, se)
        cover += abs(h.limit - 5.0) < 1.959964 * h.limit_se
    assert 0.91 < cover / 400 < 0.99


def test_power_law_fit_exact():
    x = np.array([1.0, 2, 4, 8])
    c, p, p_se = tr.fit_power_law(x, 3.0 * x**-0.7)
    assert abs(c - 3.0) < 1e-12 and abs(p + 0.7) < 1e-12 and p_se < 1e-10


def _first_crossing_loop(t, y, level, direction):
    out = np.full(y.shape[0], np.nan)
    for r in range(y.shape[0]):
        for i in range(len(t)):
            past = y[r, i] >= level if direction == "up" else y[r, i] <= level
            if past:
                if i == 0:
                    out[r] = t[0]
                else:
                    out[r] = t[i - 1] + (level - y[r, i - 1]) / (y[r, i] - y[r, i - 1]) * (t[i] - t[i - 1])
                break
    return out


def test_first_crossing_closed_form_and_loop():
    t = np.linspace(0, 50, 5001)
    tau = np.array([2.0, 5.0, 9.0])
    y = np.exp(-t[None, :] / tau[:, None])
    got = tr.first_crossing(t, y, 0.3, direction="down")
    # linear interpolation on a grid of step h = 0.01 errs by < h^2 max|y''| / (8 |y'|) ~ 1e-5 here
    assert np.allclose(got, tau * math.log(1 / 0.3), atol=1e-4)
    rng = np.random.default_rng(2)
    noisy = rng.standard_normal((20, 60)).cumsum(-1)
    tt = np.arange(60.0)
    for direction, level in [("up", 3.0), ("down", -2.0)]:
        a = tr.first_crossing(tt, noisy, level, direction=direction)
        b = _first_crossing_loop(tt, noisy, level, direction)
        assert np.array_equal(np.isnan(a), np.isnan(b)) and np.allclose(a[~np.isnan(a)], b[~np.isnan(b)])
    never = tr.first_crossing(t, y, 2.0, direction="up")
    assert np.all(np.isnan(never))
    # ``after``: a curve that starts above the level and dips below only counts the later crossing
    yy = np.array([[1.0, 0.2, 0.8, 0.1]])
    assert tr.first_crossing(np.arange(4.0), yy, 0.5, direction="down")[0] == pytest.approx(0.625)
    assert tr.first_crossing(np.arange(4.0), yy, 0.5, direction="down", after=2)[0] == pytest.approx(2 + 3 / 7)


def test_escape_time_and_growth_rate_match_gd_on_a_quadratic():
    # GD v <- v - eta H v on a quadratic whose Hessian has one negative eigenvalue lam along e_0: the overlap
    # with e_0 grows by (1 + eta|lam|) per step (chapter 5), which is what predicted_escape_time inverts
    d, eta, lam = 50, 0.1, -0.8
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    evals = np.concatenate([[lam], rng.uniform(0.1, 2.0, d - 1)])
    H = (Q * evals) @ Q.T
    v = rng.standard_normal(d) / math.sqrt(d)
    m0 = abs(Q[:, 0] @ v)
    traj = []
    for _ in range(200):
        traj.append(abs(Q[:, 0] @ v))
        v = v - eta * H @ v
    traj = np.array(traj)
    t = np.arange(200.0)
    t_meas = tr.first_crossing(t, traj, 0.5)
    t_pred = tr.predicted_escape_time(lam, eta, m0, 0.5)
    assert abs(t_meas - t_pred) < 1.0  # geometric growth, linearly interpolated between integer steps
    assert abs(tr.growth_rate(t, traj, 10, 100) - math.log1p(eta * abs(lam))) < 1e-10
    assert np.isinf(tr.predicted_escape_time(0.3, eta, m0))
    # small eta|lam|: t ~ log(d)/(2 eta |lam|) for m0 = d^-1/2 and target 1
    dd = 1e6
    assert tr.predicted_escape_time(-0.01, 0.1, dd**-0.5, 1.0) == pytest.approx(math.log(dd) / (2 * 0.001), rel=1e-3)


def test_divergence_fit_recovers_threshold():
    delta = np.array([5.5, 6.0, 7.0, 8.0, 10.0, 12.0])
    t = 40.0 * (delta - 5.0) ** -1.0
    f = tr.fit_divergence(delta, t)
    assert abs(f.delta_c - 5.0) < 1e-5 and abs(f.exponent - 1.0) < 1e-5 and abs(f.amplitude - 40) < 1e-3
    fixed = tr.fit_divergence(delta, t, delta_c=5.0)
    assert abs(fixed.exponent - 1.0) < 1e-10
    both = tr.fit_divergence(delta, t, delta_c=5.0, exponent=1.0)
    assert abs(both.amplitude - 40.0) < 1e-10
    # 5% multiplicative noise: the fitted threshold lies within 3 of its reported standard errors
    rng = np.random.default_rng(4)
    g = tr.fit_divergence(delta, t * np.exp(0.05 * rng.standard_normal(6)))
    assert abs(g.delta_c - 5.0) < 3 * g.delta_c_se + 1e-9
    with pytest.raises(ValueError):
        tr.fit_divergence(delta, t, delta_c=6.0)


def test_binomial_consistency():
    assert tr.binomial_consistent(3, 4, 3, 4)[0]
    assert not tr.binomial_consistent(0, 20, 20, 20)[0]


# ---------------------------------------------------------------------------------------------------------------
# chapter 4 / 5 helpers

import torch  # noqa: E402

from grokspectra import multiindex as mi  # noqa: E402
from grokspectra import spectral as sp  # noqa: E402
from grokspectra.experiments import ch4, ch5  # noqa: E402
from grokspectra import experiments as ex  # noqa: E402
from grokspectra.params import load_profile  # noqa: E402
from grokspectra.params import ParamError  # noqa: E402


def test_delta_alg_closed_forms_and_monte_carlo():
    assert ch4.delta_alg("pr") == 0.5
    assert abs(ch4.delta_alg("pr_clip", 60.0) - 0.5) < 1e-9  # the clip is never hit in practice
    # Monte Carlo of 1/δ_alg = E[(E[z²|y] − 1)²] for y = min(z², 6): E[z²|y] = y below the clip, and the
    # empirical mean of z² over the clipped samples on the atom
    rng = np.random.default_rng(5)
    z2 = rng.standard_normal(4_000_000) ** 2
    c = 6.0
    atom = z2 >= c
    cond = np.where(atom, z2[atom].mean(), z2)
    vals = (cond - 1) ** 2
    inv_mc, se = vals.mean(), vals.std() / math.sqrt(vals.size)
    assert abs(1 / ch4.delta_alg("pr_clip", c) - inv_mc) < 4 * se + 1e-3
    with pytest.raises(ValueError):
        ch4.delta_alg("staircase")


def test_parse_student():
    assert tr.parse_student("gelu:2:2.0") == ("gelu", 2, 2.0)
    for bad in ("gelu:2", "swish:1:0.1", "quad:0:0.1", "quad:1:-1"):
        with pytest.raises(ParamError):
            tr.parse_student(bad)


def test_hard_cos_closed_form():
    d, m = 30, 3
    g = torch.Generator().manual_seed(0)
    ts = torch.linalg.qr(torch.randn(d, 1, generator=g, dtype=torch.float64))[0]
    Th = torch.randn(d, m, generator=g, dtype=torch.float64)
    c = tr.hard_cos(ts.T @ Th, Th.T @ Th)
    ref = max(abs(float(ts[:, 0] @ Th[:, j])) / float(Th[:, j].norm()) for j in range(m))
    assert abs(float(c) - ref) < 1e-12


def test_dense_spectral_estimator_matches_power_iteration():
    # same generator state → same data; a clear spectral gap at δ = 6 makes 400 power iterations converge
    d, n, trials = 60, 360, 3
    lk = mi.link("pr_clip", c=6.0)
    Ts = mi.random_orthonormal(trials, d, 1, device="cpu", dtype=torch.float64,
                               generator=torch.Generator().manual_seed(1))
    pre = lambda y: sp.mondelli_montanari_T(y, n / d)  # noqa: E731
    v1 = ch4.spectral_dense(Ts, lk, n, pre, generator=torch.Generator().manual_seed(7))
    v2 = mi.spectral_direction(Ts, lk, n, pre, iters=400, generator=torch.Generator().manual_seed(7))
    assert torch.all((v1 * v2).sum(-1).abs() > 0.999)


def test_linearised_crossing():
    assert ch4.linearised_crossing([3, 4, 5, 6], [-0.01, 0.0, 0.01, 0.02], 0.005) == pytest.approx(4.5)
    assert math.isnan(ch4.linearised_crossing([3, 4], [0.0, 0.001], 0.005))
    assert ch4.linearised_crossing([3, 4], [0.01, 0.02], 0.005) == -math.inf


def test_snapshot_spectrum_matches_autograd_hessian():
    # λ_min, the eigenvector's weight on θ_* and Θ's component along it, against torch.autograd on the empirical risk
    d, n, trials = 10, 40, 2
    prob = mi.sample_problem(d, n, 1, mi.link("pr_clip", c=6.0), trials=trials, dtype=torch.float64, generator=3)
    Th = torch.randn(trials, d, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) / math.sqrt(d)
    snap = ch5.snapshot_spectrum(Th, prob.X[0], prob.y[0], prob.Theta_star[0], "quad")
    for r in range(trials):
        X, y = prob.X[0][r], prob.y[0][r]

        def risk(th):
            return mi.per_sample_loss((X @ th)[:, None], y, "quad").mean()

        H = torch.autograd.functional.hessian(risk, Th[r, :, 0])
        w, V = torch.linalg.eigh(H)
        v = V[:, 0]
        assert abs(snap["lam"][r] - float(w[0])) < 1e-10
        assert abs(snap["lam2"][r] - float(w[1])) < 1e-10
        assert abs(snap["ov"][r] - float((prob.Theta_star[0][r, :, 0] @ v) ** 2)) < 1e-8
        assert abs(snap["mv"][r] - abs(float(v @ Th[r, :, 0])) / float(Th[r].norm())) < 1e-8


def test_predicted_escape_formula():
    # m0 = sqrt(ov)·mv; t0 + log(τ/m0)/log(1 + η|λ|), infinite for λ ≥ 0
    t = ch5.predicted_escape(40.0, np.array([-0.5, 0.2]), np.array([0.04, 0.04]), np.array([0.05, 0.05]), 0.1, 0.5)
    assert t[0] == pytest.approx(40 + math.log(0.5 / (0.2 * 0.05)) / math.log(1.05))
    assert np.isinf(t[1])


def test_settled_criterion():
    t = np.arange(0, 101)
    x = np.stack([1 + np.exp(-t / 5.0), 1 + 1 / (1 + t)])  # settles / drifts like 1/t
    s = tr.settled(t, x, lag=20, tol=1e-3)
    assert s["change"][0] < 1e-6 and abs(s["change"][1] - (1 / 81 - 1 / 101)) < 1e-12
    assert not s["settled"]  # the 1/t drift (2.4e-3) exceeds the tolerance
    assert tr.settled(t, x[0], lag=20, tol=1e-3)["settled"]
    assert not tr.settled(t, np.full(101, np.nan), lag=20, tol=1.0)["settled"]
    with pytest.raises(ValueError):
        tr.settled(t[::7], x[:, ::7], lag=20, tol=1e-3)  # no recorded step at T - lag


def _noisy_line(root, sigma):
    """c(δ) = δ − root + σ ξ/√n, ξ ~ N(0,1) fixed by (δ, n, rep): a reproducible Monte-Carlo criterion."""
    calls = []

    def crit(d, n, rep):
        calls.append(n)
        g = np.random.default_rng([int(round(d * 1e9)), n, rep])
        return d - root + sigma * g.standard_normal() / math.sqrt(n)

    return crit, calls


def test_noisy_bisect_reaches_tolerance_when_noise_is_small():
    crit, calls = _noisy_line(5.3, sigma=1.0)
    r = tr.noisy_bisect(crit, 2.0, 16.0, rtol=0.02, n0=1000, n_max=64000, reps=4, z=3.0)
    assert r["limited_by"] == "tolerance"
    assert r["hi"] / r["lo"] - 1 < 0.02 and r["lo"] <= 5.3 <= r["hi"]
    # the root's Monte-Carlo spread: se of the mean ≈ σ/√(n reps) at slope 1, with n the final paths
    assert r["root_mc_se"] < 0.5 * (r["hi"] - r["lo"])
    # near the root the sign is undecided at n0, so the paths were increased there
    assert max(calls) > 1000


def test_noisy_bisect_stops_and_says_so_when_noise_limits():
    crit, calls = _noisy_line(5.3, sigma=60.0)
    r = tr.noisy_bisect(crit, 2.0, 16.0, rtol=0.01, n0=1000, n_max=4000, reps=4, z=3.0)
    assert r["limited_by"] == "noise"
    assert r["hi"] / r["lo"] - 1 > 0.01 and max(calls) <= 4000
    # the bracket is still honest: every decided sign was decided by ≥ 3 s.e., so the truth lies inside
    assert r["lo"] <= 5.3 <= r["hi"]
    # the root's Monte-Carlo spread, σ/√(n reps)/slope ≈ 0.47 at n = 4000, is reported
    assert 0.2 < r["root_mc_se"] < 1.5
    # an end undecided at n_max: the initial bracket comes back, noise-limited
    r = tr.noisy_bisect(crit, 5.0, 16.0, n0=1000, n_max=2000, reps=4, z=3.0)
    assert (r["lo"], r["hi"], r["limited_by"]) == (5.0, 16.0, "noise") and r["root_mc_se"] == math.inf
    crit_small, _ = _noisy_line(5.3, sigma=1.0)
    with pytest.raises(ValueError, match="bracket"):
        tr.noisy_bisect(crit_small, 6.0, 16.0, n0=1000, n_max=4000, reps=4)


def test_sweep_unit_counts_diverged_trials_as_failures():
    """A unit in which one student's step size makes GD blow up returns, marks that student's runs diverged at
    every δ and counts none a success; the other student's runs, on the same data, are not marked."""
    u = {"link": "pr_clip", "clip": 6.0, "d": 30, "deltas": [3.0, 4.0], "trials": 2, "T": 40, "threshold": 0.5,
         "n_test": 256, "dtype": "float32", "seed": 3, "students": ["quad:1:1000", "quad:1:0.1"]}
    r = ch4.sweep.fn(u, torch.device("cpu"))
    assert r["cos_final"].shape == (2, 2, 2) and r["cos_tr"].shape[:3] == (2, 2, 2)
    assert r["diverged"][0].all() and not r["diverged"][1].any()
    assert not np.any(np.nan_to_num(r["cos_final"][0], nan=0.0) >= 0.5)


def test_sweep_units_fit_in_memory_and_cover_every_seed():
    """The paper profile's units hold at most UNIT_ELEMENTS data floats each (one seed per unit at d = 4000) and
    together every (d, seed) exactly once, with distinct seeds."""
    e = ex.find("ch4.sweep")
    p = e.params(e.schema.validate(load_profile("paper", e.section)))
    us = e.units(p)
    for u in us:
        assert u["trials"] * round(max(u["deltas"]) * u["d"]) * u["d"] <= ch4.UNIT_ELEMENTS
    for d in p["d_list"]:
        assert sum(u["trials"] for u in us if u["d"] == d) == p["seeds"]
    assert len({u["seed"] for u in us}) == len(us)


def test_bootstrap_over_seeds_gives_the_spread_of_the_fitted_location():
    """With nested data each seed has its own threshold δ*_s and succeeds at every δ ≥ δ*_s, so the points of a
    success curve are correlated. Over 100 simulated sweeps of 16 seeds (δ*_s ~ N(6, 1.5²)) the seed bootstrap's
    mean s.e. matches the actual spread of the fitted location (within 20 %: the spread of 100 fits is known to
    ≈ 7 %), while the binomial Fisher s.e., which assumes independent points, is too small by about a third."""
    x = np.array([3, 4, 5, 6, 7, 8, 10, 12, 16.0])
    rng = np.random.default_rng(0)
    locs, boot, fisher = [], [], []
    for e in range(100):
        succ = x[:, None] >= rng.normal(6.0, 1.5, 16)[None, :]
        f = ch4.fit_or_nan(x, succ.sum(1), np.full(len(x), 16))
        locs.append(f.loc)
        fisher.append(f.loc_se)
        boot.append(ch4.bootstrap_fit_se(x, succ, reps=100, seed=e)[0])
    sd = np.std(locs, ddof=1)
    assert abs(np.mean(boot) / sd - 1) < 0.2
    assert np.nanmean(fisher) / sd < 0.8

def test_spectral_curve_is_matched_to_the_sweep_by_d():
    """analyse_sweep pairs the spectral method's rows with the sweep's by the value of d (the two results may come
    from different profiles): a shared d gets its fit, a d the spectral curve lacks gets nan, never a neighbour's."""
    from grokspectra.store import Result

    rng = np.random.default_rng(1)
    x = np.array([3.0, 5.0, 7.0, 9.0])
    res = {"cos_final": rng.random((1, 2, 4, 8)) * (x[None, None, :, None] / 9.0), "deltas": x,
           "d_list": np.array([400, 1000])}
    spec = Result({"cos": np.stack([np.tile((np.array([0.5, 1, 1.5, 2.0]) > c)[:, None], 8) * 1.0
                                    for c in (0.7, 1.2)]), "deltas": np.array([0.5, 1, 1.5, 2.0])},
                  {"params": {"d_list": [200, 400]}})
    A = ch4.analyse_sweep(res, 0.5, spec)
    assert np.isfinite(A["k_spec"][0]).all() and np.isnan(A["k_spec"][1]).all()
    assert A["k_spec"][0].tolist() == [0, 0, 8, 8]  # the d = 400 row of the spectral curve, not its first (d = 200)
    assert np.isnan(A["loc_spec"][1])


def test_settle_check_and_sentence_on_known_paths():
    """ch3.settle_check on synthetic DMFT output: a λ whose Q_⊥ and train risk stop moving and whose edge is ≥ 0
    settles; one whose Q_⊥ drifts and whose edge is below zero beyond 2 s.e. does not. The sentence names the
    failing parts."""
    from grokspectra.experiments import ch3
    from grokspectra.store import Result

    T = 160
    t = np.arange(T + 1)
    Q = np.stack([np.stack([1 + np.exp(-t / 5.0)] * 2), np.stack([1 + t / T] * 2)])  # [λ, rep, T+1]
    train = np.stack([np.stack([0.5 + np.exp(-t / 5.0)] * 2)] * 2)
    edge = np.zeros((2, 2, 3))
    edge[0, :, -1] = [0.01, 0.02]
    edge[1, :, -1] = [-0.41, -0.40]
    S = Result({"lams": np.array([0.0, 1.0]), "times": np.array([80, 120, 160]), "Qperp": Q, "train": train,
                "edge": edge}, {"profile": "paper", "params": {"settle_lag": 40}})
    rows = ch3.settle_check(S, 40, 0.01)
    assert rows[0]["settled"] and rows[0]["edge_ok"]
    assert not rows[1]["settled"] and not rows[1]["edge_ok"]
    s = ch3.settle_sentence(rows, 0.01, 40, T)
    assert "λ = 0 the first phase settles" in s and "λ = 1 the first phase does not settle" in s
    assert "$Q_\\perp$ still moves by 0.250" in s and "the edge is -0.405" in s


def test_budget_check_tells_stuck_from_slow_runs():
    """Four runs at one (student, d, δ) with T = 1000 and d = 400 (random level 3/√d = 0.15): an early success, a
    success crossing at step 700, a failed run whose overlap triples in the second half (slow: counted growing)
    and a failed run flat at 0.3 (stuck). A failed run that doubles but stays below the random level is not
    counted. The sentence names the detection limit 2 ln 2 / T."""
    from grokspectra.experiments import ch4
    t_rec = np.array([0, 250, 500, 750, 1000])
    cos = np.array([[0.02, 0.9, 0.9, 0.9, 0.9],      # crosses early
                    [0.02, 0.05, 0.1, 0.6, 0.8],     # crosses at 700 (late)
                    [0.02, 0.05, 0.1, 0.2, 0.35],    # slow: ×3.5 since step 500, above 0.15
                    [0.02, 0.3, 0.3, 0.3, 0.3],      # stuck
                    [0.01, 0.02, 0.04, 0.06, 0.1]])  # doubles but below the random level
    t_hit = np.array([200.0, 700.0, np.nan, np.nan, np.nan])
    res = {"t_rec": t_rec, "cos_tr": cos[None, None, None], "t_hit": t_hit[None, None, None],
           "cos_final": cos[:, -1][None, None, None], "d_list": np.array([400])}
    B = ch4.budget_check(res, 0.5)
    assert B["T"] == 1000 and B["half"] == 500
    assert int(B["successes"][0, 0, 0]) == 2 and int(B["late"][0, 0, 0]) == 1
    assert int(B["failed"][0, 0, 0]) == 3 and int(B["growing"][0, 0, 0]) == 1
    assert B["t_med"][0, 0, 0] == 450.0
    text = ch4.budget_sentence(B, [400], [5.0], ["quad:1:0.1"], np.array([[5.1]]))
    assert "1 of 3 failed runs" in text and "0.0014" in text and "|λ_out| ≥ 0.014" in text
    assert "still escaping" in text  # 1 of 3 growing is more than 5 %: the budget matters here


def test_crossing_log_fits_recover_a_logarithmic_law():
    """Crossing steps t = −20 + 6 log d + noise (sd 1, 64 seeds) at four d: the fit recovers b = 6 within 3 s.e.
    and does not reject the law; a δ where one run never crosses is left out, and t = d/100 (linear in d) is
    rejected."""
    from grokspectra.experiments import ch4
    rng = np.random.default_rng(3)
    dd = np.array([500, 1000, 2000, 4000])
    R = 64
    log_law = -20 + 6 * np.log(dd)[:, None] + rng.normal(0, 1, (4, R))
    linear = dd[:, None] / 100 + rng.normal(0, 1, (4, R))
    censored = log_law.copy()
    censored[0, 0] = np.nan
    t_hit = np.stack([log_law, censored, linear], 1)[None]  # [student, d, δ, seed]
    fits = ch4.crossing_log_fits({"t_hit": t_hit, "d_list": dd, "deltas": np.array([8.0, 9.0, 10.0])}, reps=400)
    assert [f["delta"] for f in fits] == [8.0, 10.0]
    assert abs(fits[0]["b"] - 6) < 3 * fits[0]["b_se"] and fits[0]["p"] > 0.01 and fits[1]["p"] < 1e-6
    text = ch4.crossing_log_sentence(fits, dd)
    assert "δ = 8:" in text and "δ = 9" not in text and "rejected" in text


def test_dlin_reports_each_horizon_with_its_evidence(tmp_path, monkeypatch):
    """ch3.dlin with a synthetic growth c_T(δ, rep) in place of the DMFT: a clean sign change is bisected to the
    tolerance near its root; a criterion that is positive at both ends is "no sign change" (status 3), not a row of
    nan, and keeps its two evaluations; an end whose replicates disagree in sign is "end undecided" (status 2)
    after doubling the paths to the maximum."""
    from grokspectra.experiments import ch3

    def fake(delta, T, N, rep, *, eta, seed, device="cpu"):
        if T == 8:
            return delta - 5.0 + 0.01 * rep
        if T == 16:
            return 1.0 + 0.01 * rep
        return (-1.0) ** rep if delta < 4 else 1.0 + 0.01 * rep
    monkeypatch.setattr(ch3, "lin_rate", fake)
    e = ex.find("ch3.dlin")
    monkeypatch.setattr(e, "_code", None)  # the version hashed with the fake must not outlive this test
    base = load_profile("ci", e.section)
    P = {**{k: v for k, v in base.items() if k != "profile"}, "device": "cpu", "dlin_horizons": [8, 16, 24],
         "dlin_N0": 1000, "dlin_Nmax": 4000, "dlin_reps": 2, "dlin_rtol": 0.05, "dlin_lo": 3.0, "dlin_hi": 12.0}
    from grokspectra import store as st
    R = e.run(P, store=st.Store(tmp_path), show=False)
    assert list(R["status"]) == [0, 3, 2]
    assert abs(R["root"][0] - 5.0) <= 0.05 * 5.0 and R["lo"][0] <= 5.0 <= R["hi"][0]
    assert np.isnan(R["root"][1]) and R["evals"][1] == 2 and R["n_final"][1] == 1000
    h = R["hist"][1][: int(R["evals"][1])]
    assert np.allclose(h[:, 0], [3.0, 12.0]) and np.allclose(h[:, 2], 1.005) and np.all(h[:, 3] > 0)
    assert R["n_final"][2] == 4000 and R["lo"][2] == 3.0 and R["hi"][2] == 12.0
    assert "no sign change" in ch3.BISECT_STATUS[3] and np.isfinite(R["hist"][0][: int(R["evals"][0])]).all()


def test_dnn_cell_records_a_dmft_breakdown_as_its_outcome(tmp_path, monkeypatch):
    """A ch3.dnn cell whose DMFT breaks down at the lower end of the bracket is stored with status "DMFT breakdown"
    and the bracket searched (delta_nn nan), not as a cell that looks uncomputed."""
    from grokspectra import dmft
    from grokspectra import store as st
    from grokspectra.experiments import ch3

    def broken(*a, **k):
        raise dmft.DMFTError("covariance of w^0..w^3 is not positive definite")
    monkeypatch.setattr(ch3.dmft, "run_dmft", broken)
    e = ex.find("ch3.dnn")
    monkeypatch.setattr(e, "_code", None)  # the version hashed with the fake must not outlive this test
    base = load_profile("ci", e.section)
    P = {**{k: v for k, v in base.items() if k != "profile"}, "device": "cpu", "dnn_acts": ["quad"], "dnn_ms": [1],
         "dnn_links": ["pr_clip"], "dnn_scales": [1.0], "dnn_times": [2, 4], "dnn_N": 1000, "dnn_Nmax": 1000,
         "dnn_reps": 2, "dnn_rtol": 0.5, "dnn_lo": 2.0, "dnn_hi": 32.0}
    R = e.run(P, store=st.Store(tmp_path), show=False)
    assert ch3.BISECT_STATUS[int(R["status"][0, 0, 0, 0, 0])] == "DMFT breakdown"
    assert (R["status"][0, 0, 0, 0] == 4).all() and np.isnan(R["delta_nn"]).all()
    assert (R["lo"][0, 0, 0, 0] == 2.0).all() and (R["hi"][0, 0, 0, 0] == 32.0).all()


def test_thresholds_say_why_there_is_no_delta_nn():
    """ch4.thresholds on a chapter-3 cell of the chapter's own student: a bisected cell gives δ_NN with its
    uncertainty (half-bracket ⊕ Monte-Carlo spread); a cell whose DMFT broke down says so; an uncomputed cell
    (status nan) says it is not computed yet; a δ_lin bracket without a root names its reason."""
    from grokspectra import store as st
    q = {"dnn_acts": ["quad"], "dnn_ms": [1], "dnn_links": ["pr_clip"], "dnn_scales": [1.0], "dnn_times": [30, 60],
         "eta_quad": 0.1}
    p = {"students": ["quad:1:0.1"], "link": "pr_clip", "clip": 6.0}

    def cell(status, root=7.0):
        a = {k: np.full((1, 1, 1, 1, 2), v) for k, v in dict(delta_nn=root, lo=6.8, hi=7.2, root_mc_se=0.1,
                                                              edge=0.01, edge_se=0.001, status=status).items()}
        return st.Result(a, {"params": q})
    DL = st.Result({"horizons": np.array([40]), "lo": np.array([3.0]), "hi": np.array([16.0]),
                    "root": np.array([np.nan]), "root_mc_se": np.array([np.nan]), "status": np.array([3.0])},
                   {"params": {"eta_quad": 0.1}})
    ok = ch4.thresholds(cell(0.0), DL, p)
    assert ok["delta_nn"] == 7.0 and math.isclose(ok["delta_nn_unc"], math.hypot(0.2, 0.1))
    assert math.isclose(ok["delta_nn_brk"], 0.2) and ok["delta_nn_mc"] == 0.1  # the two parts, for the rules
    assert "δ_NN(t = 60) = 7.00" in ok["text"] and "no sign change" in ok["text"] and not ok["dagger"]
    assert "DMFT broke down" in ch4.thresholds(cell(4.0, np.nan), DL, p)["text"]
    assert "not computed this student" in ch4.thresholds(cell(np.nan, np.nan), DL, p)["text"]


def test_gap_sentence_measures_gd_against_delta_nn_of_every_t():
    """ch4.gap_sentence: δ_c(d_max) and δ_c(∞) against δ_NN(t) with the gap in combined uncertainties, and the
    direction δ_NN(t) moves with t; "" without a δ_NN."""
    thr = {"by_t": [(30, 7.6, 0.05), (60, 8.8, 0.05)]}
    A = {"loc": np.array([[5.0, 5.5]]), "loc_se": np.array([[0.2, 0.15]])}
    fss = {"mid": 5.7, "stat": 0.8, "syst": 0.2}
    s = ch4.gap_sentence(thr, fss, A, np.array([1000, 4000]))
    z = 3.1 / math.hypot(0.8, 0.2, 0.05)
    assert "d = 4000, δ_c = 5.50 ± 0.15, lies 3.30 below δ_NN(t = 60) = 8.80" in s
    assert f"{z:.1f} combined uncertainties below" in s and "away from GD's threshold" in s
    assert ch4.gap_sentence({"by_t": [(60, float("nan"), 0.1)]}, fss, A, [1000, 4000]) == ""
    # the second student of the sweep: its own δ_c
    A2 = {"loc": np.array([[5.0, 5.5], [6.0, 6.7]]), "loc_se": np.array([[0.2, 0.15], [0.3, 0.25]])}
    s2 = ch4.gap_sentence(thr, fss, A2, np.array([1000, 4000]), si=1)
    assert "δ_c = 6.70 ± 0.25, lies 2.10 below" in s2
    thr_t = {**thr, "t": 60, "dagger": True, "delta_nn": 8.8, "delta_nn_unc": 0.05, "delta_lin": float("nan"),
             "lin_T": 0}
    fss_t = {**fss, "fits": {f: {"limit": 7.0, "limit_se": 0.5, "chi2": 1.0, "dof": 2} for f in ch4.FSS_LAWS}}
    tab = ch4.threshold_table(thr_t, fss_t, A2, np.array([1000, 4000]), 0.5, si=1)
    assert "| δ_c($d$ = 4000) | logistic fit at the largest $d$ | 6.70 | ± 0.25 |" in tab and "δ_lin" not in tab


def test_censored_median_counts_runs_that_never_escape():
    """The median of all runs with non-escapes as +inf: finite only when more than half escape, and larger than the
    median of the escaping runs alone (which is biased low near the threshold)."""
    from grokspectra.experiments import ch5
    h = np.array([[10.0, 20.0, 30.0, np.nan, np.nan], [10.0, 20.0, np.nan, np.nan, np.nan]])
    med = ch5.censored_median(h)
    assert med[0] == 30.0 and np.isinf(med[1])
    assert med[0] > np.nanmedian(h[0])
    assert np.allclose(ch5.late_fraction(h, 15.0), [2 / 5, 1 / 5])


def test_size_law_fits_tell_log_from_linear_growth():
    """Escape steps t = 20 + 8 log d + noise (sd 3, 64 runs, 10 % never escape) at four d: the log law recovers
    b = 8 within 3 s.e. and is not rejected; t = d/20 + noise is rejected by the log law (p < 1e-6) and fits the
    power law with α = 1 within 3 s.e. With fewer than three usable d there is no fit."""
    from grokspectra.experiments import ch5
    rng = np.random.default_rng(5)
    dd = np.array([500, 1000, 2000, 4000])
    R = 64
    log_law = 20 + 8 * np.log(dd)[:, None] + rng.normal(0, 3, (4, R))
    log_law[rng.random((4, R)) < 0.1] = np.nan
    f = ch5.size_law_fits(log_law, dd, reps=800)
    assert f["used"].all() and abs(f["log"]["b"] - 8) < 3 * f["log"]["b_se"] and f["log"]["p"] > 0.01
    lin = dd[:, None] / 20 + rng.normal(0, 3, (4, R))
    g = ch5.size_law_fits(lin, dd, reps=800)
    assert g["log"]["p"] < 1e-6 and abs(g["power"]["b"] - 1) < 3 * g["power"]["b_se"]
    few = log_law.copy()
    few[:2, : R // 2 + 1] = np.nan  # two d where most runs never escape: median infinite
    h = ch5.size_law_fits(few, dd, reps=200)
    assert h["log"] is None and h["used"].sum() == 2


def test_gd_threshold_picks_the_student_and_d():
    from grokspectra.experiments import ch5
    A = {"loc": np.array([[5.0, 5.3], [9.0, 9.5]]), "loc_se": np.array([[0.1, 0.2], [0.3, 0.4]])}
    assert ch5.gd_threshold(A, ["quad:1:0.1", "gelu:2:2.0"], [500, 1000], "quad:1:0.1", 1000) == (5.3, 0.2)
    assert np.isnan(ch5.gd_threshold(A, ["quad:1:0.1"], [500, 1000], "gelu:1:1.0", 1000)[0])
    assert np.isnan(ch5.gd_threshold(A, ["quad:1:0.1"], [500, 1000], "quad:1:0.1", 4000)[0])


def test_plateau_units_cover_every_seed_and_reduce_by_d(tmp_path):
    """The plateau scan at CI size computes every (d, seed) once and assembles [d, seed, T+1] in d order; the
    overlap starts at the random-init level and is a cosine."""
    from grokspectra import store as st
    from grokspectra.experiments import ch5
    from grokspectra.params import load_profile
    P = ch5.SCHEMA.validate({**load_profile("ci", ch5.SECTION), "profile": "ci", "plateau_d_list": [64, 128],
                             "plateau_seeds": 3, "plateau_T": 20, "n_test": 256})
    R = ch5.plateau.run(P, store=st.Store(tmp_path), show=False)
    assert R["cos"].shape == (2, 3, 21) and list(R["d_list"]) == [64, 128] and float(R["delta"]) == P["plateau_delta"]
    assert np.all((R["cos"] >= 0) & (R["cos"] <= 1)) and np.all(np.isfinite(R["train"]))
    assert np.all(R["cos"][:, :, 0] < 0.6)


def test_log_growth_verdict_separates_rejected_resolved_and_unresolved():
    from grokspectra.experiments import ch5
    assert ch5.log_growth_verdict({"b": 10.0, "b_se": 2.0, "p": 0.5})[0] is True
    assert ch5.log_growth_verdict({"b": 10.0, "b_se": 2.0, "p": 0.001})[0] is False  # law rejected
    assert ch5.log_growth_verdict({"b": -10.0, "b_se": 2.0, "p": 0.5})[0] is False  # resolved decrease
    v, note = ch5.log_growth_verdict({"b": 35.0, "b_se": 108.0, "p": 0.36})
    assert v is None and "not resolved" in note
    assert ch5.log_growth_verdict(None)[0] is None


def test_grid_root_linear_quadratic_and_outside_the_grid():
    """ch3.grid_root: exact for a criterion linear in δ; the quadratic estimate is exact for a quadratic one (and
    the linear one is not); a criterion negative from the first δ is "below grid", one never negative "above
    grid"; sign changes are counted; bad grids are refused."""
    from grokspectra.experiments import ch3
    x = np.array([4.0, 5, 6, 7, 8, 9])
    r = ch3.grid_root(x, 0.5 * (6.3 - x))
    assert r["status"] == "root" and abs(r["root"] - 6.3) < 1e-12 and abs(r["quad"] - 6.3) < 1e-12
    assert r["crossings"] == 1
    c = (7.4 - x) * (x + 1.0) / 10  # one root at 7.4 in the grid, quadratic
    r = ch3.grid_root(x, c)
    assert abs(r["quad"] - 7.4) < 1e-9 and abs(r["root"] - 7.4) > 1e-3
    assert ch3.grid_root(x, -np.ones(6))["status"] == "below grid"
    assert ch3.grid_root(x, np.ones(6))["status"] == "above grid"
    assert ch3.grid_root(x, np.array([1.0, -1, 1, -1, -1, -1]))["crossings"] == 3
    with pytest.raises(ValueError):
        ch3.grid_root(x[::-1], c)
    with pytest.raises(ValueError):
        ch3.grid_root(x, np.r_[c[:-1], np.nan])


def _synthetic_limit(law, rng, R=8, sigma=0.05, slope=0.4):
    """A ch3.limit-shaped grid [δ, rep, t] with a known threshold law δ*(t) and edge law e(t) = −1.5 t^(−0.7):
    c = slope·(δ*(t) − δ) + a per-replicate offset (common to every δ, like shared paths) of s.d. sigma."""
    deltas = np.arange(4.0, 14.01, 1.0)
    times = np.array([10, 15, 20, 30, 40, 60, 80, 100, 120])
    off = sigma * rng.standard_normal((1, R, times.size))
    crit = slope * (law(times)[None, None, :] - deltas[:, None, None]) + off
    eoff = 0.01 * rng.standard_normal((1, R, times.size))
    edge = -1.5 * times[None, None, :] ** -0.7 + 0.002 * (deltas[:, None, None] - 8) + eoff
    return {"deltas": deltas, "times": times, "crit": crit, "edge": edge}, sigma / slope / math.sqrt(R)


def test_limit_roots_and_fits_recover_a_known_limit():
    """δ*(t) = 10 − 8 t^(−1/2) and an edge tending to 0: ch3.limit_roots finds δ*(t) within 3 jackknife s.e. at every
    t, with s.e. of the size σ/(slope √R) the construction implies (mean ratio within [0.6, 1.6]: 9 steps of an
    8-replicate jackknife); the power-law fit recovers δ∞ = 10 and a = 1/2 within 3 s.e., resolves a > 0 (finite
    limit) and finds e∞ consistent with 0 (marginal), so the verdict holds and the sentence says so."""
    from grokspectra.experiments import ch3
    law = lambda t: 10 - 8 * t ** -0.5  # noqa: E731
    ratios = []
    for seed in range(3):
        L, se_true = _synthetic_limit(law, np.random.default_rng(seed))
        rt = ch3.limit_roots(L)
        assert all(s == "root" for s in rt["status"])
        assert np.all(np.abs(rt["root"] - law(L["times"])) <= 3 * rt["root_se"] + 1e-9)
        ratios.append(np.mean(rt["root_se"]) / se_true)
        wins = ch3.limit_windows(rt, 20)
        assert [w["t_min"] for w in wins] == [10, 15, 20, 30, 40]  # every t₀ with ≥ 5 steps from it on
        p = next(w for w in wins if w["t_min"] == 20)["fd"]["power"]
        assert abs(p["inf"] - 10) <= 3 * p["inf_se"] and abs(p["a"] - 0.5) <= 3 * p["a_se"]
        v = ch3.limit_verdict(wins, 20)
        assert v["finite"] and v["edge"] == "marginal" and v["ok"], (p, [w["fe"]["power"] for w in wins])
        assert v["inf"] == p["inf"] and v["inf_syst"] < 3 * p["inf_se"]  # one law throughout: windows agree
        assert v["judged"] == [10, 20]
        assert "finite within the fits" in ch3.limit_sentence(rt, wins, 20)
        assert "limit δ∞" in ch3.limit_definition(wins, 20)
        assert ch3.limit_window_table(wins).count("\n") == len(wins) + 1
    assert 0.6 <= np.mean(ratios) <= 1.6, ratios


def test_limit_roots_leaves_out_an_edge_misfire_and_says_so():
    """One bulk edge of an 8-path-set grid replaced by +3.75 (the paper grid's misfire; the others near −0.2): it is
    the only one flagged, the table's edge at that t stays within 3 s.e. of the clean grid's (the misfire kept moves it
    by about 4/8 of the interpolation weight), the roots do not move, the sentence names the cell, and neither a
    clean grid nor one of three path sets (no robust spread to judge by) flags anything."""
    from grokspectra.experiments import ch3
    law = lambda t: 10 - 8 * t ** -0.5  # noqa: E731
    L, _ = _synthetic_limit(law, np.random.default_rng(11))
    clean = ch3.limit_roots(L)
    assert clean["misfires"] == [] and ch3.limit_misfire_sentence(clean) == ""
    k = int(np.flatnonzero(L["times"] == 80)[0])
    i = int(np.argmin(np.abs(L["deltas"] - clean["root"][k])))  # the grid δ nearest the root at t = 80
    bad = {**L, "edge": L["edge"].copy()}
    bad["edge"][i, 6, k] = 3.75
    rt = ch3.limit_roots(bad)
    assert [(m[0], m[1], m[2], m[3]) for m in rt["misfires"]] == [(float(L["deltas"][i]), 6, 80, 3.75)]
    assert np.array_equal(rt["root"], clean["root"]) and np.array_equal(rt["root_se"], clean["root_se"])
    assert abs(rt["edge"][k] - clean["edge"][k]) <= 3 * clean["edge_se"][k]
    assert rt["edge_with_misfires"][k] - clean["edge"][k] > 0.2 and rt["edge_with_misfires_se"][k] > 10 * rt["edge_se"][k]
    others = np.delete(np.arange(L["times"].size), k)
    assert np.allclose(rt["edge"][others], clean["edge"][others])
    s = ch3.limit_misfire_sentence(rt)
    assert f"δ = {L['deltas'][i]:g}, path set 7 of 8, t = 80: +3.750" in s and "1 of the " in s
    three = {**bad, "crit": bad["crit"][:, :3], "edge": bad["edge"][:, [0, 1, 6]]}
    assert ch3.limit_roots(three)["misfires"] == []


def test_limit_fits_on_logarithmic_growth():
    """δ*(t) = 2 + 1.5 log t, no finite limit: the log law recovers b₁ = 1.5 within 3 s.e. with χ² of the order of
    its dof, and the power law's best limit lies far above every δ*(t) on the grid or its exponent is not resolved
    (either way, no finite δ∞ near the data is claimed)."""
    from grokspectra.experiments import ch3
    law = lambda t: 2 + 1.5 * np.log(t)  # noqa: E731
    deltas, times = np.arange(4.0, 12.01, 0.5), np.array([10, 15, 20, 30, 40, 60, 80, 100, 120])
    crit = 0.4 * (law(times)[None, None, :] - deltas[:, None, None]) \
        + 0.05 * np.random.default_rng(6).standard_normal((1, 8, times.size))
    rt = ch3.limit_roots({"deltas": deltas, "times": times, "crit": crit, "edge": np.full(crit.shape, -0.1)})
    fd = ch3.limit_fits(rt["times"], rt["root"], rt["root_se"], rt["root_jk"], t_min=20)
    lg = fd["log"]
    assert abs(lg["b1"] - 1.5) <= 3 * lg["b1_se"]
    assert lg["chi2"] < 4 * lg["dof"] + 10
    p = fd["power"]
    assert not (p["a"] > 2 * p["a_se"]) or p["inf"] > law(120) + 1.0
    with pytest.raises(ValueError):
        ch3.limit_fits(rt["times"][:3], rt["root"][:3], rt["root_se"][:3], rt["root_jk"][:, :3], t_min=20)


def test_limit_verdict_needs_all_steps_and_the_chosen_window():
    """An edge limit consistent with 0 over the chosen window but 4 s.e. below it over all steps is "mixed", not
    marginal (the verdict is not the choice of one window; the short windows in between only set the spread of
    δ∞); below 0 in both is "below"; the definition paragraph then keeps the finite-horizon δ_NN and says why."""
    from grokspectra.experiments import ch3

    def win(t0, e, e_se, a=0.5, a_se=0.1, inf=11.0):
        law = {"inf": inf, "inf_se": 0.5, "A": 1.0, "a": a, "a_se": a_se, "chi2": 1.0, "dof": 3}
        return {"t_min": t0, "fd": {"n": 6, "power": law, "log": {"b1": 1.0, "b1_se": 0.1, "chi2": 5.0, "dof": 4}},
                "fe": {"n": 6, "power": {**law, "inf": e, "inf_se": e_se}}}
    mixed = [win(10, -0.064, 0.016, inf=12.6), win(20, -0.057, 0.032, inf=11.6), win(40, -0.3, 0.08, inf=10.8)]
    v = ch3.limit_verdict(mixed, 20)
    assert v["edge"] == "mixed" and v["finite"] and not v["ok"] and v["judged"] == [10, 20]
    assert ch3.limit_verdict([mixed[1], mixed[2]], 20)["edge"] == "marginal"  # t ≥ 40 (short) is not judged
    assert v["inf"] == 11.6 and abs(v["inf_syst"] - 0.9) < 1e-12
    assert "not established" in ch3.limit_definition(mixed, 20) and "11.60 ± 0.50 ± 0.90" in ch3.limit_definition(mixed, 20)
    below = [win(10, -0.2, 0.02), win(20, -0.2, 0.05)]
    assert ch3.limit_verdict(below, 20)["edge"] == "below"
    # later (unjudged) windows that do not exclude 0 are named in the sentence; they do not change the verdict
    later = below + [win(40, -0.05, 0.05), win(60, -0.3, 0.05)]
    assert ch3.limit_verdict(later, 20)["edge"] == "below"
    s_ = ch3.limit_sentence({"reps": 8}, later, 20)
    assert "below 0" in s_ and "Of the 2 later windows, 1 (t ≥ 40)" in s_
    assert "later windows" not in ch3.limit_sentence({"reps": 8}, below, 20)
    unresolved = [win(10, 0.0, 0.02, a=0.1, a_se=0.2), win(20, 0.0, 0.03)]
    assert ch3.limit_verdict(unresolved, 20)["edge"] == "marginal" and not ch3.limit_verdict(unresolved, 20)["finite"]


def test_shown_value_follows_the_profile_of_the_shown_result():
    """experiments.shown_value: a paper result shown in a CI build is analysed with the paper profile's t0 (read from
    params/paper.yaml), a result of the notebook's own profile with the notebook's, and an unreadable profile
    falls back to the notebook's value."""
    from grokspectra.experiments import ch5, shown_value
    from grokspectra.params import load_profile
    from grokspectra.store import Result
    P = {"profile": "ci", "t0": 40}
    paper_t0 = load_profile("paper", ch5.SECTION)["t0"]
    assert shown_value(Result({}, {"profile": "paper"}), P, "t0", ch5.SECTION) == paper_t0 != 40
    assert shown_value(Result({}, {"profile": "ci"}), P, "t0", ch5.SECTION) == 40
    assert shown_value(Result({}, {"profile": "no-such-profile"}), P, "t0", ch5.SECTION) == 40


def test_limit_row_of_chapter_4_is_scored_only_for_an_established_limit():
    """ch4.limit_applies matches chapter 3's δ_NN(∞) to the Quad toy only; limit_gap_sentence measures the gap in
    combined uncertainties (δ∞ = 9 ± 0.3 against δ_c(∞) = 6 ± 0.4 ± 0: 6.0) and says "not a test" for a limit
    chapter 3 does not establish."""
    from grokspectra.experiments import ch4
    lim = {"inf": 9.0, "inf_se": 0.3, "inf_syst": 0.0, "a": 0.5, "a_se": 0.1, "ok": True, "t_max": 120,
           "act": "quad", "m": 1, "link": "pr_clip", "clip": 6.0, "eta": 0.1}
    p = {"link": "pr_clip", "clip": 6.0}
    assert ch4.limit_applies(lim, "quad:1:0.1", p)
    assert not ch4.limit_applies(lim, "gelu:2:2.0", p) and not ch4.limit_applies(lim, "quad:1:0.2", p)
    assert not ch4.limit_applies(lim, "quad:1:0.1", {"link": "pr_tanh", "clip": 6.0})
    fss = {"mid": 6.0, "stat": 0.4, "syst": 0.0}
    s = ch4.limit_gap_sentence(lim, fss)
    assert "6.0 combined uncertainties above" in s and "not a test" not in s
    assert "not a test" in ch4.limit_gap_sentence({**lim, "ok": False}, fss)
    assert ch4.limit_gap_sentence(None, fss) == ""
    u, z = ch4.limit_gap({**lim, "inf_syst": 0.4}, {**fss, "syst": 0.0})  # every error in quadrature: √0.41
    assert u == pytest.approx(0.41 ** 0.5) and z == pytest.approx(3.0 / 0.41 ** 0.5)


def test_limit_parameters_are_checked_with_clear_errors():
    """ch3.limit refuses a δ grid or step list that is not strictly increasing, and the analysis a t_min that is not
    a computed step or leaves fewer than four steps, each naming the parameter."""
    from grokspectra.experiments import ch3
    from grokspectra.params import ParamError, load_profile
    P = {**load_profile("ci", ch3.SECTION), "profile": "ci"}
    with pytest.raises(ParamError, match="lim_deltas"):
        ch3.limit.units(ch3.limit.params({**P, "lim_deltas": [6.0, 4.0, 8.0]}))
    with pytest.raises(ParamError, match="lim_times"):
        ch3.limit.units(ch3.limit.params({**P, "lim_times": [10, 10, 20]}))
    rt = {"times": np.array([10, 15, 20, 30, 40])}
    for bad in (12, 30):
        with pytest.raises(ParamError, match="lim_tmin"):
            ch3.limit_windows(rt, bad)


def test_outlier_split_counts_unsolved_seeds_and_never_uses_them():
    """ch3.outlier_split on a synthetic comparison of 5 seeds at one δ: 1 escaped, 1 not escaped whose outlier solve
    failed (nan prediction, fail = 1), 3 with predictions. The failed seed is counted in ``failed`` and left out of
    the mean difference (which is that of the 3 predicted seeds, checked by hand); a result without the ``fail``
    array (stored before it existed) counts none."""
    from grokspectra.experiments import ch3
    nan = np.nan
    gd = np.array([[[-1.00, 0, 0, 0], [-2.0, 0, 0, 0], [-1.10, 0, 0, 0], [-0.90, 0, 0, 0], [-5.0, 0, 0, 0]]])
    emp = np.array([[[-1.02, 0, 0, 0], [nan] * 4, [-1.05, 0, 0, 0], [-0.95, 0, 0, 0], [nan] * 4]])
    O = {"quad_deltas": np.array([8.0]), "quad_gd": gd, "quad_emp": emp,
         "quad_cos": np.array([[0.1, 0.2, 0.1, 0.1, 0.9]]), "quad_fail": np.array([[0, 1, 0, 0, 0.0]])}
    r = ch3.outlier_split(O, "quad")[0]
    assert (r["escaped"], r["failed"], r["predicted"]) == (1, 1, 3)
    diff = np.array([-1.00 + 1.02, -1.10 + 1.05, -0.90 + 0.95])
    assert abs(r["mean_diff"] - diff.mean()) < 1e-12 and abs(r["sd_diff"] - diff.std(ddof=1)) < 1e-12
    # Student's t with 2 dof (4.303), not 2: the s.e. comes from the same three seeds
    assert r["t_mult"] == pytest.approx(4.302653, abs=1e-6)
    assert r["tol"] == pytest.approx(4.302653 * diff.std(ddof=1) / 3 ** 0.5 + 0.01 * np.mean([1.02, 1.05, 0.95]))
    del O["quad_fail"]
    assert ch3.outlier_split(O, "quad")[0]["failed"] == 0


def test_outlier_window_inverts_the_grid_and_counts_late_crossings():
    """ch4.outlier_window: δ_NN(t) = 5, 6, 7 at t = 10, 20, 40 puts t*(5.5) at √(10·20) (log-linear), δ below the
    first root "before" and at or above the last "after"; a band from δ_NN ± its uncertainty brackets t*. Then
    escape_vs_window counts the successful crossings after the band's upper end (nan off the grid), and the
    sentence reports them at the largest d."""
    from grokspectra.experiments import ch4
    rt = {"times": np.array([10, 20, 40]), "root": np.array([5.0, 6.0, 7.0]), "root_se": np.array([0.1, 0.1, 0.1]),
          "interp": np.zeros(3)}
    tw = ch4.outlier_window(rt, [4.0, 5.5, 7.5])
    assert list(tw["where"]) == ["before", "in grid", "after"]
    assert tw["t"][1] == pytest.approx(200 ** 0.5) and tw["lo"][1] < tw["t"][1] < tw["hi"][1]
    assert np.isnan(tw["t"][[0, 2]]).all()
    with pytest.raises(ValueError, match="increase with t"):
        ch4.outlier_window({**rt, "root": np.array([5.0, 7.0, 6.0])}, [5.5])
    # one d, three δ, four seeds: at δ = 5.5 two successes cross after t* (at 100 and 50), one before (at 5)
    t_hit = np.array([[[3, 4, np.nan, np.nan], [5, 100, 50, np.nan], [8, 9, 10, 41]]], float)[None]
    cos = np.where(np.isfinite(t_hit), 0.9, 0.1)
    E = ch4.escape_vs_window({"t_hit": t_hit, "cos_final": cos}, 0, tw, 0.5)
    assert E["succ"].tolist() == [[2, 3, 4]] and E["late"][0, 1] == 2 and np.isnan(E["late"][0, [0, 2]]).all()
    assert E["t_med"][0, 1] == 50
    s = ch4.escape_window_sentence(E, tw, [1000])
    assert "At d = 1000" in s and "2 of 3 successful runs cross after it" in s and "2 at δ = 4" in s
    assert "At δ ≥ 7.5 the outlier outlives the last computed step (t = 40), and 3 of the 4" in s  # 8, 9, 10 ≤ 40
    E2 = ch4.escape_vs_window({"t_hit": np.concatenate([t_hit, t_hit], 1), "cos_final": np.concatenate([cos, cos], 1)},
                              0, tw, 0.5)  # two d with the same runs
    assert "The same count at each d: 2 of 3 at d = 500, 2 of 3 at d = 1000." in ch4.escape_window_sentence(
        E2, tw, [500, 1000])


def test_an_open_band_of_t_star_reads_beyond_the_grid_and_counts_no_late_crossing():
    """At δ just below the last root, δ_NN − its uncertainty never reaches δ within the grid: t*'s upper end is off
    the grid, so the outlier may outlive the last step. The sentence says so (no "nan") and no crossing counts as
    late, since none is known to come after the outlier is gone; the lower end likewise reads "< first step"."""
    from grokspectra.experiments import ch4
    rt = {"times": np.array([10, 20, 40]), "root": np.array([5.0, 6.0, 7.0]), "root_se": np.array([0.5, 0.5, 0.5]),
          "interp": np.zeros(3)}
    tw = ch4.outlier_window(rt, [5.2, 6.8])
    assert np.isnan(tw["lo"][0]) and np.isnan(tw["hi"][1]) and np.isfinite(tw["t"]).all()
    t_hit = np.array([[[3, 30, 35], [5, 100, 50]]], float)[None]
    E = ch4.escape_vs_window({"t_hit": t_hit, "cos_final": np.full_like(t_hit, 0.9)}, 0, tw, 0.5)
    assert E["late"][0, 1] == 0 and E["late"][0, 0] == 2  # 30, 35 > hi(5.2) ≈ 15; nothing beyond an open end
    s = ch4.escape_window_sentence(E, tw, [1000])
    assert "nan" not in s and "[< 10," in s and "> 40, beyond the grid]" in s
