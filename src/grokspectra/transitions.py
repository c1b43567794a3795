"""Analysis of phase transitions in finite-d experiments: success curves, finite-size scaling, escape times.

Chapters 4 and 5 turn batches of gradient-descent runs into a few numbers: where the success rate of GD jumps
(location and width of a transition in δ = n/d), how that location moves with d (log-d corrections,
chapter 4), when a run leaves its plateau (escape / grokking time, chapter 5), how fast the hard overlap grows on
the plateau, and how the escape time diverges as δ ↓ δ_NN. Everything here is plain numpy/scipy on small arrays
of per-run summaries; the runs themselves come from :mod:`grokspectra.multiindex`.

Equations (chapters 4 and 5):

* success curve, eq. (logistic): P(success | δ) = 1 / (1 + exp(−(δ − δ_c)/w)), fitted by binomial maximum
  likelihood with Firth's bias reduction (so that perfectly separated data, common with few seeds, still give a
  finite width);
* finite-size law (chapter 4, Bonnaire et al.): δ_c(d) = δ_c(∞) + c / log d (or + c d^{-1/2});
* escape time (chapter 5): t_esc = log(m_target / m_0) / log(1 + η|λ_out|) ≈ log d / (2η|λ_out|) for m_0 = d^{-1/2};
* divergence near threshold: t(δ) = A (δ − δ_c)^{−ν}.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from scipy import optimize, stats

from . import multiindex as mi
from .params import ParamError


class FitError(RuntimeError):
    """A fit did not converge or the data do not determine the fitted quantity."""


# ---------------------------------------------------------------------------------------------------------------
# success curves


def logistic(x, loc: float, width: float):
    """P(success | x) = 1 / (1 + exp(−(x − loc)/width)), the success-curve model of chapter 4."""
    return 1.0 / (1.0 + np.exp(-(np.asarray(x, dtype=float) - loc) / width))


@dataclasses.dataclass
class SuccessFit:
    """A fitted success curve: location ``loc`` (where P = 1/2), ``width`` (P goes from 27% to 73% over
    loc ± width), their standard errors from the inverse Fisher information, and the deviance."""

    loc: float
    width: float
    loc_se: float
    width_se: float
    deviance: float
    iterations: int

    def __call__(self, x):
        return logistic(x, self.loc, self.width)


def wilson_interval(k, n, z: float = 1.959963984540054):
    """Wilson score interval for a binomial proportion (Wilson 1927).

    Implements p̃ ± z √(p(1−p)/n + z²/4n²) / (1 + z²/n) with p̃ = (p + z²/2n)/(1 + z²/n), p = k/n.

    Parameters
    ----------
    k, n : array_like
        Successes and trials (broadcast), 0 ≤ k ≤ n, n > 0.
    z : float
        Normal quantile (default: 95% two-sided).

    Returns
    -------
    lo, hi : ndarray
        The interval's ends.
    """
    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    if np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return mid - half, mid + half


def fit_success_curve(x, k, n, *, firth: bool = True, tol: float = 1e-10, max_iter: int = 200) -> SuccessFit:
    """Fit the logistic success curve P(δ) = 1/(1 + exp(−(δ − loc)/width)) (chapter 4, eq. ch4-logistic).

    Grouped logistic regression logit P = β0 + β1 x, so loc = −β0/β1 and width = 1/β1. With ``firth`` the score
    is Firth's modified score U*(β) = Σ_i x_i (k_i − n_i p_i + h_i (½ − p_i)), h_i the leverages of the weighted
    design (Firth 1993), which removes the O(1/n) bias of the MLE and keeps the estimate finite for perfectly
    separated data (all failures below some δ, all successes above). Solved by Newton's method on the Fisher
    information Σ n_i p_i(1−p_i) (1, x_i)(1, x_i)ᵀ.

    Parameters
    ----------
    x, k, n : array_like
        Grid (≥ 2 distinct values), successes and runs per grid point.
    firth : bool
        Use Firth's bias-reduced score (default) instead of the plain MLE.
    tol, max_iter : float, int
        Newton step tolerance and iteration cap.

    Returns
    -------
    SuccessFit
        loc, width and their standard errors (delta method on the inverse Fisher information), the deviance.

    Raises
    ------
    ValueError
        Bad input, or data without both successes and failures (no transition on the grid).
    FitError
        Newton does not converge (without ``firth``: separated data, infinite MLE slope), or the curve decreases.
    """
    x, k, n = (np.asarray(v, dtype=float).ravel() for v in (x, k, n))
    if not (x.shape == k.shape == n.shape) or x.size < 2:
        raise ValueError(f"x, k, n must have the same length >= 2, got {x.shape}, {k.shape}, {n.shape}")
    if np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
        raise ValueError(f"need 0 <= k <= n and n > 0; got k={k}, n={n}")
    if np.unique(x).size < 2:
        raise ValueError("need at least two distinct x values")
    if k.sum() == 0 or k.sum() == n.sum():
        raise ValueError(f"all runs {'failed' if k.sum() == 0 else 'succeeded'}: the data do not bracket a "
                         f"transition (x from {x.min()} to {x.max()})")
    xc, xs = x.mean(), x.std()  # centre and scale for conditioning
    A = np.stack([np.ones_like(x), (x - xc) / xs], axis=1)
    beta = np.array([0.0, 1.0])
    for it in range(1, max_iter + 1):
        p = 1 / (1 + np.exp(-(A @ beta)))
        w = n * p * (1 - p)
        info = A.T @ (w[:, None] * A)
        try:
            info_inv = np.linalg.inv(info)
        except np.linalg.LinAlgError as e:
            raise FitError(f"singular Fisher information at iteration {it}, beta={beta}") from e
        resid = k - n * p
        if firth:
            h = w * np.einsum("ij,jk,ik->i", A, info_inv, A)
            resid = resid + h * (0.5 - p)
        step = info_inv @ (A.T @ resid)
        # damp huge steps (far from the optimum the Newton step can overshoot)
        big = np.abs(step).max()
        if big > 5:
            step *= 5 / big
        beta = beta + step
        if np.abs(beta).max() > 1e4:
            raise FitError(f"logistic fit diverges (beta={beta} after {it} iterations): the data are separated, "
                           f"so the plain MLE width is 0; use firth=True")
        if np.abs(step).max() < tol:
            break
    else:
        raise FitError(f"logistic fit did not converge in {max_iter} iterations: beta={beta}, last step={step}")
    p = 1 / (1 + np.exp(-(A @ beta)))
    info_inv = np.linalg.inv(A.T @ ((n * p * (1 - p))[:, None] * A))
    b0, b1 = beta
    if b1 <= 0:
        raise FitError(f"fitted success curve decreases with x (slope {b1 / xs:.3g}); not a transition")
    loc = xc - b0 * xs / b1
    width = xs / b1
    # delta method: loc = xc - xs b0/b1, width = xs/b1
    J = np.array([[-xs / b1, xs * b0 / b1**2], [0.0, -xs / b1**2]])
    cov = J @ info_inv @ J.T
    with np.errstate(divide="ignore", invalid="ignore"):
        dev = 2 * np.sum(np.where(k > 0, k * np.log(k / (n * p)), 0)
                         + np.where(n - k > 0, (n - k) * np.log((n - k) / (n * (1 - p))), 0))
    return SuccessFit(float(loc), float(width), float(math.sqrt(cov[0, 0])), float(math.sqrt(cov[1, 1])),
                      float(dev), it)


# ---------------------------------------------------------------------------------------------------------------
# finite-size scaling


@dataclasses.dataclass
class FiniteSizeFit:
    """δ_c(d) = limit + slope · g(d) with g(d) = 1/log d ("inv_log") or d^{-1/2} ("inv_sqrt")."""

    limit: float
    slope: float
    limit_se: float
    slope_se: float
    form: str

    def __call__(self, d):
        return self.limit + self.slope * _size_feature(np.asarray(d, dtype=float), self.form)


def _size_feature(d, form: str):
    if form == "inv_log":
        return 1.0 / np.log(d)
    if form == "inv_sqrt":
        return d ** -0.5
    raise ValueError(f"unknown finite-size form {form!r}; use 'inv_log' or 'inv_sqrt'")


def fit_finite_size(d, value, se=None, *, form: str = "inv_log") -> FiniteSizeFit:
    """Weighted least-squares fit of δ_c(d) = δ_c(∞) + c · g(d) (chapter 4, eq. ch4-fss; chapter 4: log-d
    finite-size shifts, as in Bonnaire et al.).

    Parameters
    ----------
    d, value : array_like
        Sizes (> 1, ≥ 2 distinct) and the fitted quantity at each size.
    se : array_like, optional
        Standard errors of ``value`` (weights 1/se²). Without them all points weigh the same and the parameter
        errors are scaled by the residual variance (nan with exactly two points); with them the errors are the
        textbook WLS ones, Σ = (AᵀWA)⁻¹, exact when the se are the true noise levels.
    form : {"inv_log", "inv_sqrt"}
        g(d) = 1/log d or d^{-1/2}.

    Returns
    -------
    FiniteSizeFit
        limit = δ_c(∞), slope = c, their standard errors.
    """
    d, v = np.asarray(d, dtype=float).ravel(), np.asarray(value, dtype=float).ravel()
    if d.shape != v.shape or d.size < 2 or np.unique(d).size < 2:
        raise ValueError(f"need >= 2 distinct sizes with one value each, got d={d}, value={v}")
    if np.any(d <= 1):
        raise ValueError(f"sizes must exceed 1, got {d}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"values must be finite, got {v}")
    A = np.stack([np.ones_like(d), _size_feature(d, form)], axis=1)
    if se is None:
        w = np.ones_like(d)
    else:
        se = np.asarray(se, dtype=float).ravel()
        if se.shape != d.shape or np.any(~(se > 0)):
            raise ValueError(f"se must be positive, one per size, got {se}")
        w = 1 / se**2
    cov = np.linalg.inv(A.T @ (w[:, None] * A))
    coef = cov @ (A.T @ (w * v))
    if se is None:
        dof = d.size - 2
        s2 = np.sum((v - A @ coef) ** 2) / dof if dof > 0 else float("nan")
        cov = cov * s2
    return FiniteSizeFit(float(coef[0]), float(coef[1]), float(math.sqrt(cov[0, 0])), float(math.sqrt(cov[1, 1])),
                         form)


def fit_line_wls(x, y, se) -> dict:
    """Weighted least-squares line y = a + b·x with weights 1/se²: ``a``, ``b``, the standard error ``b_se`` of the
    slope (from the weights, not rescaled), χ² with (points − 2) degrees of freedom, ``dof`` and the p-value ``p``
    (nan without a degree of freedom). Used for the finite-size laws of the escape step (chapters 4 and 5)."""
    from scipy import stats

    x, y, se = (np.asarray(v, float).ravel() for v in (x, y, se))
    A = np.stack([np.ones_like(x), x], 1)
    W = 1 / se ** 2
    cov = np.linalg.inv(A.T @ (W[:, None] * A))
    beta = cov @ A.T @ (W * y)
    chi2 = float(np.sum(W * (y - A @ beta) ** 2))
    dof = x.size - 2
    return {"a": float(beta[0]), "b": float(beta[1]), "b_se": float(math.sqrt(cov[1, 1])), "chi2": chi2, "dof": dof,
            "p": float(stats.chi2.sf(chi2, dof)) if dof > 0 else float("nan")}


def fit_power_law(x, y):
    """Least-squares fit of log y = log c + p log x. Returns (c, p, p_se); p_se is nan with two points."""
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape or x.size < 2 or np.any(x <= 0) or np.any(y <= 0):
        raise ValueError(f"need >= 2 positive (x, y) pairs, got x={x}, y={y}")
    A = np.stack([np.ones_like(x), np.log(x)], axis=1)
    coef, *_ = np.linalg.lstsq(A, np.log(y), rcond=None)
    dof = x.size - 2
    if dof > 0:
        s2 = np.sum((np.log(y) - A @ coef) ** 2) / dof
        p_se = math.sqrt(s2 * np.linalg.inv(A.T @ A)[1, 1])
    else:
        p_se = float("nan")
    return float(math.exp(coef[0])), float(coef[1]), p_se


# ---------------------------------------------------------------------------------------------------------------
# escape times along trajectories


def first_crossing(t, y, level, *, direction: str = "up", after=None):
    """First time each trajectory crosses ``level`` (escape / grokking time, chapter 5), linearly interpolated
    between recorded steps: t* = t_{i−1} + (level − y_{i−1})/(y_i − y_{i−1}) (t_i − t_{i−1}).

    Parameters
    ----------
    t : array_like [T]
        Increasing recording times.
    y : array_like [..., T]
        Trajectories (batched over leading dims).
    level : float or array_like
        Scalar or per-trajectory level (broadcasting to y[..., 0]).
    direction : {"up", "down"}
        Rise to ≥ level, or fall to ≤ level.
    after : float or array_like, optional
        Ignore crossings before this time (per trajectory allowed).

    Returns
    -------
    ndarray [...]
        Crossing times; nan where the level is never crossed. A trajectory already past the level at its first
        admissible time gets that time.
    """
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if t.ndim != 1 or y.shape[-1] != t.size or np.any(np.diff(t) <= 0):
        raise ValueError(f"t must be increasing with len = y.shape[-1]; got t {t.shape}, y {y.shape}")
    if direction not in ("up", "down"):
        raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
    level = np.broadcast_to(np.asarray(level, dtype=float), y.shape[:-1])[..., None]
    s = (y - level) if direction == "up" else (level - y)
    ok = s >= 0
    if after is not None:
        after = np.broadcast_to(np.asarray(after, dtype=float), y.shape[:-1])[..., None]
        ok = ok & (t >= after)
    hit = ok.any(-1)
    i = np.argmax(ok, axis=-1)  # first admissible index at or past the level
    ip = np.maximum(i - 1, 0)
    ti, tp = t[i], t[ip]
    si = np.take_along_axis(s, i[..., None], -1)[..., 0]
    sp = np.take_along_axis(s, ip[..., None], -1)[..., 0]
    first = i == 0
    if after is not None:
        first = first | (tp < after[..., 0])
    interp = ~first & (sp < 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(interp, -sp / (si - sp), 1.0)
    out = np.where(interp, tp + frac * (ti - tp), ti)
    return np.where(hit, out, np.nan)


def growth_rate(t, overlap, t_lo: float, t_hi: float):
    """Per-step exponential growth rate r of |overlap| on [t_lo, t_hi] (chapter 5: along a negative-curvature
    direction GD multiplies the overlap by (1 + η|λ|) per step, so r = log(1 + η|λ|); eq. app-lin for the
    linearised DMFT).

    Parameters
    ----------
    t : array_like [T]
        Recording times.
    overlap : array_like [..., T]
        Trajectories (non-zero on the window).
    t_lo, t_hi : float
        Window (needs ≥ 2 recorded times).

    Returns
    -------
    ndarray [...]
        Least-squares slope of log|overlap| against t.
    """
    t = np.asarray(t, dtype=float)
    y = np.log(np.abs(np.asarray(overlap, dtype=float)))
    sel = (t >= t_lo) & (t <= t_hi)
    if sel.sum() < 2:
        raise ValueError(f"need >= 2 recorded times in [{t_lo}, {t_hi}], have {sel.sum()}")
    ts, ys = t[sel], y[..., sel]
    tc = ts - ts.mean()
    return np.sum(tc * (ys - ys.mean(-1, keepdims=True)), axis=-1) / np.sum(tc * tc)


def predicted_escape_time(lam, eta: float, m0, m_target: float = 0.5):
    """Escape time along an unstable Hessian direction (chapter 5; chapter 5, eq. ch5-tgrok):
    t = log(m_target / m0) / log(1 + η|λ|), ≈ log d / (2η|λ|) when m0 = d^{-1/2} and η|λ| ≪ 1.

    Parameters
    ----------
    lam : array_like
        Hessian eigenvalue(s) of the direction.
    eta : float
        GD step size (> 0).
    m0 : array_like
        Initial overlap along the direction (> 0).
    m_target : float
        Overlap to reach.

    Returns
    -------
    ndarray
        Steps (≥ 0); infinite where λ ≥ 0 (no unstable direction).
    """
    lam = np.asarray(lam, dtype=float)
    m0 = np.asarray(m0, dtype=float)
    if eta <= 0 or np.any(m0 <= 0) or m_target <= 0:
        raise ValueError(f"need eta > 0, m0 > 0, m_target > 0; got {eta}, {m0}, {m_target}")
    with np.errstate(divide="ignore"):
        rate = np.log1p(eta * np.abs(lam))
        t = np.log(m_target / m0) / rate
    return np.where(lam < 0, np.maximum(t, 0.0), np.inf)


# ---------------------------------------------------------------------------------------------------------------
# divergence of the escape time at the threshold


@dataclasses.dataclass
class DivergenceFit:
    """t(δ) = amplitude · (δ − delta_c)^(−exponent); ``*_se`` from the Gauss–Newton covariance (nan when fixed)."""

    delta_c: float
    exponent: float
    amplitude: float
    delta_c_se: float
    exponent_se: float
    rms_log: float

    def __call__(self, delta):
        return self.amplitude * (np.asarray(delta, dtype=float) - self.delta_c) ** (-self.exponent)


def fit_divergence(delta, t, *, delta_c: float | None = None, exponent: float | None = None) -> DivergenceFit:
    """Fit the divergence of the time to grok, t(δ) = A (δ − δ_c)^{−ν} (chapter 5; chapter 5: t → ∞ as
    δ ↓ δ_NN), by least squares in log t (relative errors weigh equally).

    Parameters
    ----------
    delta, t : array_like
        Sample ratios and (positive, finite) times.
    delta_c : float, optional
        Fix the threshold (e.g. the predicted δ_NN): then A and ν are fitted linearly.
    exponent : float, optional
        With ``delta_c``, fix ν too (only A is fitted).

    Returns
    -------
    DivergenceFit
        δ_c, ν, A, the standard errors of δ_c and ν (Gauss–Newton covariance scaled by the residual variance;
        needs ≥ 4 points when δ_c is free), and the rms residual of log t.

    Raises
    ------
    ValueError
        Bad input (δ ≤ fixed δ_c, fewer than 3 points with δ_c free).
    FitError
        The bounded nonlinear least-squares solver fails from every start.
    """
    x, y = np.asarray(delta, dtype=float).ravel(), np.asarray(t, dtype=float).ravel()
    if x.shape != y.shape or x.size < 2 or np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"need >= 2 finite positive times, got delta={x}, t={y}")
    ly = np.log(y)
    if delta_c is not None:
        if np.any(x <= delta_c):
            raise ValueError(f"all delta must exceed delta_c={delta_c}, got {x}")
        lx = np.log(x - delta_c)
        if exponent is not None:
            la = np.mean(ly + exponent * lx)
            r = ly - (la - exponent * lx)
            return DivergenceFit(delta_c, exponent, math.exp(la), float("nan"), float("nan"),
                                 float(np.sqrt(np.mean(r**2))))
        c, p, p_se = fit_power_law(x - delta_c, y)
        r = ly - (math.log(c) + p * lx)
        return DivergenceFit(delta_c, -p, c, float("nan"), p_se, float(np.sqrt(np.mean(r**2))))
    if x.size < 3:
        raise ValueError("fitting delta_c needs >= 3 points")
    span = x.max() - x.min()
    starts = []
    for dc0 in x.min() - span * np.array([0.05, 0.2, 0.5, 1.0, 2.0]):
        c, p, _ = fit_power_law(x - dc0, y)
        starts.append([dc0, max(-p, 0.05), math.log(c)])
    fit = _divergence_solve(x, ly, starts)
    if fit is None:
        raise FitError(f"divergence fit failed for delta={x}, t={y}")
    return fit


def _divergence_solve(x, ly, starts) -> DivergenceFit | None:
    """Least squares of log t = log A − ν log(δ − δ_c) from each start (δ_c, ν, log A), the best kept; the
    standard errors from the Gauss–Newton covariance scaled by the residual variance (x.size − 3 dof). None when
    no start converges."""
    span = x.max() - x.min()

    def res(q):
        dc, nu, la = q
        return ly - (la + -nu * np.log(x - dc))

    best = None
    for q0 in starts:
        sol = optimize.least_squares(res, q0,
                                     bounds=([-np.inf, 0.0, -np.inf], [x.min() - 1e-9 * span, 20.0, np.inf]))
        if sol.success and (best is None or sol.cost < best.cost):
            best = sol
    if best is None:
        return None
    J = best.jac
    dof = x.size - 3
    if dof > 0:
        s2 = 2 * best.cost / dof
        try:
            cov = np.linalg.inv(J.T @ J) * s2
            dc_se, nu_se = math.sqrt(cov[0, 0]), math.sqrt(cov[1, 1])
        except (np.linalg.LinAlgError, ValueError):
            dc_se = nu_se = float("nan")
    else:
        dc_se = nu_se = float("nan")
    dc, nu, la = best.x
    return DivergenceFit(float(dc), float(nu), math.exp(la), dc_se, nu_se, float(np.sqrt(2 * best.cost / x.size)))


_DIV_BOOT: dict = {}


def divergence_z(delta, fit: DivergenceFit, *, level: float = 0.95, draws: int = 1000, seed: int = 20261208) -> float:
    """The multiplier q of the standard error of δ_c from :func:`fit_divergence` such that |δ̂_c − δ_c| ≤ q·se
    with probability ``level``: the half-width of its ``level`` interval is q·se.

    With eight δ and three parameters the Gauss–Newton s.e. of δ_c is far from a normal law's: δ_c sits near the
    bound δ_c < min δ, the fit is nonlinear, and the residual variance comes from five dof. At chapter 5's paper fit,
    |δ̂_c − δ_c| exceeds 2 s.e. in 11–14 % of simulated sweeps, not 5 % (its 95 % point is ≈ 3.6 s.e.). So q comes
    from a parametric bootstrap-t: ``draws`` sets of log t drawn from ``fit`` with normal residuals of its residual
    variance (rms_log² · n/(n − 3)), each refitted (from ``fit``'s parameters) and scored |δ̂_c* − δ_c| / se*; a
    refit that fails or has no finite s.e. counts as beyond every q. q is the ``level`` quantile. Seeded, so the
    same number on every machine, and cached per (δ, fit).

    To compare δ_c with an independent value of standard error s, combine the two half-widths in quadrature,
    √((q·se)² + (1.96 s)²) (``report.combined_tol``). A bootstrap of the combined statistic
    |δ̂_c − v| / √(se² + s²) is not: it is not pivotal (its law depends on the unknown residual level relative to
    s), and in a double bootstrap at chapter 5's setting it rejected 9–15 % of true matches, as many as the plain
    2-s.e. rule, while the quadrature of calibrated half-widths rejected 5 % (``docs/ENGINEERING_LOG.md``)."""
    if not 0 < level < 1:
        raise ValueError(f"need 0 < level < 1, got {level}")
    return float(np.quantile(_divergence_boot(delta, fit, draws, seed), level))


def divergence_exceed(delta, fit: DivergenceFit, k: float = 2.0, *, draws: int = 1000,
                      seed: int = 20261208) -> float:
    """How often |δ̂_c − δ_c| exceeds k standard errors in :func:`divergence_z`'s bootstrap (the same draws): the
    fraction of true values a "within k s.e." rule would reject."""
    return float(np.mean(_divergence_boot(delta, fit, draws, seed) > k))


def _divergence_boot(delta, fit: DivergenceFit, draws: int, seed: int) -> np.ndarray:
    """|δ̂_c* − δ_c| / se* over the seeded parametric bootstrap of :func:`divergence_z` (inf where a refit fails),
    cached per (δ, fit, draws, seed)."""
    x = np.asarray(delta, dtype=float).ravel()
    if x.size < 4 or not (np.isfinite(fit.delta_c_se) and fit.delta_c_se > 0 and np.isfinite(fit.rms_log)):
        raise ValueError(f"need a fit with delta_c free over >= 4 points and a finite s.e., got {fit} on {x.size} points")
    key = (tuple(x), dataclasses.astuple(fit), int(draws), int(seed))
    if key not in _DIV_BOOT:
        rng = np.random.default_rng(seed)
        sig = fit.rms_log * math.sqrt(x.size / (x.size - 3))
        mu = np.log(fit(x))
        start = [[fit.delta_c, fit.exponent, math.log(fit.amplitude)]]
        stat = np.full(draws, np.inf)
        for i in range(draws):
            g = _divergence_solve(x, mu + sig * rng.standard_normal(x.size), start)
            if g is not None and np.isfinite(g.delta_c_se) and g.delta_c_se > 0:
                stat[i] = abs(g.delta_c - fit.delta_c) / g.delta_c_se
        _DIV_BOOT[key] = stat
    return _DIV_BOOT[key]


def binomial_consistent(k1, n1, k2, n2, *, alpha: float = 0.05) -> tuple[bool, float]:
    """Are two success counts k1/n1 and k2/n2 consistent with one success probability? Fisher's exact test
    (two-sided); returns (p-value ≥ alpha, p-value). Used to compare our success counts with a reference run."""
    table = [[int(k1), int(n1 - k1)], [int(k2), int(n2 - k2)]]
    p = float(stats.fisher_exact(table).pvalue)
    return p >= alpha, p


# ---------------------------------------------------------------------------------------------------------------
# convergence of the first phase, and a bisection whose bracket is limited by its tolerance, not by noise


def settled(t, x, lag: int, tol: float) -> dict:
    """Has a trajectory settled? The criterion of chapter 3: |x_T − x_{T−lag}| < tol at the last recorded step T
    (for several observables, every one of them).

    Parameters
    ----------
    t : array_like [T]
        Increasing integer steps.
    x : array_like [..., T]
        Trajectories (e.g. Q_⊥(t, t), the train risk, the bulk edge).
    lag : int
        Δ in steps (needs a recorded step T − Δ).
    tol : float
        Absolute tolerance.

    Returns
    -------
    dict
        ``change`` [...] = |x_T − x_{T−Δ}|, ``settled`` (bool, every change < tol and finite).
    """
    t = np.asarray(t)
    x = np.asarray(x, dtype=float)
    if t.ndim != 1 or x.shape[-1] != t.size:
        raise ValueError(f"t must be 1-d with len = x.shape[-1]; got {t.shape}, {x.shape}")
    if lag <= 0 or not tol > 0:
        raise ValueError(f"need lag > 0 and tol > 0, got {lag}, {tol}")
    j = np.flatnonzero(t == t[-1] - lag)
    if j.size == 0:
        raise ValueError(f"no recorded step at T - lag = {t[-1] - lag}")
    change = np.abs(x[..., -1] - x[..., j[0]])
    return {"change": change, "settled": bool(np.all(np.isfinite(change)) and np.all(change < tol))}


def noisy_bisect(crit, lo: float, hi: float, *, rtol: float = 0.05, n0: int, n_max: int, reps: int = 2,
                 z: float = 2.0, max_iter: int = 20) -> dict:
    """Root of an increasing, Monte-Carlo-estimated criterion c(δ) by bisection with noise control.

    ``crit(delta, n, rep)`` returns one estimate of c(δ) from ``n`` paths with replicate index ``rep`` (independent
    paths for different ``rep``; the same (δ, n, rep) must give the same value). At each δ the mean ĉ and standard
    error s = sd/√reps of ``reps`` replicates are formed; the sign of c is taken as decided when |ĉ| ≥ z·s, else n
    is doubled (up to ``n_max``). If the sign at a mid-point is still undecided at ``n_max`` the bisection stops
    there: the root lies within about z·s/|slope| of that point (slope: the secant between the bracket ends), the
    bracket shrinks to that band, and it is **noise-limited** (``limited_by = "noise"``) when the band is wider
    than the tolerance. Otherwise it runs until hi/lo − 1 < ``rtol`` (``limited_by = "tolerance"``). When the
    sign at an end of the initial bracket is undecided at ``n_max``, nothing is bisected: the result is the initial
    bracket, noise-limited, with ``root_mc_se`` = inf. Two decided ends of the same sign raise ``ValueError``.

    The Monte-Carlo spread of the root itself is estimated as ``root_mc_se`` = s / |slope|, with s the standard
    error at the undecided mid-point where the bisection stopped (else the mean of the two bracket ends') and the
    slope the secant of ĉ between the bracket ends; the bracket is limited by the tolerance, not by Monte-Carlo
    spread, when its half-width exceeds ``root_mc_se``.

    Returns
    -------
    dict
        ``root`` (geometric mid-point of the final bracket), ``lo``, ``hi``, ``limited_by``, ``root_mc_se``, and
        per evaluation ``deltas``, ``n``, ``mean``, ``se``.
    """
    if not (0 < lo < hi) or reps < 2 or n0 < 2 or n_max < n0 or not rtol > 0:
        raise ValueError(f"need 0 < lo < hi, reps >= 2, 2 <= n0 <= n_max, rtol > 0; got {lo}, {hi}, {reps}, "
                         f"{n0}, {n_max}, {rtol}")
    hist = {"deltas": [], "n": [], "mean": [], "se": []}

    def evaluate(d):
        n = n0
        while True:
            v = np.array([float(crit(d, n, r)) for r in range(reps)])
            if not np.all(np.isfinite(v)):
                raise ValueError(f"non-finite criterion {v} at delta = {d}, n = {n}")
            mean, se = float(v.mean()), float(v.std(ddof=1) / math.sqrt(reps))
            hist["deltas"].append(d)
            hist["n"].append(n)
            hist["mean"].append(mean)
            hist["se"].append(se)
            if abs(mean) >= z * se:
                return mean, se, True
            if 2 * n > n_max:
                return mean, se, False
            n *= 2

    clo, slo, ok_lo = evaluate(lo)
    chi, shi, ok_hi = evaluate(hi)
    if not (ok_lo and ok_hi):  # an end's sign is undecided at n_max: the whole bracket is noise-limited
        return {"root": math.sqrt(lo * hi), "lo": lo, "hi": hi, "limited_by": "noise", "root_mc_se": float("inf"),
                **{k: np.asarray(v) for k, v in hist.items()}}
    if not clo < 0 < chi:
        raise ValueError(f"noisy_bisect: [{lo}, {hi}] does not bracket a sign change: c = {clo:.4g} ± {slo:.2g} "
                         f"at {lo}, {chi:.4g} ± {shi:.2g} at {hi} (needs < 0 and > 0, each by {z:g} s.e.)")
    limited = "tolerance"
    mc_mid = None
    ends = {"lo": (lo, clo, slo), "hi": (hi, chi, shi)}
    for _ in range(max_iter):
        if hi / lo - 1 < rtol:
            break
        mid = math.sqrt(lo * hi)
        c, s, ok = evaluate(mid)
        if not ok:
            # the sign at mid is undecided at n_max: the root is within ~z·s/|slope| of mid (secant slope of the
            # bracket ends); shrink to that band and stop
            slope = (ends["hi"][1] - ends["lo"][1]) / (ends["hi"][0] - ends["lo"][0])
            half = z * s / abs(slope)
            lo, hi = max(lo, mid - half), min(hi, mid + half)
            limited = "tolerance" if hi / lo - 1 < rtol else "noise"
            mc_mid = s / abs(slope)
            break
        if c > 0:
            hi, ends["hi"] = mid, (mid, c, s)
        else:
            lo, ends["lo"] = mid, (mid, c, s)
    (x0, c0, s0), (x1, c1, s1) = ends["lo"], ends["hi"]
    slope = (c1 - c0) / (x1 - x0)
    mc_se = 0.5 * (s0 + s1) / abs(slope) if slope != 0 else float("inf")
    if mc_mid is not None:
        mc_se = mc_mid
    return {"root": math.sqrt(lo * hi), "lo": lo, "hi": hi, "limited_by": limited, "root_mc_se": float(mc_se),
            **{k: np.asarray(v) for k, v in hist.items()}}


# ---------------------------------------------------------------------------------------------------------------
# helpers shared by the experiments of chapters 4 and 5 (students, overlaps, extreme eigenpairs)


def parse_student(spec: str) -> tuple[str, int, float]:
    """'quad:1:0.1' → ('quad', 1, 0.1): activation, width m, step size η (chapter 1)."""
    parts = spec.split(":")
    try:
        act, m, eta = parts[0], int(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        raise ParamError(f"student {spec!r} must look like 'activation:m:eta', e.g. 'quad:1:0.1'") from None
    if len(parts) != 3 or act not in mi.ACTIVATIONS or m < 1 or not eta > 0:
        raise ParamError(f"student {spec!r}: activation in {sorted(mi.ACTIVATIONS)}, m >= 1, eta > 0")
    return act, m, eta


def hard_cos(M: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """max_j |cos(θ_j, θ_*)| = max_j |M_{1j}| / √Q_jj from the overlaps M [.., 1, m] and Q [.., m, m] (chapter 1)."""
    q = torch.diagonal(Q, dim1=-2, dim2=-1).clamp_min(1e-30).sqrt()
    return (M[..., 0, :].abs() / q).amax(-1)


def extreme_eigvecs(H: torch.Tensor, which: str = "top", k: int = 1):
    """The k largest ("top") or smallest ("bottom") eigenpairs of a batch of symmetric matrices H [B, n, n]:
    ``(evals [B, k], evecs [B, n, k])``, ascending. On the GPU a batched ``torch.linalg.eigh``; on the CPU LAPACK's
    ``syevr`` restricted to the wanted indices (``scipy.linalg.eigh(subset_by_index=…)``, one call per matrix),
    which skips the full eigenvector back-transform."""
    B, n, _ = H.shape
    if H.device.type != "cpu":
        w, V = torch.linalg.eigh(H)
        sl = slice(n - k, n) if which == "top" else slice(0, k)
        return w[:, sl], V[:, :, sl]
    from scipy import linalg as sla

    idx = [n - k, n - 1] if which == "top" else [0, k - 1]
    Hn = H.detach().double().numpy()
    ws, Vs = zip(*(sla.eigh(Hn[b], subset_by_index=idx) for b in range(B)))
    return (torch.from_numpy(np.stack(ws)).to(H.dtype), torch.from_numpy(np.stack(Vs)).to(H.dtype))
