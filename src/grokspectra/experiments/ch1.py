"""Chapter 1: the two-layer GD engine against the discrete-time DMFT for O(1) steps (brief ``mw_theory.md`` §2–§4).

Experiments: ``trajectories`` (DMFT with and without memory vs GD at several d, the R1 set-up) and ``easy_hard``
(random init: phase retrieval's overlap stays O(d^{-1/2}); the staircase's easy direction is learned).
Benchmarks ``gd`` and ``dmft`` print measured time beside a memory-bandwidth floor.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from .. import dmft, multiindex as mi
from ..device import device_name, get_device, synchronize
from ..params import Param, Schema
from . import experiment

SECTION = "ch1_dmft"
SCHEMA = Schema(
    Param("profile", str, help="parameter profile"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="auto, cpu or cuda"),
    Param("act", str, choices=("gelu", "quad", "relu", "tanh"), help="activation σ"),
    Param("m", int, lo=1, hi=64, help="hidden neurons"),
    Param("delta", float, lo=0.1, hi=100.0, help="sample ratio δ = n/d"),
    Param("eta", float, lo=1e-4, hi=100.0, help="GD step size η"),
    Param("M0", list, of=float, lo=-10.0, hi=10.0, help="initial overlaps M_0 (one per neuron; k = 1)"),
    Param("T", int, lo=6, hi=200, help="GD steps (≥ 6: the R1 calibration is read at t = 6)"),
    Param("ds", list, of=int, lo=50, hi=100000, help="dimensions d for GD vs DMFT"),
    Param("seeds", int, lo=2, hi=1000, help="GD trials per d"),
    Param("N", int, lo=1000, hi=10**7, help="DMFT Monte Carlo paths (all replicas together)"),
    Param("reps", int, lo=2, hi=64, help="independent DMFT replicas (for its Monte Carlo error bars)"),
    Param("T_eh", int, lo=1, hi=200, help="steps of the easy-vs-hard runs (random init)"),
    Param("ds_eh", list, of=int, lo=50, hi=100000, help="dimensions d of the easy-vs-hard GD runs"),
    Param("N_eh", int, lo=1000, hi=10**7, help="DMFT paths of the easy-vs-hard runs"),
)


def _even(n: int) -> int:
    return max(2, n - n % 2)


KEYS = ("M", "Q", "train", "test")


def _traj_units(p: dict) -> list[dict]:
    """DMFT replicas with memory (``reps``) and without (2), each with its own path seed, and one GD unit per d."""
    if len(p["M0"]) != p["m"]:
        raise ValueError(f"M0 has {len(p['M0'])} entries but m = {p['m']}")
    base = {k: p[k] for k in ("act", "m", "delta", "eta", "T")} | {"M0": [p["M0"]]}
    units = [{**base, "kind": "dmft", "tag": tag, "memory": mem, "N": _even(p["N"] // reps), "seed": s0 + r}
             for tag, mem, reps, s0 in (("dm", True, p["reps"], 1000), ("nm", False, 2, 2000)) for r in range(reps)]
    units += [{**base, "kind": "gd", "d": d, "trials": p["seeds"], "data_seed": 10 + i, "init_seed": 100 + i}
              for i, d in enumerate(p["ds"])]
    return units


def _traj_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    out, reps = {}, {}
    for u, r in zip(units, results):
        if u["kind"] == "dmft":
            reps.setdefault(u["tag"], []).append(r)
        else:
            out.update({f"gd{u['d']}_{k}": r[k] for k in KEYS})
    for tag, rs in reps.items():
        out.update({f"{tag}_{k}": np.stack([r[k] for r in rs]) for k in KEYS})
    return out


def _traj_cost(u: dict) -> float:
    return u["N"] * u["T"] ** 2 * u["m"] / 4e3 if u["kind"] == "dmft" else u["trials"] * u["delta"] * u["d"] ** 2 * u["T"] / 2e5


def _shrink(u: dict) -> dict:
    return {**u, "N": min(u.get("N", 0), 4000)} if u["kind"] == "dmft" else {**u, "d": min(u["d"], 200)}


@experiment(SECTION, keys=["act", "m", "delta", "eta", "M0", "T", "ds", "seeds", "N", "reps"], units=_traj_units,
            reduce=_traj_reduce, cost=_traj_cost, shrink=_shrink)
def trajectories(u, device):
    """Warm start M_0 on y = z²: one DMFT replica (with or without the memory terms) or GD at one d with every
    trial; the chapter compares their overlaps, norms and risks."""
    if u["kind"] == "dmft":
        o = dmft.run_dmft(u["act"], "pr", u["delta"], u["eta"], u["T"], u["N"], u["m"], M0=u["M0"],
                          memory=u["memory"], antithetic=True, device=device, generator=u["seed"])
        return {k: o[k] for k in KEYS}
    d = u["d"]
    prob = mi.sample_problem(d, int(round(u["delta"] * d)), 1, "pr", trials=u["trials"], device=device,
                             dtype=torch.float32, generator=u["data_seed"])
    g = mi.run_gd(prob, u["m"], u["eta"], u["T"], act=u["act"], M0=u["M0"], generator=u["init_seed"])
    return {k: g[k] for k in KEYS}


def _eh_units(p: dict) -> list[dict]:
    """Per link (phase retrieval, staircase): antithetic DMFT, (phase retrieval only) plain-sampling DMFT, and GD
    at every d of ``ds_eh``."""
    base = {k: p[k] for k in ("act", "m", "delta", "eta")} | {"T": p["T_eh"]}
    units = []
    for tag, lk in (("pr", "pr"), ("st", "staircase")):
        units.append({**base, "kind": "dmft", "tag": tag, "link": lk, "N": _even(p["N_eh"]), "antithetic": True})
        if tag == "pr":
            units.append({**base, "kind": "dmft", "tag": tag, "link": lk, "N": _even(p["N_eh"]), "antithetic": False})
        units += [{**base, "kind": "gd", "tag": tag, "link": lk, "d": d, "trials": p["seeds"], "data_seed": 20 + i,
                   "init_seed": 200 + i} for i, d in enumerate(p["ds_eh"])]
    return units


def _eh_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    out = {}
    for u, r in zip(units, results):
        t = u["tag"]
        if u["kind"] == "gd":
            out.update({f"{t}_gd{u['d']}_{k}": r[k] for k in ("M", "train", "test")})
        elif u["antithetic"]:
            out.update({f"{t}_dm_M": r["M"], f"{t}_dm_train": r["train"], f"{t}_dm_test": r["test"]})
        else:
            out[f"{t}_plain_M"] = r["M"]
    return out


@experiment(SECTION, keys=["act", "m", "delta", "eta", "T_eh", "ds_eh", "seeds", "N_eh"], units=_eh_units,
            reduce=_eh_reduce, cost=_traj_cost, shrink=_shrink)
def easy_hard(u, device):
    """Random init. Phase retrieval: DMFT with antithetic paths (M ≡ 0) or plain paths (a spurious M of order
    N^{-1/2}), GD overlaps at each d. Staircase y = z₁ + z₂²: DMFT (antithetic in z₂) and GD overlaps with both
    latent directions. One unit is one DMFT or one GD at one d."""
    if u["kind"] == "dmft":
        a = dmft.run_dmft(u["act"], u["link"], u["delta"], u["eta"], u["T"], u["N"], u["m"],
                          antithetic=u["antithetic"], device=device, generator=3000)
        return {k: a[k] for k in ("M", "train", "test")}
    d = u["d"]
    prob = mi.sample_problem(d, int(round(u["delta"] * d)), mi.link(u["link"]).k, u["link"], trials=u["trials"],
                             device=device, dtype=torch.float32, generator=u["data_seed"])
    g = mi.run_gd(prob, u["m"], u["eta"], u["T"], act=u["act"], generator=u["init_seed"])
    return {k: g[k] for k in ("M", "train", "test")}


# --- benchmarks ------------------------------------------------------------------------------------------------------
NOMINAL_BW = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def bandwidth(device: torch.device, mbytes: int = 256) -> float:
    """Measured device memory bandwidth (bytes/s) of a large copy (read + write), best of 5."""
    x = torch.empty(mbytes * 2**20 // 4, device=device, dtype=torch.float32).uniform_()
    y = torch.zeros_like(x)  # touched once, so the timed copies pay no page faults
    best = float("inf")
    for _ in range(5):
        synchronize(device)
        t0 = time.perf_counter()
        y.copy_(x)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * x.numel() * 4 / best


def _floor(nbytes: float, device: torch.device, bw: float) -> dict:
    out = {"bytes": nbytes, "bandwidth_measured_GBs": bw / 1e9, "floor_s_measured_bw": nbytes / bw}
    name = device_name(device)
    for key, nominal in NOMINAL_BW.items():
        if key in name:
            out["bandwidth_nominal_GBs"] = nominal / 1e9
            out["floor_s_nominal_bw"] = nbytes / nominal
    return out


def bench_gd(device="auto", quick=False) -> dict:
    """GD sweep (20 δ × 20 trials × d = 2000 × 1000 steps; ``quick``: 4 δ × 4 trials × d = 400 × 40 steps).
    Floor: every step reads each X twice (XΘ and XᵀF), 2 · T · Σ_δ trials · n · d · 4 bytes at the bandwidth."""
    dev = get_device(device)
    d, deltas, trials, T = (1000, [1.0, 2.0, 3.0, 4.0], 4, 20) if quick else (2000, np.linspace(1, 8, 20).tolist(), 20, 1000)
    ns = [int(round(dl * d)) for dl in deltas]
    prob = mi.sample_problem(d, ns, 1, "pr", trials=trials, device=dev, dtype=torch.float32, generator=0)
    mi.run_gd(prob, 2, 2.0, 2, n_test=1024, generator=1)  # warm-up
    synchronize(dev)
    t0 = time.perf_counter()
    out = mi.run_gd(prob, 2, 2.0, T, n_test=1024, generator=1)
    synchronize(dev)
    wall = time.perf_counter() - t0
    assert torch.isfinite(out["train"]).all()
    nbytes = 2.0 * T * sum(trials * n * d * 4 for n in ns)
    res = {"bench": "gd", "device": device_name(dev), "d": d, "n_deltas": len(ns), "trials": trials, "steps": T,
           "time_s": wall}
    res.update(_floor(nbytes, dev, bandwidth(dev)))
    res["ratio_to_floor"] = wall / res["floor_s_measured_bw"]
    return res


def bench_dmft(device="auto", quick=False) -> dict:
    """DMFT with T = 50, N = 10⁵ paths, m = 2 (``quick``: T = 10, N = 2·10⁴). Floor: the response recursion reads
    χ(·, s) for s < t at every step, Σ_t t · N · m · (T+1)m float64 values, plus writing them."""
    dev = get_device(device)
    T, N, m = (10, 20000, 2) if quick else (50, 100000, 2)
    dmft.run_dmft("gelu", "pr", 3.0, 2.0, 2, N, m, M0=[[0.5, 0.3]], device=dev, generator=0)  # warm-up
    synchronize(dev)
    t0 = time.perf_counter()
    out = dmft.run_dmft("gelu", "pr", 3.0, 2.0, T, N, m, M0=[[0.5, 0.3]], device=dev, generator=0)
    synchronize(dev)
    wall = time.perf_counter() - t0
    assert torch.isfinite(out["train"]).all()
    nbytes = 8.0 * sum(t * N * m * ((T + 1) * m + m) for t in range(1, T + 1))
    res = {"bench": "dmft", "device": device_name(dev), "T": T, "N": N, "m": m, "time_s": wall,
           "M_T": out["M"][-1].flatten().tolist()}
    res.update(_floor(nbytes, dev, bandwidth(dev)))
    res["ratio_to_floor"] = wall / res["floor_s_measured_bw"]
    return res


BENCHMARKS = {"gd": bench_gd, "dmft": bench_dmft}


# --- helpers for the notebook ----------------------------------------------------------------------------------------
def rms_gap(gd: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Root-mean-square distance of single GD runs [seeds, ...] from the DMFT value [...] (averaged over the trailing
    entries), and its standard error by the delta method over seeds."""
    sq = ((gd - ref) ** 2).reshape(gd.shape[0], -1).mean(1)
    r = math.sqrt(sq.mean())
    se = sq.std(ddof=1) / math.sqrt(len(sq)) / (2 * r) if r > 0 else float("nan")
    return r, se


def loglog_slope(x, y, w=None) -> tuple[float, float]:
    """Least-squares slope of log y on log x (weights ``w`` = 1/σ² of log y), with its standard error."""
    X, Y = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    w = np.ones_like(X) if w is None else np.asarray(w, float)
    A = np.stack([np.ones_like(X), X], 1)
    cov = np.linalg.inv(A.T @ (A * w[:, None]))
    beta = cov @ A.T @ (w * Y)
    resid = Y - A @ beta
    dof = max(len(X) - 2, 1)
    s2 = float((w * resid ** 2).sum() / dof) if len(X) > 2 else 1.0
    return float(beta[1]), float(math.sqrt(cov[1, 1] * max(s2, 1.0)))
