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


# --- cost model of `run --dry-run`: about seconds on one CPU thread (measured); the timed probe rescales it ----------
def _snapshot_s(n: int, d: int, m: int, trials: int) -> float:
    """One Hessian snapshot per trial: the dense Hessian, ∝ n·(md)², and its lowest pairs, ∝ (md)³."""
    return trials * (1e-10 * n * (m * d) ** 2 + 1e-10 * (m * d) ** 3)


def _curves_cost(p: dict) -> float:
    """Per d and δ: GD (seeds·n·d·T) and, for d ≤ hess_dmax, a Hessian snapshot per step of ``t_snap``
    (seeds·(n·(md)² + (md)³))."""
    m = parse_student(p["student"])[1]
    snaps = len(range(0, min(p["hess_T"], p["T"]) + 1, p["hess_every"]))
    total = 0.0
    for d in p["d_list"]:
        for dl in (p["below_delta"], p["grok_delta"]):
            n = max(1, round(dl * d))
            total += costs.gd_s(n, d, m, p["T"], p["seeds"], p["n_test"])
            total += snaps * _snapshot_s(n, d, m, p["seeds"]) if d <= p["hess_dmax"] else 0.0
    return total


def _curves_shrink(p: dict) -> dict:
    """The first d, two seeds, 60 steps with a snapshot every 20."""
    return {**p, "d_list": p["d_list"][:1], "seeds": 2, "T": min(p["T"], 60), "hess_T": min(p["hess_T"], 60),
            "hess_every": max(p["hess_every"], 20)}


@experiment(SECTION, keys=["student", "link", "clip", "grok_delta", "below_delta", "d_list", "seeds", "T",
                           "hess_every", "hess_T", "hess_dmax", "n_test", "seed", "dtype"], cost=_curves_cost,
            shrink=_curves_shrink)
def curves(p: dict, device: torch.device) -> dict:
    """Grokking curves (chapter 5) at δ = grok_delta and the control δ = below_delta, for each d, with Hessian
    snapshots along the same trajectories (eq. app-weights; eq. app-outlier).

    Parameters
    ----------
    p : dict
        ``student``, ``link``, ``clip``, ``grok_delta``, ``below_delta``, ``d_list``, ``seeds``, ``T``,
        ``hess_every``, ``hess_T``, ``hess_dmax``, ``n_test``, ``seed``, ``dtype``.
    device : torch.device

    Returns
    -------
    dict of ndarray
        [d, δ (0 below, 1 grok), seed, T+1]: ``train``, ``test``, ``cos``; snapshots [d, δ, seed, S] at the
        steps ``t_snap``: ``lam``, ``lam2``, ``ov``, ``mv`` (:func:`snapshot_spectrum`; nan for d > hess_dmax);
        ``d_list``, ``deltas``.
    """
    dt = get_dtype(p["dtype"])
    act, m, eta = parse_student(p["student"])
    lk = _link(p)
    t_snap = np.arange(0, min(p["hess_T"], p["T"]) + 1, p["hess_every"])
    keys = ("train", "test", "cos", "lam", "lam2", "ov", "mv")
    res = {k: [] for k in keys}
    for di, d in enumerate(p["d_list"]):
        ns = [max(1, round(x * d)) for x in (p["below_delta"], p["grok_delta"])]
        seed = p["seed"] + 1000 * di
        prob = mi.sample_problem(d, ns, 1, lk, trials=p["seeds"], device=device, dtype=dt, generator=seed)
        hess = d <= p["hess_dmax"]
        out = mi.run_gd(prob, m, eta, p["T"], act=act, n_test=p["n_test"], keep=t_snap.tolist() if hess else (),
                        generator=seed + 1)
        snaps = {k: [] for k in ("lam", "lam2", "ov", "mv")}
        nan = {k: np.full(p["seeds"], np.nan) for k in snaps}
        for g in range(len(ns)):
            per = [snapshot_spectrum(out["theta"][int(t)][g], prob.X[g], prob.y[g], prob.Theta_star[g], act)
                   if hess else nan for t in t_snap]
            for k in snaps:
                snaps[k].append(np.stack([s[k] for s in per], -1))
        res["train"].append(out["train"].cpu().numpy())
        res["test"].append(out["test"].cpu().numpy())
        res["cos"].append(hard_cos(out["M"], out["Q"]).cpu().numpy())
        for k in snaps:
            res[k].append(np.stack(snaps[k]))
    o = {k: np.stack(v) for k, v in res.items()}
    o["t_snap"] = t_snap
    o["d_list"] = np.asarray(p["d_list"])
    o["deltas"] = np.asarray([p["below_delta"], p["grok_delta"]])
    return o


def _tgrok_cost(p: dict) -> float:
    """Per δ: GD (seeds·n·d·T) and a Hessian snapshot at t0 (seeds·(n·(md)² + (md)³))."""
    m, d, S = parse_student(p["student"])[1], p["tgrok_d"], p["tgrok_seeds"]
    ns = [max(1, round(dl * d)) for dl in p["tgrok_deltas"]]
    return sum(costs.gd_s(n, d, m, p["tgrok_T"], S, p["n_test"]) + _snapshot_s(n, d, m, S) for n in ns)


def _tgrok_shrink(p: dict) -> dict:
    """The first δ, two seeds, 100 steps."""
    return {**p, "tgrok_deltas": p["tgrok_deltas"][:1], "tgrok_seeds": 2, "tgrok_T": min(p["tgrok_T"], 100)}


@experiment(SECTION, keys=["student", "link", "clip", "tgrok_d", "tgrok_deltas", "tgrok_seeds", "tgrok_T", "t0",
                           "n_test", "seed", "dtype"], cost=_tgrok_cost, shrink=_tgrok_shrink)
def tgrok(p: dict, device: torch.device) -> dict:
    """Time to grok against δ (chapter 5: divergence as δ ↓ δ_NN) with the Hessian at the plateau time t0, from
    which eq. ch5-tgrok predicts each run's escape (:func:`predicted_escape`).

    Parameters
    ----------
    p : dict
        ``student``, ``link``, ``clip``, ``tgrok_d``, ``tgrok_deltas``, ``tgrok_seeds``, ``tgrok_T``, ``t0``,
        ``n_test``, ``seed``, ``dtype``.
    device : torch.device

    Returns
    -------
    dict of ndarray
        ``cos``, ``test``, ``train`` [δ, seed, T+1]; ``lam``, ``lam2``, ``ov``, ``mv`` [δ, seed] at t0;
        ``deltas``, ``t0``.
    """
    dt = get_dtype(p["dtype"])
    act, m, eta = parse_student(p["student"])
    lk = _link(p)
    d, t0 = p["tgrok_d"], min(p["t0"], p["tgrok_T"])
    ns = [max(1, round(x * d)) for x in p["tgrok_deltas"]]
    seed = p["seed"] + 9_000_000
    prob = mi.sample_problem(d, ns, 1, lk, trials=p["tgrok_seeds"], device=device, dtype=dt, generator=seed)
    out = mi.run_gd(prob, m, eta, p["tgrok_T"], act=act, n_test=p["n_test"], keep=[t0], generator=seed + 1)
    snaps = [snapshot_spectrum(out["theta"][t0][g], prob.X[g], prob.y[g], prob.Theta_star[g], act)
             for g in range(len(ns))]
    o = {k: np.stack([s[k] for s in snaps]) for k in ("lam", "lam2", "ov", "mv")}
    o["cos"] = hard_cos(out["M"], out["Q"]).cpu().numpy()
    o["test"] = out["test"].cpu().numpy()
    o["train"] = out["train"].cpu().numpy()
    o["deltas"] = np.asarray(p["tgrok_deltas"], float)
    o["t0"] = np.asarray(t0)
    return o
