"""Tests of the discrete-time DMFT (eq. app-dmft): agreement with finite-d GD within combined standard errors, the memory
terms matter, antithetic sampling keeps hard overlaps exactly zero, and the parameter-side kernels have their exact
closed-form entries."""

import math

import pytest
import torch

from grokspectra import dmft
from grokspectra import multiindex as mi

F64 = torch.float64
SET = dict(act="gelu", link="pr_clip", delta=3.0, eta=2.0, m=2, M0=[[0.5, 0.3]])  # a warm start with bounded labels


def _observables(M, Q, train):
    """M_T (2 entries), diag Q_T (2 entries), train risk at T: [.., 5]."""
    return torch.cat([M[..., -1, 0, :], torch.diagonal(Q[..., -1, :, :], dim1=-2, dim2=-1), train[..., -1:]], -1)


@pytest.fixture(scope="module")
def dmft_reps():
    """Four independent DMFT replicas (N = 2·10⁴ paths each) with memory, T = 4, and one without memory."""
    T = 4
    reps = [dmft.run_dmft(SET["act"], SET["link"], SET["delta"], SET["eta"], T, 20000, SET["m"], M0=SET["M0"],
                          generator=100 + i) for i in range(4)]
    obs = torch.stack([_observables(r["M"], r["Q"], r["train"]) for r in reps])
    off = dmft.run_dmft(SET["act"], SET["link"], SET["delta"], SET["eta"], T, 40000, SET["m"], M0=SET["M0"],
                        memory=False, generator=7)
    return T, obs, _observables(off["M"], off["Q"], off["train"]), reps[0]


@pytest.fixture(scope="module")
def gd_runs(dmft_reps):
    T = dmft_reps[0]
    d, trials = 2000, 12
    prob = mi.sample_problem(d, int(SET["delta"] * d), 1, SET["link"], trials=trials, dtype=torch.float32, generator=1)
    out = mi.run_gd(prob, SET["m"], SET["eta"], T, act=SET["act"], M0=SET["M0"], generator=2)
    return _observables(out["M"], out["Q"], out["train"]).double()


def test_dmft_matches_gd_within_standard_errors(dmft_reps, gd_runs):
    """GD at d = 2000 (12 trials) vs the DMFT (4 × 2·10⁴ paths) at T = 4 for M_T, diag Q_T and the train risk.
    Both are unbiased up to O(1/d) and O(1/N); their difference must stay within 5 combined standard errors (trial
    and replica spreads estimated from the data; 5 rather than 3 because the SEs have 11 and 3 degrees of freedom)."""
    T, obs, _, _ = dmft_reps
    se_gd = gd_runs.std(0) / math.sqrt(gd_runs.shape[0])
    se_dm = obs.std(0) / math.sqrt(obs.shape[0])
    gap = (gd_runs.mean(0) - obs.mean(0)).abs()
    tol = 5 * torch.sqrt(se_gd ** 2 + se_dm ** 2)
    assert (gap < tol).all(), f"gap {gap.tolist()} vs tolerance {tol.tolist()}"
    assert (se_gd < 0.05).all()  # sharp enough to resolve the memory terms (next test)


def test_memory_terms_matter(dmft_reps, gd_runs):
    """Without the Onsager terms the DMFT misses GD by many standard errors (chapter 1)."""
    _, _, off, _ = dmft_reps
    se_gd = gd_runs.std(0) / math.sqrt(gd_runs.shape[0])
    z = (off - gd_runs.mean(0)).abs() / se_gd
    assert z[2:4].min() > 10, f"diag Q_T without memory is only {z[2:4].tolist()} SEs from GD"
    assert z[4] > 10


def test_kernel_structure(dmft_reps):
    """R_θ(t+1, t) = −(η/δ) I exactly; R_θ(t, s) = 0 for s ≥ t; C_F symmetric; R_F(t,t) = δ E D(u^t; y)."""
    T, _, _, r = dmft_reps
    m, eta, delta = SET["m"], SET["eta"], SET["delta"]
    B = r["R_theta"]
    for t in range(T):
        assert torch.allclose(B[t + 1, t], -(eta / delta) * torch.eye(m, dtype=F64), atol=1e-15)
        assert B[t, t:].abs().max() == 0
    CF = r["C_F"]
    assert torch.allclose(CF, CF.permute(1, 0, 3, 2), atol=1e-15)
    assert torch.allclose(r["Q"][0], torch.tensor([[1.25, 0.15], [0.15, 1.09]], dtype=F64), atol=1e-12)


def test_first_step_closed_form():
    """At t = 1: Q_⊥(1,1) = A_1 A_1ᵀ + (η²/δ) C_F(0,0) with A_1 = I − η E[D(u⁰)], u⁰ = zM_0 + ξ (eq. app-dmft), and
    u¹ = zM_1 + w¹ − (η/δ) F(u⁰). Recomputed here from the returned sample-side law."""
    eta, delta, m = 1.0, 2.0, 2
    r = dmft.run_dmft("tanh", "pr_tanh", delta, eta, 1, 20000, m, M0=[[0.4, -0.2]], keep=(0, 1), generator=3)
    z, y, u0, u1 = r["z"], r["y"], r["u"][0], r["u"][1]
    F0, _, D0 = mi.per_sample_FLD(u0, y, "tanh")
    A1 = torch.eye(m, dtype=F64) - eta * D0.mean(0)
    C0 = (F0[:, :, None] * F0[:, None, :]).mean(0)
    assert torch.allclose(r["Qperp"][1], A1 @ A1.T + eta ** 2 / delta * C0, atol=1e-12)
    assert torch.allclose(r["M"][1], r["M"][0] - eta * (z[:, :, None] * F0[:, None, :]).mean(0), atol=1e-12)
    w1 = u1 - z @ r["M"][1] + (eta / delta) * F0
    # w¹ is the Gaussian part: its empirical covariance matches Q_⊥(1,1) to sampling error (entries sd ≲ 2/√N)
    cov = w1.T @ w1 / w1.shape[0]
    assert (cov - r["Qperp"][1]).abs().max() < 6 * 2 / math.sqrt(10000)


def test_antithetic_keeps_hard_overlap_exactly_zero():
    """Phase retrieval from random init: antithetic paths give M_t ≡ 0 to the last bit; plain sampling does not.
    Staircase y = z₁ + z₂²: the easy row is learned, the hard row stays exactly 0."""
    kw = dict(act="gelu", delta=3.0, eta=2.0, T=8, N=8000, m=2)
    anti = dmft.run_dmft(link="pr", generator=0, **kw)
    plain = dmft.run_dmft(link="pr", antithetic=False, generator=0, **kw)
    assert anti["M"].abs().max() == 0
    assert plain["M"][1:].abs().max() > 1e-4
    st = dmft.run_dmft(link="staircase", generator=0, **kw)
    assert st["M"][:, 1].abs().max() == 0
    assert st["M"][-1, 0].abs().min() > 0.3


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="even number"):
        dmft.run_dmft("gelu", "pr", 3.0, 2.0, 2, 101, 2)
    with pytest.raises(ValueError, match="M0 must have shape"):
        dmft.run_dmft("gelu", "pr", 3.0, 2.0, 2, 100, 2, M0=[[0.1, 0.2, 0.3]])
    with pytest.raises(ValueError, match="keep steps"):
        dmft.run_dmft("gelu", "pr", 3.0, 2.0, 2, 100, 2, keep=(5,))


@pytest.mark.parametrize("cfg", [
    dict(act="gelu", link="pr_clip", delta=3.0, eta=2.0, T=12, N=600, m=2, M0=[[0.5, 0.3]]),
    dict(act="quad", link="pr_clip", delta=6.0, eta=0.1, T=9, N=400, m=1, keep=[4, 9]),
    dict(act="gelu", link="pr", delta=4.0, eta=1.0, T=7, N=300, m=3, M0=[[0.2, 0.1, 0.0]], keep=[7], lam=0.01),
    dict(act="gelu", link="pr_clip", delta=3.0, eta=2.0, T=6, N=400, m=2, M0=[[0.5, 0.3]], memory=False),
], ids=["gelu-m2", "quad-m1-keep", "gelu-m3-ridge", "no-memory"])
def test_engine_matches_the_square_layout_reference(cfg):
    """The engine (triangular χ, paths innermost, blocked products) against the engine it replaced (square χ layout,
    one einsum per term: ``tests/dmft_reference.py``), with the same paths. The two sum the same products in a
    different order, so they agree to float64 roundoff amplified by the recursion: 10⁻⁹ relative, where an error
    in one term (a transposed block, a missing memory term) changes the observables at 10⁻² or more. Measured when
    written: kernels and observables within 3·10⁻¹⁰ relative, single paths' u^t within 4·10⁻⁹."""
    from dmft_reference import run_dmft_reference

    new = dmft.run_dmft(**cfg, generator=3)
    ref = run_dmft_reference(**cfg, generator=3)
    for key in ("M", "Q", "train", "test", "C_F", "R_F", "R_theta"):
        scale = ref[key].abs().max().item() + 1e-300
        err = (new[key] - ref[key]).abs().max().item()
        assert err <= 1e-9 * scale, (key, err, scale)
    for t in cfg.get("keep", ()):
        u, u_ref = new["law"][t]["u"], ref["law"][t]["u"]  # one path carries more of the amplified roundoff: 10⁻⁷
        assert (u - u_ref).abs().max() <= 1e-7 * u_ref.abs().max(), t


def test_engine_matches_the_reference_in_float32_and_within_reuse_memory():
    """float32 paths (kernels stay float64) against the reference run in float32 on the same draw: agreement at
    float32 roundoff, normwise (max difference ≤ 10⁻⁴ of the array's largest entry; measured 0.5–7·10⁻⁶ on an
    AMD EPYC host, where entries near zero differ by 10⁻³ of themselves, as roundoff set by the large entries of
    the same sums does, so an elementwise relative bound would not measure roundoff); and
    runs inside :func:`grokspectra.dmft.reuse_memory` (one pooled χ array, reused by a smaller second run) give
    the same results as fresh runs, bit for bit."""
    from dmft_reference import run_dmft_reference

    cfg = dict(act="gelu", link="pr_clip", delta=3.0, eta=2.0, T=10, N=800, m=2, M0=[[0.5, 0.3]])
    f32 = dmft.run_dmft(**cfg, dtype=torch.float32, generator=5)
    ref32 = run_dmft_reference(**cfg, dtype=torch.float32, generator=5)
    for key in ("M", "Q", "R_F", "C_F"):
        torch.testing.assert_close(f32[key], ref32[key], rtol=0, atol=1e-4 * ref32[key].abs().max().item())
    fresh_big = dmft.run_dmft(**cfg, generator=6)
    fresh_small = dmft.run_dmft(**{**cfg, "T": 6}, generator=7)
    with dmft.reuse_memory():
        big = dmft.run_dmft(**cfg, generator=6)
        small = dmft.run_dmft(**{**cfg, "T": 6}, generator=7)
        assert dmft._POOL["buf"] is not None
    assert dmft._POOL["buf"] is None
    for key in ("M", "Q", "R_F", "train", "test"):
        assert torch.equal(big[key], fresh_big[key]) and torch.equal(small[key], fresh_small[key])


@pytest.mark.parametrize("act,m,eta", [("quad", 1, 0.1), ("quad", 2, 0.2), ("gelu", 2, 2.0)])
def test_float32_paths_lose_positive_definiteness_at_the_dnn_grids_steps(act, m, eta):
    """Why chapter 3's wider δ_NN cells stop doubling their paths instead of storing them in float32
    (``ch3.dnn_nmax``): at the grid's steps (η = 0.1·m Quad, 1.0·m GeLU; δ = 6, 60 steps) the float32 run stops
    with the covariance of w⁰ … wᵗ not positive definite (measured: within 6–20 steps, smallest eigenvalue
    ≈ −1e−8), while float64 on the same draw runs all 60 steps to a finite test risk. If an engine change makes
    float32 run through, chapter 3's cap (and this test) should be revisited."""
    cfg = dict(act=act, link="pr_clip", delta=6.0, eta=eta, T=60, N=4000, m=m, Q0=torch.eye(m, dtype=F64),
               generator=123)
    ok = dmft.run_dmft(**cfg)
    assert torch.isfinite(ok["test"]).all()
    with pytest.raises(dmft.DMFTError, match=r"not positive definite"):
        dmft.run_dmft(**cfg, dtype=torch.float32)


def test_a_diverging_closure_is_a_dmft_error():
    """The no-memory closure with a quadratic student at too large a step blows up (its covariance becomes
    non-finite within 15 steps): the engine says so as a DMFTError naming the step, not a LinAlgError from eigh."""
    with pytest.raises(dmft.DMFTError, match=r"w\^0\.\.w\^\d+"):
        dmft.run_dmft("quad", "pr_clip", 6.0, 0.2, 40, 400, 2, Q0=torch.eye(2, dtype=F64), memory=False, generator=0)


# --- the factored engine (dmft.run_dmft_factored: incremental factor of the history, fused response pass) ----------
@pytest.mark.parametrize("cfg", [
    dict(act="gelu", link="pr_clip", delta=3.0, eta=2.0, T=12, N=600, m=2, M0=[[0.5, 0.3]]),
    dict(act="quad", link="pr_clip", delta=6.0, eta=0.1, T=9, N=400, m=1, keep=[4, 9]),
    dict(act="gelu", link="pr", delta=4.0, eta=1.0, T=7, N=300, m=3, M0=[[0.2, 0.1, 0.0]], keep=[7], lam=0.01),
    dict(act="gelu", link="pr_clip", delta=3.0, eta=2.0, T=6, N=400, m=2, M0=[[0.5, 0.3]], memory=False),
], ids=["gelu-m2", "quad-m1-keep", "gelu-m3-ridge", "no-memory"])
def test_factored_engine_is_the_engine_while_no_direction_is_cut(cfg, monkeypatch):
    """Where no singular value of the history's factor falls below the cut, the incremental factor is the Cholesky
    factor row for row and the fused pass sums the same products in another order, so the factored engine gives
    :func:`~grokspectra.dmft.run_dmft`'s numbers on the same draw, to roundoff amplified by the recursion (the
    bound of ``test_engine_matches_the_square_layout_reference``, 10⁻⁹; measured ≤ 6·10⁻¹¹ when written). The cut
    is lowered to 10⁻⁸ here: at FACTOR_CUT = 10⁻⁴ the quadratic student's history (η = 0.1) reaches it at step 7,
    and from there the two engines draw different samples of the same law (Q differs by 10⁻³ at N = 400, within
    its Monte-Carlo error). A wrong block of the factor or of the tiled χ changes them at 10⁻² or more."""
    monkeypatch.setattr(dmft, "FACTOR_CUT", 1e-8)
    new = dmft.run_dmft_factored(**cfg, generator=3)
    ref = dmft.run_dmft(**cfg, generator=3)
    for key in ("M", "Q", "train", "test", "C_F", "R_F", "R_theta"):
        scale = ref[key].abs().max().item() + 1e-300
        assert (new[key] - ref[key]).abs().max().item() <= 1e-9 * scale, key
    for t in cfg.get("keep", ()):
        assert (new["law"][t]["u"] - ref["law"][t]["u"]).abs().max() <= 1e-7 * ref["law"][t]["u"].abs().max(), t


LATE = [("quad", 1, 0.1), ("quad", 2, 0.2), ("gelu", 2, 2.0), ("quad", 4, 0.4)]  # chapter 3's δ_NN grid's steps


@pytest.mark.parametrize("act,m,eta", LATE)
def test_late_steps_do_not_depend_on_the_order_of_summation(act, m, eta, monkeypatch):
    """At the δ_NN grid's 60 steps the history covariance has eigenvalues 10⁻¹⁰ of its largest: refactoring it
    each step (``run_dmft``) leaves which sample a late step draws to rounding. The factored engine run twice on
    the same draw, once with the compiled fused pass and once with the torch path (another order of summation),
    agrees to 10⁻⁶ relative in Q, R_F and the test risk (measured 4·10⁻¹⁰–1.6·10⁻⁷ when written: rounding
    amplified by at most 1/FACTOR_CUT², whereas ``run_dmft`` with its history refactored in another order moved
    Q_60 by 10⁻²; with the cut at 10⁻⁷ this reaches 10⁻²); and the law the paths realise is the stated one: the
    factor's L Lᵀ is within 10⁻⁴ of Q_⊥ over the whole history (measured 2–5·10⁻⁵, the price of the cut at
    FACTOR_CUT; the Monte-Carlo error at N = 2·10⁴ is 7·10⁻³)."""
    from grokspectra import chi_kernel as ck

    if ck.kernel() is None:
        pytest.skip("the fused kernel cannot be built here (no compiler): nothing to compare the torch path with")
    cfg = dict(act=act, link="pr_clip", delta=6.0, eta=eta, T=60, N=4000, m=m, Q0=torch.eye(m, dtype=F64),
               generator=123)
    fused = dmft.run_dmft_factored(**cfg)
    monkeypatch.setenv("GROKSPECTRA_CHI_KERNEL", "torch")
    plain = dmft.run_dmft_factored(**cfg)
    for key in ("Q", "R_F", "test"):
        assert (fused[key] - plain[key]).abs().max() <= 1e-6 * plain[key].abs().max(), key
    L, Q = fused["factor"], fused["Qperp_all"]
    assert (L @ L.T - Q).abs().max() <= 1e-4 * Q.abs().max()
    assert torch.isfinite(fused["test"]).all()


def test_factored_engine_errors():
    """Bad input and a diverging closure raise as in ``run_dmft``: the closure's blow-up is a DMFTError naming the
    step (its covariance becomes non-finite within 15 steps)."""
    with pytest.raises(ValueError, match="even number"):
        dmft.run_dmft_factored("gelu", "pr", 3.0, 2.0, 2, 101, 2)
    with pytest.raises(ValueError, match="keep steps"):
        dmft.run_dmft_factored("gelu", "pr", 3.0, 2.0, 2, 100, 2, keep=(5,))
    with pytest.raises(dmft.DMFTError, match=r"w\^0\.\.w\^\d+"):
        dmft.run_dmft_factored("quad", "pr_clip", 6.0, 0.2, 40, 400, 2, Q0=torch.eye(2, dtype=F64), memory=False,
                               generator=0)


def test_fused_pass_within_reuse_memory_is_bit_identical():
    """A pooled χ array (uninitialised, reused by a smaller run) gives the fresh run's numbers bit for bit: the
    tiles' padding beyond N is written, never read from old contents."""
    cfg = dict(act="gelu", link="pr_clip", delta=3.0, eta=2.0, T=10, N=300, m=2, M0=[[0.5, 0.3]])
    fresh_big, fresh_small = dmft.run_dmft_factored(**cfg, generator=6), dmft.run_dmft_factored(**{**cfg, "T": 6}, generator=7)
    with dmft.reuse_memory():
        big = dmft.run_dmft_factored(**cfg, generator=6)
        dmft._POOL["buf"].fill_(float("nan"))
        small = dmft.run_dmft_factored(**{**cfg, "T": 6}, generator=7)
    for key in ("M", "Q", "R_F", "train", "test"):
        assert torch.equal(big[key], fresh_big[key]) and torch.equal(small[key], fresh_small[key]), key


@pytest.mark.parametrize("act,m,eta", LATE)
def test_a_change_at_rounding_level_stays_at_rounding_level(act, m, eta):
    """Q_⊥(0,0) = (1 + 2⁻⁵⁰)·I instead of I (four units in the last place) on the same draw, 60 steps of the δ_NN
    grid: the factored engine moves Q, R_F and the test risk by at most 10⁻⁶ relative (measured 2·10⁻¹⁰–3·10⁻⁷
    when written), while :func:`~grokspectra.dmft.run_dmft`, which refactors the whole history each step, moves
    them by 10⁻⁵–10⁻² (measured 2.6·10⁻⁵–2.5·10⁻²; asserted > 10⁻⁶, the reason chapters move to the factored
    engine)."""
    cfg = dict(act=act, link="pr_clip", delta=6.0, eta=eta, T=60, N=4000, m=m, generator=123)
    I = torch.eye(m, dtype=F64)
    moved = {}
    for f in (dmft.run_dmft, dmft.run_dmft_factored):
        a, b = f(**cfg, Q0=I), f(**cfg, Q0=(1 + 2.0 ** -50) * I)
        moved[f.__name__] = max(((a[k] - b[k]).abs().max() / a[k].abs().max()).item() for k in ("Q", "R_F", "test"))
    assert moved["run_dmft_factored"] <= 1e-6, moved
    assert moved["run_dmft"] > 1e-6, moved
