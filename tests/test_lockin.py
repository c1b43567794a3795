"""Tests of the rolling update-Gram spectra and the lock-in detectors (grokspectra.lockin).

Gram spectra are compared with eigenvalues computed directly from random update matrices (a per-window loop,
float64, and squared singular values of the window as a second method). Detectors are run on synthetic series
whose firing epochs follow in closed form.
"""

import math

import numpy as np
import pytest
import torch

from grokspectra import lockin


def _updates(R=3, S=45, P=40, seed=0):
    """Random updates with a decaying spectrum plus a rank-2 drift (like a locked-in run), float64."""
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(R, S, P, generator=g, dtype=torch.float64) * torch.logspace(0, -3, S, dtype=torch.float64)[:, None]
    u = torch.randn(R, 2, P, generator=g, dtype=torch.float64)
    c = torch.randn(R, S, 2, generator=g, dtype=torch.float64)
    return D + c @ u


def _direct(D, W, k):
    """σ₁…σ_k of ΔᵀΔ for the window of steps max(1, t−W+1)…t, by a plain loop (the reference)."""
    R, S, _ = D.shape
    out = torch.full((R, S + 1, k), float("nan"), dtype=torch.float64)
    for t in range(2, S + 1):
        Delta = D[:, max(1, t - W + 1) - 1:t, :].transpose(1, 2)  # [R, P, n]
        ev = torch.linalg.eigvalsh(Delta.transpose(1, 2) @ Delta).flip(-1)
        m = min(k, ev.shape[-1])
        out[:, t, :m] = ev[:, :m]
    return out


def test_band_from_updates_definition():
    D = _updates(R=2, S=10, P=7)
    band = lockin.band_from_updates(D, B=4)
    assert band.shape == (2, 11, 4)
    assert torch.isnan(band[:, 0]).all() and torch.isnan(band[:, 2, 2:]).all()
    for t, k in [(1, 0), (5, 3), (10, 2), (4, 3)]:
        torch.testing.assert_close(band[:, t, k], (D[:, t - 1] * D[:, t - 1 - k]).sum(-1))


@pytest.mark.parametrize("W", [2, 5, 20, 30])
def test_rolling_eigs_match_direct_eigenvalues(W):
    D = _updates()
    band = lockin.band_from_updates(D, B=30)
    k = min(5, W)
    got = lockin.rolling_eigs(band, W, k=k)
    ref = _direct(D, W, k)
    assert got.shape == ref.shape
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    ok = ~torch.isnan(ref)
    # float64 eigvalsh of the same Gram assembled two ways: agreement to round-off relative to σ₁
    scale = ref[..., :1].abs().nan_to_num(1.0)
    assert ((got - ref).abs() / scale)[ok].max() < 1e-12


def test_rolling_eigs_equal_squared_singular_values():
    D = _updates(R=2, S=35, P=60, seed=1)
    band = lockin.band_from_updates(D, B=30)
    got = lockin.rolling_eigs(band, 20, k=5)
    t = 33
    sv = torch.linalg.svdvals(D[:, t - 20:t, :])[:, :5] ** 2  # second method: squared singular values of Δ
    torch.testing.assert_close(got[:, t], sv, rtol=1e-10, atol=1e-12 * float(sv.max()))


def test_window_start_convention():
    """Xu's tracker: nothing at t ≤ 1, σ₁ and σ₂ from t = 2, σ₂/σ₃ from t = 3."""
    band = lockin.band_from_updates(_updates(R=1, S=8), B=5)
    e = lockin.rolling_eigs(band, 5, k=3)
    assert torch.isnan(e[0, :2]).all()
    assert not torch.isnan(e[0, 2, :2]).any() and torch.isnan(e[0, 2, 2])
    assert not torch.isnan(e[0, 3:]).any()
    r12, r23 = lockin.ratios(e)
    assert np.isnan(r23[0, 2]) and np.isfinite(r23[0, 3:]).all()


def test_chunking_does_not_change_results():
    band = lockin.band_from_updates(_updates(R=2, S=40), B=10)
    a = lockin.rolling_eigs(band, 10, k=4)
    b = lockin.rolling_eigs(band, 10, k=4, chunk=10 * 10 * 2 * 3)  # 3 epochs per chunk
    torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)


def test_float32_band_is_accurate_to_single_precision():
    D = _updates(R=2, S=30, P=50)
    b64 = lockin.band_from_updates(D, B=20)
    e64 = lockin.rolling_eigs(b64, 20, k=2)
    e32 = lockin.rolling_eigs(b64.float(), 20, k=2)
    ok = ~torch.isnan(e64)
    assert ((e32 - e64).abs() / e64[..., :1])[ok].max() < 1e-5  # float32 rounding of the inner products


def test_non_finite_band_gives_nan_only_where_it_enters():
    """A diverged step (NaN inner products) poisons exactly the windows that contain it."""
    band = lockin.band_from_updates(_updates(R=2, S=40), B=10)
    bad = band.clone()
    bad[1, 20, :] = float("nan")  # step 20 of run 1: its row of inner products with steps 11…20
    e = lockin.rolling_eigs(bad, 5, k=3)
    ref = lockin.rolling_eigs(band, 5, k=3)
    hit = torch.zeros(41, dtype=torch.bool)
    hit[20:25] = True  # the W = 5 windows that contain step 20 end at t = 20…24
    assert torch.isnan(e[1, hit]).all()
    torch.testing.assert_close(e[1, ~hit], ref[1, ~hit], equal_nan=True)
    torch.testing.assert_close(e[0], ref[0], equal_nan=True)


def test_first_step_zero_convention():
    """A band whose row 0 already holds an update (first_step=0) gives the same spectra shifted by one row."""
    band = lockin.band_from_updates(_updates(R=1, S=30), B=8)
    shifted = lockin.rolling_eigs(band[:, 1:], 8, k=4, first_step=0)
    torch.testing.assert_close(shifted, lockin.rolling_eigs(band, 8, k=4)[:, 1:], equal_nan=True)


def test_window_larger_than_band_is_an_error():
    band = lockin.band_from_updates(_updates(R=1, S=5), B=4)
    with pytest.raises(ValueError, match="band width"):
        lockin.rolling_eigs(band, 5)
    with pytest.raises(ValueError, match="k <= W"):
        lockin.rolling_eigs(band, 3, k=4)


# --- detectors ----------------------------------------------------------------------------------------------
def _exp_ramp(T, start, rate):
    t = np.arange(T, dtype=float)
    return np.exp(rate * np.clip(t - start, 0, None))


def test_slope_fire_closed_form():
    # ln r rises at rate 0.1 from t = 150: s(t) = 0.1 (t − 150)/25 for 150 ≤ t ≤ 175, > 0.04 first at t = 161
    r = _exp_ramp(400, 150, 0.1)
    assert lockin.slope_fire(r) == 161
    # a steady slope of 0.039 never fires, 0.041 fires at the first allowed epoch 100
    assert np.isnan(lockin.slope_fire(_exp_ramp(300, 0, 0.039)))
    assert lockin.slope_fire(_exp_ramp(300, 0, 0.041)) == 100


def test_slope_fire_respects_ep_min_and_is_batched():
    early = _exp_ramp(300, 40, 0.2)
    early[70:] = early[70]  # growth only in 40…70: slope 0 from epoch 95 on
    late = _exp_ramp(300, 200, 0.1)
    flat = np.ones(300)
    both = early * late  # early growth ignored, late growth fires at 211
    got = lockin.slope_fire(np.stack([early, late, flat, both]))
    np.testing.assert_array_equal(got, [np.nan, 211, np.nan, 211])
    assert lockin.slope_fire(early, ep_min=0) == 40 + 6  # 0.2 (t−40)/25 > 0.04 ⇔ t > 45


def test_slope_clip_and_nan():
    r = np.zeros(200)
    r[130:] = 1.0  # clipped 1e-6 → 1: slope ln(1e6)/25 ≈ 0.55 at t = 130
    assert lockin.slope_fire(r) == 130
    r = np.full(200, np.nan)
    assert np.isnan(lockin.slope_fire(r))
    s = lockin.log_slope(_exp_ramp(60, 0, 0.05))
    assert np.isnan(s[:25]).all() and np.allclose(s[25:], 0.05)


def test_max_slope_is_the_detector_statistic():
    """slope_fire(r, θ) fires iff max_slope(r) > θ, for random positive series and several θ."""
    rng = np.random.default_rng(0)
    r = np.exp(np.cumsum(rng.normal(0, 0.3, size=(50, 300)), axis=-1))
    r[:5, :] = np.nan  # all-NaN runs: no statistic, no fire
    m = lockin.max_slope(r)
    assert np.isnan(m[:5]).all() and np.isfinite(m[5:]).all()
    for th in (0.0, 0.02, 0.04, 0.08):
        np.testing.assert_array_equal(np.isfinite(lockin.slope_fire(r, thresh=th)), m > th)


def test_unlock_epoch_closed_form():
    """A series that rises ×100 from epoch 150 to 250, holds, and falls ×50 at epoch 350: the trailing 25-epoch
    median peaks where it first reaches the plateau's top and falls below a tenth of it 13 epochs after the fall
    (half the window), with single-epoch spikes ignored; a plateau that never falls, a rise of only ×5 and a
    series without any rise give NaN where they should."""
    T = 501
    t = np.arange(T, dtype=float)
    up = np.clip((t - 150) / 100, 0, 1)
    r = 2.0 * 100.0 ** up
    r[t >= 350] = 4.0
    r[400] = 1e4  # one spike after the end changes nothing
    never = 2.0 * 100.0 ** up
    weak = 2.0 * 5.0 ** up
    flat = np.full(T, 1.5)
    peak, end = lockin.unlock_epoch(np.stack([r, never, weak, flat]))
    assert peak[0] >= 250 and peak[0] < 350 and end[0] == 350 + 12
    assert peak[1] >= 250 and np.isnan(end[1])
    assert np.isnan(peak[2]) and np.isnan(end[2]) and np.isnan(peak[3]) and np.isnan(end[3])
    r_nan = r.copy()
    r_nan[1::2] = np.nan  # a Gram every other epoch: the same end within the window's resolution
    p2, e2 = lockin.unlock_epoch(r_nan)
    assert abs(e2 - end[0]) <= 2
    with pytest.raises(ValueError):
        lockin.unlock_epoch(r, frac=1.5)
    with pytest.raises(ValueError):
        lockin.unlock_epoch(r[:50])


def test_auc_against_mann_whitney():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(1)
    pos, neg = rng.normal(1, 1, 40).round(1), rng.normal(0, 1, 30).round(1)  # rounding makes ties
    u = mannwhitneyu(pos, neg, alternative="greater").statistic
    assert lockin.auc(pos, neg) == pytest.approx(u / (40 * 30), abs=1e-12)
    assert lockin.auc([3, 4], [1, 2]) == 1.0 and lockin.auc([1], [1]) == 0.5
    assert math.isnan(lockin.auc([], [1.0])) and math.isnan(lockin.auc([np.nan], [1.0]))


def test_threshold_fire_sustained():
    x = np.array([0, 0, 30, 0, 30, 30, 30, 30, 30, 0, 0], float)
    assert lockin.threshold_fire(x, 25) == 2
    assert lockin.threshold_fire(x, 25, sustained=5) == 4
    assert np.isnan(lockin.threshold_fire(x, 25, sustained=6))
    assert lockin.threshold_fire(x, 25, ep_min=3) == 4
    assert lockin.threshold_fire(x, 25, ep_min=5, sustained=4) == 5
    x2 = np.array([np.nan, 40, 40, 40])
    assert lockin.threshold_fire(x2, 25, sustained=3) == 1
    np.testing.assert_array_equal(lockin.threshold_fire(np.stack([x, x[::-1]]), 25, sustained=5), [4, 2])


def test_rho_fire_sparse_epochs_and_first_epoch():
    rho = np.array([[0.06, 0.07, 0.08, 0.09], [0.05, 0.05, 0.06, 0.06]])
    np.testing.assert_array_equal(lockin.rho_fire(rho, 0.075, epochs=np.array([0, 5, 10, 15])), [10, np.nan])
    np.testing.assert_array_equal(lockin.rho_fire(rho, 0.070), [1, np.nan])
    acc = np.array([0.01, 0.2, 0.6, 0.4, 0.995, 1.0])
    assert lockin.first_epoch(acc, 0.5) == 2 and lockin.first_epoch(acc, 0.99) == 4


def test_late_median_and_ratios():
    x = np.arange(10.0)[None].repeat(2, 0)
    np.testing.assert_array_equal(lockin.late_median(x, 2, 6), [4.0, 4.0])
    with pytest.raises(ValueError, match="late window"):
        lockin.late_median(x, 5, 10)
    r12, r23 = lockin.ratios(np.array([[8.0, 2.0, 0.5]]))
    assert r12[0] == 4.0 and r23[0] == 4.0


def test_confusion_lead_and_fit():
    fired = np.array([1, 1, 0, 0, 1, 0], bool)
    grok = np.array([1, 0, 1, 0, 1, 0], bool)
    c = lockin.confusion(fired, grok)
    assert (c["tp"], c["fp"], c["fn"], c["tn"]) == (2, 1, 1, 2)
    assert c["sensitivity"] == pytest.approx(2 / 3) and c["specificity"] == pytest.approx(2 / 3)
    assert c["precision"] == pytest.approx(2 / 3) and c["accuracy"] == pytest.approx(4 / 6)
    assert math.isnan(lockin.confusion(np.zeros(2, bool), np.zeros(2, bool))["sensitivity"])
    np.testing.assert_array_equal(lockin.lead([17, np.nan], [101, 50]), [84, np.nan])
    x = np.array([100, 170, 300, 312, np.nan])
    a, b, r2, n = lockin.linfit(x, 0.8 * x - 75)
    assert (a, b, r2, n) == pytest.approx((0.8, -75, 1.0, 4))
    with pytest.raises(ValueError, match="3 finite"):
        lockin.linfit([1, 2], [1, 2])
    assert lockin.median_iqr([1, 2, 3, np.nan]) == (2.0, 1.5, 2.5)
    np.testing.assert_allclose(lockin.p_crit([41, 71, 127], 2.7482), [0.249, 0.165, 0.105], atol=1e-3)
    np.testing.assert_allclose(lockin.p_crit([41, 71, 127]), [0.091, 0.060, 0.038], atol=1e-3)


# --- the engine's incremental band against the updates themselves --------------------------------------------
def test_engine_band_matches_direct_updates():
    """modadd.train's ring-buffer band equals inner products of the weight differences it returns, and the
    rolling spectra built from it equal eigenvalues of ΔᵀΔ computed from those differences (float32 training,
    so agreement to single precision relative to σ₁)."""
    from grokspectra import modadd

    E, B = 40, 8
    out = modadd.train(7, 16, 30, "x2", [2e-4, 0.0], [0, 1], E, band=B, gram_every=10, gram_dense=0,
                       keep_F_epochs=range(E + 1), progress=False)
    Wt = out["W_at"].double()  # [E+1, R, K, 2M]
    D = (Wt[1:] - Wt[:-1]).flatten(2).transpose(0, 1)  # [R, E, P]: ΔW_1 … ΔW_E
    ref = lockin.band_from_updates(D, B)
    got = out["dW_band"]
    assert got.shape == ref.shape
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    scale = ref[:, 1:, 0].abs().max()
    ok = ~torch.isnan(ref)
    assert ((got - ref).abs()[ok] / scale).max() < 1e-4
    e_got = lockin.rolling_eigs(got, B, k=3)
    e_ref = _direct(D, B, 3)
    ok = ~torch.isnan(e_ref)
    assert torch.equal(ok, ~torch.isnan(e_got))
    assert ((e_got - e_ref).abs() / e_ref[..., :1])[ok].max() < 1e-3


def test_runs_table_events():
    from grokspectra.experiments import ch7

    T = 300
    acc = np.stack([np.clip(np.arange(T + 1) / 200, 0, 1), np.full(T + 1, 0.03)])
    r23 = np.stack([_exp_ramp(T + 1, 150, 0.1), np.ones(T + 1)])
    ev = ch7.runs_table(acc, r23, rho=np.array([[0.05, 0.08], [0.05, 0.06]]), gram_epochs=np.array([0, 20]))
    np.testing.assert_array_equal(ev["fire"], [161, np.nan])
    np.testing.assert_array_equal(ev["t05"], [100, np.nan])
    np.testing.assert_array_equal(ev["t99"], [198, np.nan])  # 198/200 = 0.99
    np.testing.assert_array_equal(ev["grok"], [True, False])
    np.testing.assert_array_equal(ev["t_rho"], [20, np.nan])
    np.testing.assert_allclose(ev["late"], [np.median(r23[0, 150:301]), 1.0])


def test_chapter_experiments_bookkeeping(tmp_path):
    """The chapter's experiments at toy size, assembled from their units: arm layout of the headline (η first,
    then η = 0, same seeds) and the NaN padding and training-set sizes of the M × p grid."""
    from grokspectra.experiments import ch7
    from grokspectra.store import Store

    store = Store(tmp_path)
    run = lambda e, q: e.run({**q, "profile": "toy", "device": "cpu"}, store=store, show=False)  # noqa: E731
    p = {"M": 7, "K": 16, "frac": 0.5, "eta": 2e-4, "seeds": 2, "epochs": 40, "window": 6, "windows": [3, 6],
         "band": 6, "gram_every": 10, "gram_dense": 0}
    h = run(ch7.headline, p)
    np.testing.assert_array_equal(h["etas"], [2e-4, 2e-4, 0, 0])
    np.testing.assert_array_equal(h["seeds"], [0, 1, 0, 1])
    assert h["eigW6"].shape == (4, 41, 5) and h["eigV"].shape == (4, 41, 5)
    assert np.isnan(h["eigW3"][:, :, 3:]).all()  # a 3-column window has only σ₁…σ₃
    with pytest.raises(ValueError, match="band"):
        run(ch7.headline, {**p, "windows": [3, 8]})
    g = run(ch7.grid, {"K": 16, "eta": 2e-4, "grid_M": [5, 7], "grid_p": [0.4, 0.6], "grid_seeds": 2,
                       "grid_epochs": [30, 40], "window": 6, "gram_every": 10, "gram_dense": 0})
    np.testing.assert_array_equal(g["n"], [[10, 15], [20, 29]])
    assert g["test_acc"].shape == (2, 2, 2, 41)
    assert np.isnan(g["test_acc"][0, :, :, 31:]).all() and np.isfinite(g["test_acc"][0, :, :, :31]).all()
    assert np.isfinite(g["test_acc"][1]).all()


def test_float64_rerun_follows_the_float32_run(tmp_path):
    """ch7.precision reruns seeds of the η sweep in float64: at toy size the trajectory is the float32 one (test
    accuracy and train loss to float32 rounding, σ₁ and σ₂ of the rolling Gram to 1e-3 relative), and a
    prec_eta outside the sweep or more seeds than it has are errors."""
    from grokspectra.experiments import ch7
    from grokspectra.store import Store

    store = Store(tmp_path)
    run = lambda e, q: e.run({**q, "profile": "toy", "device": "cpu"}, store=store, show=False)  # noqa: E731
    p = {"M": 7, "K": 16, "frac": 0.5, "sweep_etas": [0.0, 2e-4], "sweep_seeds": 2, "sweep_epochs": 40, "window": 6,
         "gram_every": 10, "gram_dense": 0, "prec_eta": 2e-4, "prec_seeds": 2}
    es = run(ch7.eta_sweep, p)
    pr = run(ch7.precision, p)
    ps = ch7.precision_summary(es, pr)
    assert ps["n"] == 2 and np.all(ps["dacc"] < 1e-6)  # the same predictions (accuracies stored in float32)
    sel = np.isclose(es["etas"], 2e-4)
    np.testing.assert_allclose(pr["train_loss"], es["train_loss"][sel], rtol=1e-4)
    e32, e64 = es["eigW6"][sel][:, 10:], pr["eigW"][:, 10:]
    np.testing.assert_allclose(e64[..., :2], e32[..., :2], rtol=1e-3)
    with pytest.raises(ValueError, match="sweep_etas"):
        run(ch7.precision, {**p, "prec_eta": 1e-3})
    with pytest.raises(ValueError, match="sweep_seeds"):
        run(ch7.precision, {**p, "prec_seeds": 3})
