"""Spectral lock-in: rolling update-Gram spectra and the detectors of Xu (arXiv:2605.08119).

Everything here works on what the engine logs, never on the weights themselves.

* The *band* of update inner products. With ΔW_t = W after optimiser step t − W before it
  (flattened, no centring), the engine keeps ``band[..., t, k] = <ΔW_t, ΔW_{t-k}>`` for lags k < B; rows or
  lags that reach before the first step are NaN. The window-W Gram G_t = ΔᵀΔ with
  Δ = [ΔW_{t-W+1}, …, ΔW_t] only needs lags < W, so one band of width B serves every window W ≤ B.
* :func:`rolling_eigs` assembles every G_t from the band and returns its eigenvalues σ₁ ≥ σ₂ ≥ … (eigenvalues
  of ΔᵀΔ, i.e. squared singular values of Δ), batched over runs and epochs.
* Detectors are plain functions over logged series ``[..., T]`` indexed by epoch,
  returning the first firing epoch per run (NaN: never fired).
* Helpers for the beyond-the-paper analysis: confusion table of detector fire vs grokking, lead/lag, a least-
  squares line with R², and Tian's critical training fraction.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch


# --- the update band and rolling Gram spectra ---------------------------------------------------------------
def band_from_updates(D: torch.Tensor, B: int) -> torch.Tensor:
    """The band of update inner products computed directly from stacked updates (reference implementation).

    Parameters
    ----------
    D : Tensor ``[..., S, P]``
        Row s−1 is the flattened update ΔW_s of optimiser step s = 1…S.
    B : int
        Number of lags kept.

    Returns
    -------
    Tensor ``[..., S + 1, B]``
        ``band[..., t, k] = <ΔW_t, ΔW_{t-k}>``, NaN where t − k < 1 (row 0 is all NaN: no step 0).
    """
    if B < 1:
        raise ValueError(f"band width B must be >= 1, got {B}")
    S = D.shape[-2]
    G = D @ D.transpose(-1, -2)  # [..., S, S], G[a, b] = <ΔW_{a+1}, ΔW_{b+1}>
    t = torch.arange(S + 1, device=D.device)[:, None]
    k = torch.arange(B, device=D.device)[None, :]
    s = t - k
    valid = (s >= 1) & (t >= 1)
    a = (t - 1).clamp(min=0).expand(-1, B)
    b = (s - 1).clamp(min=0)
    out = G[..., a, b]
    return torch.where(valid, out, torch.full_like(out, float("nan")))


def rolling_gram(band: torch.Tensor, W: int, first_step: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Window-W Grams of the updates, assembled from the band (Xu's ``EigengapTracker`` convention).

    At row t the window holds the steps max(first_step, t−W+1) … t; before the window fills it holds all steps
    so far. Columns of steps before ``first_step`` are zero, which leaves the nonzero spectrum of the Gram of the
    valid columns unchanged.

    Parameters
    ----------
    band : Tensor ``[..., T, B]``
        ``band[..., t, k] = <ΔW_t, ΔW_{t-k}>`` (row t = step t), NaN where undefined.
    W : int
        Window size, 1 ≤ W ≤ B.
    first_step : int
        The first row that holds an update (1 for the engine's band, whose row 0 is the initial state).

    Returns
    -------
    G : Tensor ``[..., T, W, W]``
        ``G[..., t, i, j] = <ΔW_{t-W+1+i}, ΔW_{t-W+1+j}>`` (zero where a column is invalid; NaN entries of the
        band inside the window, e.g. from a diverged run, stay NaN).
    n : Tensor ``[T]`` (int64)
        Number of valid columns in each window.
    """
    T, B = band.shape[-2], band.shape[-1]
    if not 1 <= W <= B:
        raise ValueError(f"window W={W} needs 1 <= W <= band width B={B} (the Gram uses lags 0…W-1)")
    dev = band.device
    t = torch.arange(T, device=dev)
    i = torch.arange(W, device=dev)
    step = t[:, None] - W + 1 + i[None, :]  # [T, W]: step held in column i at row t
    col_ok = (step >= first_step) & (step >= 0)
    hi = torch.maximum(i[:, None], i[None, :])
    row = (t[:, None, None] - W + 1 + hi).clamp(min=0)  # [T, W, W]: the later step of the pair
    lag = (i[:, None] - i[None, :]).abs()  # [W, W]
    g = band[..., row, lag]
    ok = col_ok[:, :, None] & col_ok[:, None, :]
    G = torch.where(ok, g, torch.zeros((), dtype=g.dtype, device=dev))
    return G, col_ok.sum(-1)


def rolling_eigs(band: torch.Tensor, W: int, k: int = 5, *, first_step: int = 1,
                 dtype: torch.dtype = torch.float64, chunk: int = 2_000_000) -> torch.Tensor:
    """Top-k eigenvalues σ₁ ≥ … ≥ σ_k of every rolling window-W update Gram.

    Parameters
    ----------
    band : Tensor ``[..., T, B]``
        The engine's band of update inner products (see :func:`rolling_gram`).
    W : int
        Window size (≤ B).
    k : int
        Number of eigenvalues returned (≤ W).
    first_step : int
        First row of the band that holds an update (see :func:`rolling_gram`).
    dtype : torch.dtype
        Precision of the eigensolver (float64 by default: σ₃ can be 10⁻⁵ σ₁ after lock-in).
    chunk : int
        Upper bound on the number of Gram entries assembled at once (memory bound); the loop runs over epoch
        chunks, never over runs.

    Returns
    -------
    Tensor ``[..., T, k]``
        σ_j(t) in descending order; NaN where the window holds fewer than j columns or fewer than two
        (σ₂/σ₃ therefore exists from t = 3, as in Xu's tracker), and NaN for every σ_j where the window's Gram
        has a non-finite entry (a diverged run).
    """
    if not 1 <= k <= W:
        raise ValueError(f"need 1 <= k <= W, got k={k}, W={W}")
    band = band.to(dtype)
    T = band.shape[-2]
    batch = math.prod(band.shape[:-2]) or 1
    step = max(1, chunk // (batch * W * W))
    outs = []
    for t0 in range(0, T, step):
        lo = max(0, t0 - W + 1)  # rows the window of row t0 reaches back to
        G, n = rolling_gram(band[..., lo:t0 + step, :], W, first_step - lo)
        G, n = G[..., t0 - lo:, :, :], n[t0 - lo:]
        finite = torch.isfinite(G).all(-1).all(-1)  # [..., t]
        G = torch.where(finite[..., None, None], G, torch.zeros((), dtype=G.dtype, device=G.device))
        ev = torch.linalg.eigvalsh(G).flip(-1)[..., :k]  # descending
        j = torch.arange(1, k + 1, device=band.device)
        keep = (j <= n[:, None]) & (n[:, None] >= 2) & finite[..., None]
        outs.append(torch.where(keep, ev, torch.full_like(ev, float("nan"))))
    return torch.cat(outs, dim=-2)


def ratios(eigs: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """σ₁/σ₂ and σ₂/σ₃ from descending eigenvalues ``[..., T, k≥3]`` (numpy, NaN where undefined)."""
    e = np.asarray(eigs.cpu() if isinstance(eigs, torch.Tensor) else eigs, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return e[..., 0] / e[..., 1], e[..., 1] / e[..., 2]


# --- detectors over logged series ----------------------------------------------------------------------------
def _first_true(mask: np.ndarray, epochs: np.ndarray | None = None) -> np.ndarray:
    """Epoch of the first True along the last axis (NaN if none)."""
    mask = np.asarray(mask, dtype=bool)
    T = mask.shape[-1]
    ep = np.arange(T) if epochs is None else np.asarray(epochs)
    idx = mask.argmax(-1)
    return np.where(mask.any(-1), ep[idx].astype(float), np.nan)


def log_slope(r: np.ndarray, window: int = 25, clip: float = 1e-6) -> np.ndarray:
    """Backward natural-log slope s(t) = [ln r(t) − ln r(t−window)] / window (X-tex-final eq. slope).

    ``r`` is clipped at ≥ ``clip`` before the log (Xu's convention); NaN for t < window or where r is NaN.
    """
    r = np.asarray(r, dtype=float)
    if window < 1:
        raise ValueError(f"slope window must be >= 1, got {window}")
    lr = np.log(np.where(np.isnan(r), np.nan, np.maximum(r, clip)))
    s = np.full_like(lr, np.nan)
    s[..., window:] = (lr[..., window:] - lr[..., :-window]) / window
    return s


def slope_fire(r: np.ndarray, *, window: int = 25, thresh: float = 0.04, ep_min: int = 100,
               clip: float = 1e-6) -> np.ndarray:
    """Xu's lock-in detector: first epoch t ≥ ``ep_min`` with log-slope s(t) > ``thresh``.

    Parameters
    ----------
    r : array ``[..., T]``
        σ₂/σ₃ per epoch (index = epoch).
    window, thresh, ep_min, clip
        Xu's constants 25, 0.04, 100, 1e-6; no persistence requirement (first crossing counts).

    Returns
    -------
    array ``[...]``
        The firing epoch, NaN when it never fires.
    """
    s = log_slope(r, window, clip)
    ep = np.arange(s.shape[-1])
    with np.errstate(invalid="ignore"):
        return _first_true((s > thresh) & (ep >= ep_min))


def max_slope(r: np.ndarray, *, window: int = 25, ep_min: int = 100, clip: float = 1e-6) -> np.ndarray:
    """Largest log-slope s(t) over t ≥ ``ep_min`` (NaN if none is defined). :func:`slope_fire` with threshold θ
    fires exactly when this exceeds θ, so it is the threshold-free statistic of Xu's detector."""
    s = log_slope(r, window, clip)[..., ep_min:]
    ok = np.isfinite(s)
    return np.where(ok.any(-1), np.where(ok, s, -np.inf).max(-1, initial=-np.inf), np.nan)


def unlock_epoch(r: np.ndarray, *, frac: float = 0.1, rise: float = 10.0, smooth: int = 25, ep_min: int = 100
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Peak and end of a lock-in (a book definition; Xu's papers have no notion of the lock-in ending).

    With m(t) the median of σ₂/σ₃ over the trailing ``smooth`` epochs (single-epoch spikes do not count), the peak
    is the epoch t ≥ ``ep_min`` of largest m(t). It is a lock-in when m rose to it by at least a factor ``rise``
    from its lowest value since ``ep_min``, and the lock-in has ended at the first later epoch with
    m(t) < ``frac`` · m(peak). Both epochs are causal: an online monitor could report them.

    Parameters
    ----------
    r : array ``[..., T]``
        σ₂/σ₃ per epoch (index = epoch); NaN epochs (no Gram logged) are left out of the medians.
    frac, rise
        The fall that counts as an end, relative to the peak (0.1: a factor of ten), and the rise before the peak
        that counts as a lock-in.
    smooth, ep_min
        Trailing median window, and the first epoch the peak may lie at (Xu's detector starts at 100).

    Returns
    -------
    (peak, end) : arrays ``[...]``
        Epochs; ``peak`` is NaN when there was no lock-in, ``end`` when it has not ended by the end of the run.
    """
    r = np.asarray(r, dtype=float)
    if not 0 < frac < 1:
        raise ValueError(f"frac must lie in (0, 1), got {frac}")
    if rise < 1:
        raise ValueError(f"rise must be >= 1, got {rise}")
    if smooth < 1 or r.shape[-1] < ep_min + 1:
        raise ValueError(f"need smooth >= 1 and more than ep_min = {ep_min} epochs, got {smooth} and {r.shape[-1]}")
    pad = np.concatenate([np.full(r.shape[:-1] + (smooth - 1,), np.nan), r], -1)
    win = np.lib.stride_tricks.sliding_window_view(pad, smooth, axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows (no Gram yet) give NaN
        m = np.nanmedian(win, -1)
    ep = np.arange(r.shape[-1])
    mm = np.where((ep >= ep_min) & np.isfinite(m), m, -np.inf)
    k = mm.argmax(-1)
    top = np.take_along_axis(mm, k[..., None], -1)
    low = np.where(ep <= k[..., None], np.where(np.isfinite(mm), mm, np.inf), np.inf).min(-1)
    with np.errstate(invalid="ignore"):
        locked = np.isfinite(top[..., 0]) & (top[..., 0] >= rise * low)
    peak = np.where(locked, k.astype(float), np.nan)
    with np.errstate(invalid="ignore"):
        end = _first_true((ep > k[..., None]) & np.isfinite(m) & (m < frac * top))
    return peak, np.where(np.isfinite(peak), end, np.nan)


def threshold_fire(x: np.ndarray, thresh: float, *, ep_min: int = 0, sustained: int = 1) -> np.ndarray:
    """First epoch t ≥ ``ep_min`` with x(t) ≥ ``thresh`` for ``sustained`` consecutive epochs t … t+sustained−1.

    Covers the absolute σ₂/σ₃ threshold (σ₂/σ₃ ≥ 50), the σ₁/σ₂ thresholds with 'sustained k' and
    the ρ_tian thresholds from epoch 0. NaN values never count as above. Returns the first epoch
    of the sustained stretch, NaN when there is none.
    """
    if sustained < 1:
        raise ValueError(f"sustained must be >= 1, got {sustained}")
    x = np.asarray(x, dtype=float)
    with np.errstate(invalid="ignore"):
        above = (x >= thresh).astype(np.int64)
    T = above.shape[-1]
    c = np.concatenate([np.zeros(above.shape[:-1] + (1,), np.int64), above.cumsum(-1)], axis=-1)
    n = T - sustained + 1
    if n <= 0:
        return np.full(above.shape[:-1], np.nan)
    run = c[..., sustained:sustained + n] - c[..., :n] == sustained  # run[t]: all of t … t+sustained−1 above
    return _first_true(run & (np.arange(n) >= ep_min))


def rho_fire(rho: np.ndarray, thresh: float = 0.075, epochs: np.ndarray | None = None) -> np.ndarray:
    """ρ_tian initiation detector: first logged epoch with ρ ≥ ``thresh``, from epoch 0.

    ``epochs`` gives the epoch of each column when ρ is logged sparsely (the engine's ``gram_epochs``).
    """
    rho = np.asarray(rho, dtype=float)
    with np.errstate(invalid="ignore"):
        return _first_true(rho >= thresh, epochs)


def first_epoch(acc: np.ndarray, level: float) -> np.ndarray:
    """First epoch with accuracy ≥ ``level`` (Xu: transition time at 0.5, 'groks' at 0.99)."""
    return threshold_fire(acc, level)


def late_median(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Per-run median of x over epochs lo … hi inclusive, ignoring NaN (Xu's 'late σ₂/σ₃')."""
    x = np.asarray(x, dtype=float)
    if not 0 <= lo <= hi < x.shape[-1]:
        raise ValueError(f"late window [{lo}, {hi}] outside the logged epochs 0…{x.shape[-1] - 1}")
    return np.nanmedian(x[..., lo:hi + 1], axis=-1)


# --- summaries ---------------------------------------------------------------------------------------------
def median_iqr(x: np.ndarray) -> tuple[float, float, float]:
    """Median and 25th/75th percentiles of the finite entries (NaN triple when there are none)."""
    x = np.asarray(x, dtype=float).ravel()
    x = x[np.isfinite(x)]
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    q = np.percentile(x, [50, 25, 75])
    return float(q[0]), float(q[1]), float(q[2])


def confusion(fired: np.ndarray, positive: np.ndarray) -> dict[str, float]:
    """Confusion table of a detector against an outcome (e.g. fired vs grokked), with rates.

    Returns counts ``tp, fp, fn, tn`` and ``sensitivity = tp/(tp+fn)``, ``specificity = tn/(tn+fp)``,
    ``precision = tp/(tp+fp)``, ``accuracy`` (NaN when a denominator is zero).
    """
    f = np.asarray(fired, dtype=bool).ravel()
    y = np.asarray(positive, dtype=bool).ravel()
    if f.shape != y.shape:
        raise ValueError(f"fired {f.shape} and positive {y.shape} differ in size")
    tp, fp = int((f & y).sum()), int((f & ~y).sum())
    fn, tn = int((~f & y).sum()), int((~f & ~y).sum())

    def rate(a, b):
        return a / (a + b) if a + b else math.nan

    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "sensitivity": rate(tp, fn), "specificity": rate(tn, fp),
            "precision": rate(tp, fp), "accuracy": rate(tp + tn, fp + fn)}


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve of a score that should be larger for ``pos`` than for ``neg``:
    P(score_pos > score_neg) + ½ P(tie) over all pairs (the Mann–Whitney U / (n₊n₋)); NaN entries are dropped,
    NaN when either class is empty."""
    p = np.asarray(pos, float).ravel()
    n = np.asarray(neg, float).ravel()
    p, n = p[np.isfinite(p)], n[np.isfinite(n)]
    if p.size == 0 or n.size == 0:
        return math.nan
    return float((p[:, None] > n[None, :]).mean() + 0.5 * (p[:, None] == n[None, :]).mean())


def lead(t_detector: np.ndarray, t_reference: np.ndarray) -> np.ndarray:
    """Lead of a detector over a reference event, t_ref − t_det (positive: the detector fires first).
    NaN where either never happened."""
    return np.asarray(t_reference, dtype=float) - np.asarray(t_detector, dtype=float)


def linfit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, int]:
    """Least-squares line y ≈ a x + b over the finite pairs; returns (a, b, R², n) (Xu's regression
    t_ρ = 0.80 t_test − 75). Raises when fewer than 3 finite pairs remain or x is constant."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 3 or np.ptp(x) == 0:
        raise ValueError(f"linfit needs >= 3 finite pairs with varying x, got {x.size}")
    A = np.stack([x, np.ones_like(x)], 1)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    res = y - (a * x + b)
    r2 = 1.0 - float(res @ res) / float(((y - y.mean()) ** 2).sum()) if np.ptp(y) > 0 else 1.0
    return float(a), float(b), r2, int(x.size)


def p_crit(M: np.ndarray | float, c: float = 1.0) -> np.ndarray:
    """Tian's critical training fraction p = c ln M / M (c = 1 in Xu's reading of Theorem 4,
    c = 2.7482 in Tian's code, ``use_critical_ratio``)."""
    M = np.asarray(M, dtype=float)
    return c * np.log(M) / M
