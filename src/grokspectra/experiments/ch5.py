"""Chapter 5 experiments: grokking as a Hessian phase transition.

Slightly above δ_NN, GD from random init first fits what it can of the training set in O(1) steps (train risk
low, test risk high), sits on a plateau while the hard overlap grows along a negative Hessian outlier, and escapes
after ≈ log d / (2η|λ_out|) steps (chapter 5). Along the same batched GD trajectories
(``multiindex.run_gd``) we record train/test risk and overlaps at every step, and at snapshot times the lowest
Hessian eigenpair (``hessian.lowest_eigpairs``, dense, float64) with its eigenvector's weight on θ_*
(``hessian.overlap_with``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import hessian as hs
from .. import multiindex as mi
from .. import transitions as tr
from ..transitions import extreme_eigvecs, hard_cos, parse_student
from ..device import get_dtype
from ..params import Param, Schema
from . import costs, experiment

SECTION = "ch5_grokking"

SCHEMA = Schema(
    Param("profile", str, help="parameter profile (ci, paper or a YAML path)"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="where to compute"),
    Param("student", str, help="network 'activation:m:eta', e.g. 'quad:1:0.1'"),
    Param("link", str, choices=("pr", "pr_clip", "pr_tanh"), help="target y = z², min(z², clip) or tanh(z²)"),
    Param("clip", float, lo=1.0, hi=100.0, help="label clip c of the pr_clip link"),
    Param("grok_delta", float, lo=0.25, hi=64.0, help="δ slightly above δ_NN (grokking curves)"),
    Param("below_delta", float, lo=0.25, hi=64.0, help="δ below δ_NN (control)"),
    Param("d_list", list, of=int, lo=16, hi=20000, help="input dimensions of the grokking curves"),
    Param("seeds", int, lo=2, hi=4096, help="runs per (d, δ)"),
    Param("T", int, lo=10, hi=100000, help="GD steps of the grokking curves"),
    Param("hess_every", int, lo=1, hi=10000, help="steps between Hessian snapshots"),
    Param("hess_T", int, lo=1, hi=100000, help="last step with a Hessian snapshot"),
    Param("hess_dmax", int, lo=16, hi=20000, help="largest d with Hessian snapshots (dense eigensolver)"),
    Param("t0", int, lo=1, hi=100000, help="plateau time at which the escape time is predicted"),
    Param("tgrok_d", int, lo=16, hi=20000, help="d of the time-to-grok scan"),
    Param("tgrok_deltas", list, of=float, lo=0.25, hi=64.0, help="δ values of the time-to-grok scan"),
    Param("tgrok_seeds", int, lo=2, hi=4096, help="runs per δ of the time-to-grok scan"),
    Param("tgrok_T", int, lo=10, hi=100000, help="GD steps of the time-to-grok scan"),
    Param("plateau_delta", float, lo=0.25, hi=64.0, help="δ just above GD's threshold (plateau against d)"),
    Param("plateau_d_list", list, of=int, lo=16, hi=20000, help="input dimensions of the plateau scan"),
    Param("plateau_seeds", int, lo=2, hi=4096, help="runs per d of the plateau scan"),
    Param("plateau_T", int, lo=10, hi=100000, help="GD steps of the plateau scan"),
    Param("threshold", float, lo=0.05, hi=0.99, help="grokked: max_j |cos(θ_j, θ_*)| reaches this"),
    Param("n_test", int, lo=256, hi=1000000, help="fresh samples for the test risk"),
    Param("seed", int, lo=0, hi=2**31 - 1, help="base random seed"),
    Param("dtype", str, choices=("float32", "float64"), help="GD precision"),
)



def _link(p):
    return mi.link(p["link"], c=p["clip"] if p["link"] == "pr_clip" else None)


def snapshot_spectrum(theta: torch.Tensor, X, y, Ts, act: str, k: int = 2) -> dict:
    """Lowest ``k`` Hessian eigenpairs at Θ (batched over trials, exact dense H of ``hessian.hessian_dense`` in
    float64; eq. app-weights; ``hessian.lowest_eigpairs`` on the GPU) and, for the lowest,
    its weight on span(θ_*) ⊗ R^m (``hessian.overlap_with``) and the weight of Θ on that eigenvector.

    Returns numpy arrays [trials]: ``lam`` (λ_min), ``lam2`` (second lowest), ``ov`` (|P_* v|²), ``mv``
    (|⟨v, vec Θ⟩| / ‖Θ‖_F, the component of the weights along the outlier direction)."""
    Th, X64, y64, T64 = theta.double(), X.double(), y.double(), Ts.double()
    if Th.device.type == "cpu":  # LAPACK syevr on the k wanted pairs only (much faster than a full eigh on the CPU)
        w, V = extreme_eigvecs(hs.hessian_dense(Th, X64, y64, act), "bottom", k)
    else:
        w, V = hs.lowest_eigpairs(Th, X64, y64, act, k=k, method="dense")
    v = V[..., 0]  # [trials, m d], neuron-major
    ov = hs.overlap_with(v, T64)
    vecT = hs.mat_to_vec(Th)
    mv = (v * vecT).sum(-1).abs() / vecT.norm(dim=-1)
    return {"lam": w[..., 0].cpu().numpy(), "lam2": w[..., 1].cpu().numpy(), "ov": ov.cpu().numpy(),
            "mv": mv.cpu().numpy()}


def predicted_escape(t0: float, lam, ov, mv, eta: float, threshold: float):
    """Escape time predicted from the Hessian at the plateau time t0 (chapter 5): the component of Θ along the
    outlier eigenvector v grows by (1 + η|λ|) per step, and |cos(θ, θ_*)| ≈ |⟨v, θ_*⟩| · |⟨v, θ⟩|/‖θ‖ · (1 + η|λ|)^{t − t0},
    so it reaches the threshold at t0 + log(threshold / (√ov · mv)) / log(1 + η|λ|) (∞ when λ ≥ 0)."""
    m0 = np.sqrt(np.asarray(ov, float)) * np.asarray(mv, float)
    return t0 + tr.predicted_escape_time(lam, eta, np.maximum(m0, 1e-300), threshold)


def censored_median(t_hit):
    """Median escape step over the last axis, with runs that never escape (nan) counted as beyond the budget.

    The median is then finite only where more than half of the runs escape, and it is the median of all runs, not
    of the escaping ones: near the threshold the latter leaves out the slowest runs and is biased low, which hides
    the divergence of the time to grok."""
    h = np.asarray(t_hit, float)
    return np.median(np.where(np.isfinite(h), h, np.inf), -1)


def late_fraction(t_hit, t0: float):
    """Fraction of all runs (last axis) that escape after the plateau time t0: the runs with a plateau."""
    h = np.asarray(t_hit, float)
    return (np.isfinite(h) & (h > t0)).mean(-1)


def size_law_fits(t_hit, d_list, *, reps: int = 2000, seed: int = 0) -> dict:
    """The censored median escape step [d] of runs ``t_hit`` [d, seed] (:func:`censored_median`) fitted with two
    finite-size laws by weighted least squares: t = a + b·log d (eq. ch5-tgrok, m₀ ∝ d^{-1/2}) and t = c·d^α.

    The error of each median is half the 16–84 % range of its bootstrap over seeds, which stays defined when a few
    resamples have an infinite (censored) median; a d whose median or range is not finite is left out. Each law
    reports its coefficients, the standard error of the slope (b or α), χ² with (number of d − 2) degrees of
    freedom and its p-value; ``None`` for both laws with fewer than three usable d."""
    h = np.asarray(t_hit, float)
    dd = np.asarray(d_list, float)
    med = censored_median(h)
    rng = np.random.default_rng(seed)
    R = h.shape[-1]
    boot = censored_median(h[:, rng.integers(0, R, (reps, R))])  # [d, reps]
    with np.errstate(invalid="ignore"):  # inf − inf between two censored resamples: nan, that d is left out
        lo, hi = np.percentile(boot, [16, 84], axis=-1)
    se = 0.5 * (hi - lo)
    ok = np.isfinite(med) & np.isfinite(se) & (se > 0)
    out = {"med": med, "se": se, "used": ok, "log": None, "power": None}
    if ok.sum() < 3:
        return out
    x, y, s = np.log(dd[ok]), med[ok], se[ok]
    out["log"] = tr.fit_line_wls(x, y, s)
    out["power"] = tr.fit_line_wls(x, np.log(y), s / y)  # log t = log c + α log d, relative errors
    return out


def log_growth_verdict(fit: dict | None) -> tuple[bool | None, str]:
    """Agreement of the claim "t_grok = a + b log d with b > 0" with a fit (``b``, ``b_se``, ``p``): ✗ (False) when
    the law is rejected (p ≤ 0.01) or b is resolved below zero (b < −2 s.e.), ✓ (True) when the law is not
    rejected and b > 2 s.e., undecided (None) when b is not resolved from zero: the seed spread of the escape step
    then hides a growth of this size, which is no evidence against it. The second value states the rule."""
    rule = "(✗: law rejected, p ≤ 0.01, or b < −2 s.e.; ✓: p > 0.01 and b > 2 s.e.; else undecided)"
    if fit is None:
        return None, rule
    if fit["p"] <= 0.01 or fit["b"] < -2 * fit["b_se"]:
        return False, rule
    if fit["b"] > 2 * fit["b_se"]:
        return True, rule
    return None, "b not resolved from 0 at this seed count: " + rule


def gd_threshold(A: dict, students: list[str], d_list, student: str, d: int) -> tuple[float, float]:
    """GD's 50 % success point δ_c(d) ± s.e. of chapter 4 (``ch4.analyse_sweep``'s ``A``) for one student and d;
    (nan, nan) when that sweep has no such student or d."""
    dd = [int(x) for x in d_list]
    if student not in list(students) or int(d) not in dd:
        return float("nan"), float("nan")
    s, j = list(students).index(student), dd.index(int(d))
    return float(A["loc"][s, j]), float(A["loc_se"][s, j])


# --- cost model of `run --dry-run`: about seconds on one CPU thread (measured); the timed probe rescales it ----------
def _snapshot_s(n: int, d: int, m: int, trials: int) -> float:
    """One Hessian snapshot per trial: the dense Hessian, ∝ n·(md)², and its lowest pairs, ∝ (md)³."""
    return trials * (1e-10 * n * (m * d) ** 2 + 1e-10 * (m * d) ** 3)


SEED_BLOCK = 16  # seeds per unit at most
UNIT_ELEMENTS = 2 ** 28  # X of one unit (trials × n × d floats) at most: 1 GiB in float32
CURVE_KEYS = ("train", "test", "cos", "lam", "lam2", "ov", "mv")


def _blocks(seeds: int, n: int, d: int) -> list[tuple[int, int]]:
    """(first seed, seeds) of each unit: SEED_BLOCK seeds, fewer when their data would pass UNIT_ELEMENTS."""
    blk = int(min(SEED_BLOCK, max(1, UNIT_ELEMENTS // (n * d))))
    return [(b0, min(blk, seeds - b0)) for b0 in range(0, seeds, blk)]


def _curves_units(p: dict) -> list[dict]:
    """One unit per (d, δ ∈ {below_delta, grok_delta}, block of seeds), seeded from its own indices."""
    t_snap = np.arange(0, min(p["hess_T"], p["T"]) + 1, p["hess_every"]).tolist()
    units = []
    for di, d in enumerate(p["d_list"]):
        for gi, dl in enumerate((p["below_delta"], p["grok_delta"])):
            n = max(1, round(dl * d))
            for bi, (b0, k) in enumerate(_blocks(p["seeds"], n, d)):
                units.append({"student": p["student"], "link": p["link"], "clip": p["clip"], "d": int(d), "n": n,
                              "trials": k, "T": p["T"], "t_snap": t_snap if d <= p["hess_dmax"] else [],
                              "n_test": p["n_test"], "dtype": p["dtype"],
                              "seed": p["seed"] + 1000 * di + 100 * gi + 7919 * bi})
    return units


def _curves_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    dls = (p["below_delta"], p["grok_delta"])
    t_snap = np.arange(0, min(p["hess_T"], p["T"]) + 1, p["hess_every"])
    nan = lambda r: np.full((r["train"].shape[0], len(t_snap)), np.nan)  # noqa: E731 (a unit above hess_dmax)
    results = [{**r, **{k: r[k] if len(u["t_snap"]) else nan(r) for k in ("lam", "lam2", "ov", "mv")}}
               for u, r in zip(units, results)]
    out = {}
    for k in CURVE_KEYS:
        out[k] = np.stack([np.stack([np.concatenate([r[k] for u, r in zip(units, results)
                                                     if u["d"] == d and u["n"] == max(1, round(dl * d))])
                                     for dl in dls]) for d in p["d_list"]])  # [d, δ, seed, ...]
    out["t_snap"] = t_snap
    out["d_list"] = np.asarray(p["d_list"])
    out["deltas"] = np.asarray(dls)
    return out


def _curves_cost(u: dict) -> float:
    """GD (trials·n·d·T) and a Hessian snapshot per step of ``t_snap`` (trials·(n·(md)² + (md)³))."""
    m = parse_student(u["student"])[1]
    return (costs.gd_s(u["n"], u["d"], m, u["T"], u["trials"], u["n_test"])
            + len(u["t_snap"]) * _snapshot_s(u["n"], u["d"], m, u["trials"]))


def _curves_shrink(u: dict) -> dict:
    """Two seeds, d ≤ 200 at the same δ, 60 steps with at most three snapshots."""
    d = min(u["d"], 200)
    return {**u, "d": d, "n": max(1, round(u["n"] / u["d"] * d)), "trials": min(u["trials"], 2),
            "T": min(u["T"], 60), "t_snap": [t for t in u["t_snap"] if t <= 60][:3]}


@experiment(SECTION, keys=["student", "link", "clip", "grok_delta", "below_delta", "d_list", "seeds", "T",
                           "hess_every", "hess_T", "hess_dmax", "n_test", "seed", "dtype"],
            units=_curves_units, reduce=_curves_reduce, cost=_curves_cost, shrink=_curves_shrink)
def curves(u: dict, device: torch.device) -> dict:
    """Grokking curves (chapter 5) at one d and one δ (grok_delta, or the control below_delta), for a block of
    seeds, with Hessian snapshots along the same trajectories (eq. app-weights; eq. app-outlier).

    Parameters
    ----------
    u : dict
        One unit: ``student``, ``link``, ``clip``, ``d``, ``n``, ``trials``, ``T``, ``t_snap`` (snapshot steps;
        empty above hess_dmax), ``n_test``, ``dtype``, ``seed``.
    device : torch.device

    Returns
    -------
    dict of ndarray
        [seed, T+1]: ``train``, ``test``, ``cos``; snapshots [seed, S] at the steps ``t_snap``: ``lam``, ``lam2``,
        ``ov``, ``mv`` (:func:`snapshot_spectrum`; nan without snapshots). The assembled experiment holds them as
        [d, δ (0 below, 1 grok), seed, …], with ``t_snap``, ``d_list`` and ``deltas``.
    """
    act, m, eta = parse_student(u["student"])
    lk = mi.link(u["link"], c=u["clip"] if u["link"] == "pr_clip" else None)
    prob = mi.sample_problem(u["d"], u["n"], 1, lk, trials=u["trials"], device=device, dtype=get_dtype(u["dtype"]),
                             generator=u["seed"])
    out = mi.run_gd(prob, m, eta, u["T"], act=act, n_test=u["n_test"], keep=u["t_snap"], generator=u["seed"] + 1)
    nan = {k: np.full(u["trials"], np.nan) for k in ("lam", "lam2", "ov", "mv")}
    per = [snapshot_spectrum(out["theta"][int(t)], prob.X[0], prob.y[0], prob.Theta_star[0], act)
           for t in u["t_snap"]] or [nan]
    res = {k: np.stack([s[k] for s in per], -1) for k in ("lam", "lam2", "ov", "mv")}
    res.update(train=out["train"].cpu().numpy(), test=out["test"].cpu().numpy(),
               cos=hard_cos(out["M"], out["Q"]).cpu().numpy())
    return res


TGROK_KEYS = ("cos", "test", "train", "lam", "lam2", "ov", "mv")


def _tgrok_units(p: dict) -> list[dict]:
    """One unit per (δ, block of seeds), seeded from its own indices."""
    d = p["tgrok_d"]
    units = []
    for gi, dl in enumerate(p["tgrok_deltas"]):
        n = max(1, round(dl * d))
        for bi, (b0, k) in enumerate(_blocks(p["tgrok_seeds"], n, d)):
            units.append({"student": p["student"], "link": p["link"], "clip": p["clip"], "d": int(d), "n": n,
                          "trials": k, "T": p["tgrok_T"], "t0": min(p["t0"], p["tgrok_T"]), "n_test": p["n_test"],
                          "dtype": p["dtype"], "seed": p["seed"] + 9_000_000 + 100 * gi + 7919 * bi})
    return units


def _tgrok_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    d = p["tgrok_d"]
    out = {k: np.stack([np.concatenate([r[k] for u, r in zip(units, results) if u["n"] == max(1, round(dl * d))])
                        for dl in p["tgrok_deltas"]]) for k in TGROK_KEYS}  # [δ, seed, ...]
    out["deltas"] = np.asarray(p["tgrok_deltas"], float)
    out["t0"] = np.asarray(min(p["t0"], p["tgrok_T"]))
    return out


def _tgrok_cost(u: dict) -> float:
    """GD (trials·n·d·T) and a Hessian snapshot at t0 (trials·(n·(md)² + (md)³))."""
    m = parse_student(u["student"])[1]
    return costs.gd_s(u["n"], u["d"], m, u["T"], u["trials"], u["n_test"]) + _snapshot_s(u["n"], u["d"], m, u["trials"])


def _tgrok_shrink(u: dict) -> dict:
    """Two seeds and 100 steps."""
    return {**u, "trials": min(u["trials"], 2), "T": min(u["T"], 100), "t0": min(u["t0"], 100)}


@experiment(SECTION, keys=["student", "link", "clip", "tgrok_d", "tgrok_deltas", "tgrok_seeds", "tgrok_T", "t0",
                           "n_test", "seed", "dtype"], units=_tgrok_units, reduce=_tgrok_reduce, cost=_tgrok_cost,
            shrink=_tgrok_shrink)
def tgrok(u: dict, device: torch.device) -> dict:
    """Time to grok against δ (chapter 5: divergence as δ ↓ δ_NN), at one δ for a block of seeds, with the Hessian
    at the plateau time t0, from which eq. ch5-tgrok predicts each run's escape (:func:`predicted_escape`).

    Parameters
    ----------
    u : dict
        One unit: ``student``, ``link``, ``clip``, ``d``, ``n``, ``trials``, ``T``, ``t0``, ``n_test``, ``dtype``,
        ``seed``.
    device : torch.device

    Returns
    -------
    dict of ndarray
        ``cos``, ``test``, ``train`` [seed, T+1]; ``lam``, ``lam2``, ``ov``, ``mv`` [seed] at t0. The assembled
        experiment holds them as [δ, seed, …], with ``deltas`` and ``t0``.
    """
    act, m, eta = parse_student(u["student"])
    lk = mi.link(u["link"], c=u["clip"] if u["link"] == "pr_clip" else None)
    prob = mi.sample_problem(u["d"], u["n"], 1, lk, trials=u["trials"], device=device, dtype=get_dtype(u["dtype"]),
                             generator=u["seed"])
    out = mi.run_gd(prob, m, eta, u["T"], act=act, n_test=u["n_test"], keep=[u["t0"]], generator=u["seed"] + 1)
    o = snapshot_spectrum(out["theta"][u["t0"]], prob.X[0], prob.y[0], prob.Theta_star[0], act)
    o.update(cos=hard_cos(out["M"], out["Q"]).cpu().numpy(), test=out["test"].cpu().numpy(),
             train=out["train"].cpu().numpy())
    return o


PLATEAU_KEYS = ("cos", "test", "train")


def _plateau_units(p: dict) -> list[dict]:
    """One unit per (d, block of seeds) at plateau_delta, seeded from its own indices."""
    dl = p["plateau_delta"]
    units = []
    for di, d in enumerate(p["plateau_d_list"]):
        n = max(1, round(dl * d))
        for bi, (b0, k) in enumerate(_blocks(p["plateau_seeds"], n, d)):
            units.append({"student": p["student"], "link": p["link"], "clip": p["clip"], "d": int(d), "n": n,
                          "trials": k, "T": p["plateau_T"], "n_test": p["n_test"], "dtype": p["dtype"],
                          "seed": p["seed"] + 5_000_000 + 1000 * di + 7919 * bi})
    return units


def _plateau_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    out = {k: np.stack([np.concatenate([r[k] for u, r in zip(units, results) if u["d"] == int(d)])
                        for d in p["plateau_d_list"]]) for k in PLATEAU_KEYS}  # [d, seed, T+1]
    out["d_list"] = np.asarray(p["plateau_d_list"])
    out["delta"] = np.asarray(float(p["plateau_delta"]))
    return out


def _plateau_cost(u: dict) -> float:
    """GD only (trials·n·d·T)."""
    return costs.gd_s(u["n"], u["d"], parse_student(u["student"])[1], u["T"], u["trials"], u["n_test"])


def _plateau_shrink(u: dict) -> dict:
    """Two seeds, d ≤ 200 at the same δ, 100 steps."""
    d = min(u["d"], 200)
    return {**u, "d": d, "n": max(1, round(u["n"] / u["d"] * d)), "trials": min(u["trials"], 2),
            "T": min(u["T"], 100)}


@experiment(SECTION, keys=["student", "link", "clip", "plateau_delta", "plateau_d_list", "plateau_seeds",
                           "plateau_T", "n_test", "seed", "dtype"], units=_plateau_units, reduce=_plateau_reduce,
            cost=_plateau_cost, shrink=_plateau_shrink)
def plateau(u: dict, device: torch.device) -> dict:
    """Escape from the plateau against d at one δ just above GD's threshold (chapter 5, eq. ch5-tgrok: the plateau
    grows like log d), for a block of seeds; GD curves only, no Hessian.

    Parameters
    ----------
    u : dict
        One unit: ``student``, ``link``, ``clip``, ``d``, ``n``, ``trials``, ``T``, ``n_test``, ``dtype``, ``seed``.
    device : torch.device

    Returns
    -------
    dict of ndarray
        ``cos``, ``test``, ``train`` [seed, T+1]. The assembled experiment holds them as [d, seed, T+1], with
        ``d_list`` and ``delta``.
    """
    act, m, eta = parse_student(u["student"])
    lk = mi.link(u["link"], c=u["clip"] if u["link"] == "pr_clip" else None)
    prob = mi.sample_problem(u["d"], u["n"], 1, lk, trials=u["trials"], device=device, dtype=get_dtype(u["dtype"]),
                             generator=u["seed"])
    out = mi.run_gd(prob, m, eta, u["T"], act=act, n_test=u["n_test"], generator=u["seed"] + 1)
    return {"cos": hard_cos(out["M"], out["Q"]).cpu().numpy(), "test": out["test"].cpu().numpy(),
            "train": out["train"].cpu().numpy()}

